"""Build llama-cpp-python (the sdist pinned in ``_build_facts``) into a private venv, for the
peer benchmark.

llama-cpp-python bundles the same llama.cpp commit specdec links; built from source
with specdec's CPU flags (native, AMX masked out: these VMs report AMX but fault on
it) it is a fair peer. It lives in its own venv under the cache dir and only ever
runs in a subprocess, so its libllama never meets specdec's in one process. Nothing
here is part of the specdec package build.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import _build_facts as facts
from .._progress import run_logged
from .llama_tools.build import locked

VERSION = facts.LCP_VERSION
CMAKE_ARGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    *facts.GGML_AMX_OFF,
    f"-DCMAKE_C_FLAGS={' '.join(facts.AMX_OFF)}", f"-DCMAKE_CXX_FLAGS={' '.join(facts.AMX_OFF)}",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
]


def peer_dir() -> Path:
    """``$SPECDEC_PEERS_DIR/llama-cpp-python-<version>`` or the same under ``~/.cache/specdec/peers``."""
    root = os.environ.get("SPECDEC_PEERS_DIR")
    base = Path(root).expanduser() if root else facts.cache_dir() / "peers"
    flags = hashlib.sha256(json.dumps(CMAKE_ARGS).encode()).hexdigest()[:8]
    return base / f"llama-cpp-python-{VERSION}-{flags}"


def python() -> Path:
    return peer_dir() / "venv" / "bin" / "python"


def built() -> bool:
    try:
        stamp = json.loads((peer_dir() / "stamp.json").read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("version") == VERSION and python().exists()


def ensure(log_path: str | os.PathLike[str] | None = None) -> Path:
    """Build (once) and return the venv's python. Raises if the build fails; the log says why."""
    if built():
        return python()
    root = peer_dir()
    with locked(root):
        if built():
            return python()
        log_file = Path(log_path) if log_path else root / "build.log"
        with open(log_file, "a") as log:
            t0 = time.monotonic()
            sdist = facts.fetch_sdist(log)
            venv = root / "venv"
            if not (venv / "bin" / "python").exists():
                # system site-packages: numpy/jinja2 come from the host, only missing deps download
                subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                               check=True, stdout=log, stderr=subprocess.STDOUT)
            env = dict(os.environ, CMAKE_ARGS=shlex.join(CMAKE_ARGS),
                       CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1))
            env.pop("PYTHONPATH", None)
            with tempfile.TemporaryDirectory() as tmp:
                # -v: the build's ninja lines reach the log (and the progress bar)
                rc = run_logged([str(venv / "bin" / "python"), "-m", "pip", "install", "-v",
                                 "--no-cache-dir", str(sdist)], log, "building llama-cpp-python",
                                env=dict(env, TMPDIR=tmp))
            if rc != 0:
                raise RuntimeError(f"llama-cpp-python {VERSION} build failed (see {log_file})")
            (root / "stamp.json").write_text(json.dumps(
                {"version": VERSION, "cmake_args": CMAKE_ARGS,
                 "build_seconds": round(time.monotonic() - t0, 1)}, indent=2) + "\n")
    return python()


if __name__ == "__main__":
    print(ensure())
