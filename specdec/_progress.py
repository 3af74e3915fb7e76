"""Progress bars for the long steps (model assembly, derivations, builds, benchmarks).

tqdm draws them on stderr when it is a terminal and stays silent otherwise;
``set_quiet(True)`` (the CLI's ``--quiet``) or ``$SPECDEC_QUIET=1`` silences them everywhere.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import IO, Any, Sequence

from tqdm import tqdm

_quiet = False


def set_quiet(quiet: bool) -> None:
    global _quiet
    _quiet = bool(quiet)


def quiet() -> bool:
    return _quiet or os.environ.get("SPECDEC_QUIET", "") not in ("", "0")


def shown() -> bool:
    """Whether bars draw now: not quiet and stderr is a terminal."""
    return not quiet() and sys.stderr.isatty()


def progress(**kwargs: Any) -> "tqdm[Any]":
    """A tqdm bar: ``disable=None`` makes it draw only on a terminal."""
    if kwargs.get("unit") == "B":
        kwargs.setdefault("unit_scale", True)
        kwargs.setdefault("unit_divisor", 1024)
    kwargs.setdefault("leave", False)
    return tqdm(disable=True if quiet() else None, **kwargs)


_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")


def run_logged(cmd: Sequence[str], log: IO[str], desc: str, **kwargs: Any) -> int:
    """Run a build step with its output appended to ``log``; in a terminal a bar follows
    ninja's ``[n/m]`` lines (or counts output lines). Returns the exit status."""
    with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", **kwargs) as proc, \
            progress(desc=desc, unit="step") as bar:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            m = _NINJA.match(line)
            if m:
                bar.total = int(m.group(2))
                bar.n = int(m.group(1))
                bar.refresh()
            elif bar.total is None:
                bar.update(1)
        log.flush()
        return proc.wait()
