"""Build llama.cpp's reference tools (``llama-simple``, ``llama-bench``,
``llama-speculative-simple``) from the pinned tree, with specdec's CPU flags, into the cache.

The binaries are linked statically (``BUILD_SHARED_LIBS=OFF``), so a cached binary keeps
working whatever happens to the build tree or to other libllama copies on the machine. A
stamp records the pin and a hash of the flags; a new pin or new flags build afresh.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from ... import _build_facts as facts
from ..._progress import run_logged

# In a source checkout (editable install) the tools build from the tree specdec itself
# builds, fetched by tools/fetch_llama_cpp.py. An installed package has neither: it
# unpacks llama.cpp from the pinned llama-cpp-python sdist into the cache instead.
REPO_ROOT = Path(__file__).resolve().parents[3]
SRC_DIR = REPO_ROOT / "subprojects" / "llama.cpp"
FETCH_SCRIPT = REPO_ROOT / "tools" / "fetch_llama_cpp.py"
DEFAULT_TOOLS = ("llama-simple", "llama-bench", "llama-speculative-simple")

# AMX masked as in specdec's own build (see _build_facts.AMX_OFF)
AMX_OFF = " ".join(facts.AMX_OFF)

CMAKE_DEFINES: dict[str, str] = {
    "CMAKE_BUILD_TYPE": "Release",
    "BUILD_SHARED_LIBS": "OFF",  # self-contained binaries
    "GGML_NATIVE": "ON",
    "CMAKE_C_FLAGS": AMX_OFF,
    "CMAKE_CXX_FLAGS": AMX_OFF,
    # offline: no HTTPS, no web-UI download, no npm (nothing else downloads on Linux CPU)
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_USE_PREBUILT_UI": "OFF",
    "LLAMA_BUILD_UI": "OFF",
    # only what the three tools need
    "LLAMA_BUILD_COMMON": "ON",
    "LLAMA_BUILD_TOOLS": "ON",  # llama-bench
    "LLAMA_BUILD_EXAMPLES": "ON",  # llama-simple, llama-speculative-simple
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_SERVER": "OFF",
    "LLAMA_BUILD_APP": "OFF",
    "GGML_CCACHE": "OFF",  # we set the launcher ourselves, see _configure_args
    "GGML_RPC": "ON",  # the RPC cases: the tools' --rpc, as specdec's default build has it
}

#: the backend options of specdec's build that its peers must share (``backend_defines``):
#: the GPU backends' switches and options, CUDA's architectures and flags, and the CUDA
#: libraries the build found in NVIDIA's wheels (``CUDA_<lib>_LIBRARY``)
BACKEND_PREFIXES = ("GGML_CUDA", "GGML_VULKAN", "GGML_METAL", "CMAKE_CUDA", "CUDA_")
GPU_BACKENDS = ("GGML_CUDA", "GGML_VULKAN", "GGML_METAL")


def backend_defines() -> dict[str, str]:
    """The GPU backend of specdec's own build, as CMake defines for the peers: a CUDA build of
    specdec is compared with CUDA builds of llama.cpp's tools (the same architectures). Read
    from ``specdec/_build_options.py``, which meson writes at configure time; empty for a
    CPU build (whose peers then keep their flags, hash and cache dir)."""
    try:
        from ..._build_options import CMAKE_DEFINES as built
    except ImportError:        # a build from before the record: treated as CPU
        return {}
    if not any(built.get(k) == "ON" for k in GPU_BACKENDS):
        return {}
    return {k: v for k, v in built.items() if k.startswith(BACKEND_PREFIXES)}


def defines() -> dict[str, str]:
    """Every CMake define of the peers' build: ``CMAKE_DEFINES`` and specdec's backend."""
    return {**CMAKE_DEFINES, **backend_defines()}


def cpu_only_flags() -> tuple[str, ...]:
    """The tools' flags that keep every layer on the CPU: peers built with a GPU backend
    offload by default (``-ngl``'s default), specdec does not."""
    return ("-ngl", "0") if backend_defines() else ()


#: tools whose targets exist only with a CMake option the configuration above leaves off;
#: the option adds targets and changes no binary, so it stays out of the flags hash
TARGET_OPTIONS: dict[str, str] = {"llama-server": "LLAMA_BUILD_SERVER"}

STAMP = "stamp.json"


def _flags_hash() -> str:
    """Hash of everything that changes the produced binaries (flags and chosen compilers)."""
    key = {"defines": defines(), "CC": os.environ.get("CC", ""), "CXX": os.environ.get("CXX", "")}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def tools_dir() -> Path:
    """Cache dir for the reference tools.

    ``$SPECDEC_LLAMA_TOOLS_DIR`` if set, else
    ``<specdec cache dir>/llama-tools/<pin>-<flags hash>``, so a
    new pin or new flags get a fresh build instead of silently reusing old binaries.
    """
    override = os.environ.get("SPECDEC_LLAMA_TOOLS_DIR")
    if override:
        return Path(override).expanduser().resolve()
    return facts.cache_dir() / "llama-tools" / f"{facts.LLAMA_CPP_PIN}-{_flags_hash()}"


def _source_dir() -> Path:
    """The pinned llama.cpp tree: the checkout's (fetched and sha256-verified by
    tools/fetch_llama_cpp.py if absent), ``$SPECDEC_LLAMA_CPP_DIR``, or, for an
    installed package, the sdist's ``vendor/llama.cpp`` unpacked into the cache."""
    override = os.environ.get("SPECDEC_LLAMA_CPP_DIR")
    if override:
        return Path(override).expanduser().resolve()
    if FETCH_SCRIPT.exists():
        if not (SRC_DIR / "CMakeLists.txt").exists():
            subprocess.run([sys.executable, str(FETCH_SCRIPT), str(SRC_DIR)], check=True)
        return SRC_DIR.resolve()
    return _vendored_llama_cpp()


def _vendored_llama_cpp() -> Path:
    """The sdist's ``vendor/llama.cpp``, unpacked once into the cache (installed packages)."""
    dest = facts.cache_dir() / "llama-src" / facts.LLAMA_CPP_PIN
    if (dest / "CMakeLists.txt").exists():
        return dest
    with locked(dest.parent):
        if not (dest / "CMakeLists.txt").exists():
            with open(os.devnull, "w") as log:
                facts.unpack_llama_cpp(facts.fetch_sdist(log), dest)
    return dest


def _same_pin_elsewhere(tree: Path) -> bool:
    """Whether a build configured from ``tree`` serves a caller whose tree is another copy of
    the pin: every checkout, worktree and installed package fetches the same pinned sources,
    and the tools dir is keyed by pin and flags, so they share one build instead of wiping it
    in turn. A tree named by ``$SPECDEC_LLAMA_CPP_DIR`` is the caller's choice: never swapped."""
    return "SPECDEC_LLAMA_CPP_DIR" not in os.environ and (tree / "CMakeLists.txt").exists()


def _read_stamp(root: Path) -> dict[str, Any]:
    try:
        return json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return {}


def _write_stamp(root: Path, stamp: dict[str, Any]) -> None:
    tmp = root / (STAMP + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, root / STAMP)  # atomic: a concurrent reader sees old or new, never half


def _stamp_current(stamp: dict[str, Any]) -> bool:
    """Whether a stamp was written for this pin and these flags (the dir may be overridden)."""
    return stamp.get("pin") == facts.LLAMA_CPP_PIN and stamp.get("flags") == _flags_hash()


def _built(root: Path, names: Sequence[str]) -> dict[str, Path] | None:
    """Paths of ``names`` if the stamp says they were built with the current pin and flags."""
    stamp = _read_stamp(root)
    if not _stamp_current(stamp):
        return None
    tools = stamp.get("tools", {})
    out = {}
    for name in names:
        if name not in tools:
            return None
        path = root / tools[name]
        if not os.access(path, os.X_OK):
            return None
        out[name] = path
    return out


def built(names: Sequence[str]) -> bool:
    """Whether ``names`` are built, for the current pin and flags, in the cache."""
    return _built(tools_dir(), tuple(names)) is not None


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Exclusive lock on the cache dir, so concurrent builds do not run ninja on one tree."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _configure_args(src: Path, build: Path, options: Sequence[str] = ()) -> list[str]:
    args = ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja"]
    args += [f"-D{k}={v}" for k, v in defines().items()]
    args += [f"-D{o}=ON" for o in options]
    if shutil.which("ccache"):  # speeds rebuilds; does not change the binaries, so not hashed
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    return args


def _cached_source(build: Path) -> str | None:
    try:
        text = (build / "CMakeCache.txt").read_text()
    except OSError:
        return None
    m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", text, re.M)
    return m.group(1) if m else None


def _run_logged(cmd: list[str], out: IO[str] | None, desc: str = "building llama.cpp's tools"
                ) -> None:
    """Run a build step; its output goes to ``out`` (a log file, with a progress bar in a
    terminal) or to our stderr."""
    if out is not None:
        rc = run_logged(cmd, out, desc)
    else:
        # fd 2 rather than sys.stderr: the latter may be a Python object with no fileno (pytest)
        rc = subprocess.run(cmd, stdout=2, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        where = f" (see {out.name})" if out is not None else ""
        raise RuntimeError(f"build step failed with rc={rc}{where}: {' '.join(cmd)}")


def ensure_tools(
    names: Sequence[str] = DEFAULT_TOOLS,
    *,
    jobs: int | None = None,
    log: str | os.PathLike[str] | None = None,
) -> dict[str, Path]:
    """Build the requested llama.cpp tools (once) and return ``{name: binary path}``.

    Returns at once, without locking, when a stamp shows the binaries were built
    with the current pin and flags. Otherwise it takes a file lock on the cache
    dir (concurrent callers wait, then find the stamp), configures with CMake +
    Ninja if needed and builds only the requested targets. No step downloads
    anything; only a missing source tree is fetched, by tools/fetch_llama_cpp.py.

    ``log``: file to append cmake/ninja output to; by default it goes to stderr.
    """
    names = tuple(names)
    root = tools_dir()
    done = _built(root, names)
    if done is not None:
        return done
    with locked(root):
        done = _built(root, names)  # another process may have built them while we waited
        if done is not None:
            return done
        src = _source_dir()
        build = root / "build"
        stamp = _read_stamp(root)
        if not _stamp_current(stamp):
            stamp = {}  # reconfigure; ninja then rebuilds whatever the new flags or tree touch
        cached = _cached_source(build)
        if cached is not None and Path(cached).resolve() != src:
            if _same_pin_elsewhere(Path(cached)):
                src = Path(cached).resolve()   # keep the build: its tree is the pinned one too
            else:
                shutil.rmtree(build)  # configured for a tree that is gone or was chosen by hand
                stamp = {}
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(open(log, "a")) if log is not None else None
            t0 = time.monotonic()
            options = sorted(set(stamp.get("options", []))
                             | {TARGET_OPTIONS[n] for n in names if n in TARGET_OPTIONS})
            if (not stamp.get("configured") or not (build / "build.ninja").exists()
                    or options != stamp.get("options", [])):
                _run_logged(_configure_args(src, build, options), out,
                            "configuring llama.cpp's tools")
                stamp = {"pin": facts.LLAMA_CPP_PIN, "flags": _flags_hash(), "src": str(src),
                         "configured": True, "options": options,
                         "tools": stamp.get("tools", {}) if stamp.get("configured") else {}}
                _write_stamp(root, stamp)
            _run_logged(["cmake", "--build", str(build), "-j", str(jobs or os.cpu_count() or 1),
                         "--target", *names], out)
            for name in names:
                binary = build / "bin" / name
                if not os.access(binary, os.X_OK):
                    raise RuntimeError(f"{name}: build finished but {binary} is missing")
                stamp["tools"][name] = str(binary.relative_to(root))
            stamp.setdefault("build_seconds", {})[",".join(names)] = round(time.monotonic() - t0, 1)
            _write_stamp(root, stamp)
    done = _built(root, names)
    assert done is not None
    return done


def tool(name: str) -> Path:
    """The path of one tool, built first if needed."""
    return ensure_tools((name,))[name]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specdec.benchmark.llama_tools",
                                 description="Build llama.cpp's reference tools from the pinned tree.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the tools (once) and print their paths")
    b.add_argument("names", nargs="*", default=list(DEFAULT_TOOLS))
    b.add_argument("-j", "--jobs", type=int, default=None)
    b.add_argument("--log", default=None, help="append build output to this file")
    sub.add_parser("dir", help="print the cache directory")
    args = ap.parse_args(argv)
    if args.cmd == "dir":
        print(tools_dir())
        return 0
    for name, path in ensure_tools(args.names, jobs=args.jobs, log=args.log).items():
        print(f"{name}\t{path}")
    return 0
