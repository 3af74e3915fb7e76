"""Untrusted model files, tried in a child process before this process loads them.

In this process a bad file raises a Python exception wherever llama.cpp can unwind
(``_abort.h``) and the pre-checks (``_gguf_check``) stop what would assert inside ggml's
compute threads. What neither foresees still ends the process. ``check_model`` loads the
file and generates a few tokens in a child process first: a child that dies becomes
:class:`GGUFError` carrying the child's last llama.cpp message, so a long-lived service can
try a file it has never seen without risking itself.

A verdict, good or bad, is cached by the file's content hash (and the specdec version) in
``cache_dir()/probe``, so each file is probed once. Timeouts are not cached.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from ._gguf_check import check_path
from ._gguf_layout import GGUFError
from .cache import cache_dir

#: the probe's steps; bump when they change, so old verdicts are not reused
PROBE_VERSION = 1
#: Model(check=...) values: "fast" (pre-checks, aborts turned into exceptions, in process)
#: or "isolated" (check_model first)
CHECK_MODES = ("fast", "isolated")

_digests: Dict[Tuple[str, int, int], str] = {}
#: how the child is started (the model path is appended)
_CHILD_CMD = [sys.executable, "-m", "specdec.probe"]


def file_digest(path: Union[str, "os.PathLike[str]"]) -> str:
    """The sha256 of the file's content (remembered per path, size and mtime in this process)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        with open(path, "rb") as f:
            _digests[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _digests[key]


def _verdict_path(digest: str) -> Path:
    from . import __version__
    return cache_dir() / "probe" / f"{digest}-{__version__}-v{PROBE_VERSION}.json"


def check_model(path: Union[str, "os.PathLike[str]"], *, timeout: float = 300.0,
                cache: bool = True) -> str:
    """Load ``path`` and generate a few tokens in a child process; returns the architecture.

    Raises :class:`GGUFError` when the child raised (the file is rejected, as in process)
    or died (its signal and llama.cpp's last message), or did not finish in ``timeout``
    seconds. ``cache=False`` probes again even if a verdict is cached.
    """
    path = check_path(path)
    vpath = _verdict_path(file_digest(path))
    if cache and vpath.exists():
        try:
            v = json.loads(vpath.read_text())
        except (OSError, ValueError):
            v = None
        if isinstance(v, dict) and "ok" in v:
            if v["ok"]:
                return str(v.get("arch", ""))
            raise GGUFError(f"{path}: {v.get('error', 'rejected by an earlier probe')}")
    ok, arch_or_error, final = _run_child(path, timeout)
    if final:
        vpath.parent.mkdir(parents=True, exist_ok=True)
        tmp = vpath.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"ok": ok, "arch" if ok else "error": arch_or_error}))
        os.replace(tmp, vpath)
    if not ok:
        raise GGUFError(f"{path}: {arch_or_error}")
    return arch_or_error


def _run_child(path: str, timeout: float) -> Tuple[bool, str, bool]:
    """(ok, arch or why, whether the verdict is final enough to cache)."""
    cmd = [*_CHILD_CMD, os.path.abspath(path)]
    # run in a neutral directory: ``-m`` puts the cwd first on sys.path, and a source checkout
    # there would shadow the installed package
    with tempfile.TemporaryDirectory(prefix="specdec-probe-") as cwd:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                               timeout=timeout, cwd=cwd,
                               env=dict(os.environ, GGML_NO_BACKTRACE="1"))
        except subprocess.TimeoutExpired:
            return False, f"the probe did not finish in {timeout:.0f} s", False
    for line in reversed(p.stdout.splitlines()):
        tag, _, rest = line.partition(" ")
        if tag == "OK" and p.returncode == 0:
            return True, rest, True
        if tag == "ERR":
            return False, f"rejected in the probe: {rest}", True
    return False, _death(p.returncode, p.stderr), True


def _death(rc: int, stderr: str) -> str:
    if rc < 0:
        try:
            how = f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            how = f"killed by signal {-rc}"
    else:
        how = f"exited with status {rc}"
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    marked = [ln for ln in lines if "GGML_ASSERT" in ln or "GGML_ABORT" in ln or "error" in ln.lower()]
    last = (marked or lines or ["(no message)"])[-1]
    return f"llama.cpp {how} the probe process; its last message: {last[:500]}"


def _child(path: str) -> int:
    """Load, tokenize and generate as a Decoder does (MTP too where the file has a head)."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    llama_log = logging.getLogger("specdec.llama")
    llama_log.addHandler(handler)
    llama_log.setLevel(logging.WARNING)
    from . import Decoder, Model

    try:
        m = Model(path)
        m.tokenize("Hello, world!", add_special=True, parse_special=True)
        drafters = ["ngram"] + (["mtp"] if m.has_mtp_graph else [])
        for drafter in drafters:
            dec = Decoder(path, drafter=drafter, n_ctx=128, n_batch=32)
            dec.generate("Hello", max_tokens=4)
            dec.generate([t % m.n_vocab for t in range(1, 20)], max_tokens=4)
    except Exception as e:   # a rejection in process is a verdict too
        msg = str(e).replace("\n", " ")[:1000]
        print(f"ERR {type(e).__name__}: {msg}", flush=True)
        return 0
    print(f"OK {m.arch}", flush=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m specdec.probe MODEL.gguf", file=sys.stderr)
        return 2
    return _child(args[0])


if __name__ == "__main__":
    sys.exit(main())
