"""Progress bars for the long steps (model assembly, derivations, builds, benchmarks).

tqdm draws them on stderr when it is a terminal and stays silent otherwise;
``set_quiet(True)`` (the CLI's ``--quiet``) or ``$SPECDEC_QUIET=1`` silences them everywhere.
"""
from __future__ import annotations

import os
import sys
from typing import Any

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
