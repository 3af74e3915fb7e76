"""Facts the build and the runtime share, each written once: the llama.cpp pin, the sdist it
comes from (name, URL, sha256), the CPU flags every llama.cpp build here uses, and the rule
for the cache directory; plus the two steps that read them (fetch the sdist, unpack its
llama.cpp).

Readers: ``meson.build`` (the CPU flags, through ``python _build_facts.py cpu-flags``),
``tools/fetch_llama_cpp.py`` (loads this file by path at configure time, before specdec
is built), :mod:`specdec.cache` (the cache dir, for the runtime and the drafters), and the
benchmark's peer builds (``specdec.benchmark.llama_tools``, ``lcp_build``). So this module
imports the standard library only, never the rest of specdec.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import IO, Optional

#: the llama.cpp commit specdec builds against (vendored in the sdist below)
LLAMA_CPP_PIN = "0c1e570"
#: llama-cpp-python's sdist carries that commit under ``vendor/llama.cpp``; PyPI is reachable
#: where GitHub may not be, so it is the source of truth (and a peer in the benchmark)
LCP_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LCP_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_URL = ("https://files.pythonhosted.org/packages/ec/e9/"
             "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/" + SDIST_NAME)
SIMPLE_INDEX = "https://pypi.org/simple/llama-cpp-python/"
VENDOR_PREFIX = f"llama_cpp_python-{LCP_VERSION}/vendor/llama.cpp/"
#: written into an unpacked tree: which pin and archive it came from
PIN_MARKER = ".specdec-pin"

#: x86 VMs here report AMX but raise SIGILL on the first tile instruction (batched matmuls).
#: GCC gives explicit -mno-* precedence over -march=native whatever their order, so adding
#: these to a build's global flags masks AMX even where ggml appends -march=native itself.
AMX_OFF = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")
#: ggml's own AMX switches, for CMake builds that take ggml's options (the peers' builds)
GGML_AMX_OFF = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")


def cache_dir() -> Path:
    """``$SPECDEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdec``, else ``~/.cache/specdec``."""
    env = os.environ.get("SPECDEC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "specdec"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(dst: Path, log: IO[str]) -> None:
    """The pinned URL, then any URL the simple index lists, then ``pip download`` (which
    honours the user's index configuration)."""
    urls = [SDIST_URL]
    try:  # the simple API also works behind registry mirrors that lack the JSON API
        req = urllib.request.Request(
            SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            for f in json.load(r).get("files", []):
                if f.get("filename") == SDIST_NAME and f["url"] not in urls:
                    urls.append(f["url"])
    except Exception as e:  # noqa: BLE001 - the pinned URL may still work
        print(f"index lookup failed ({e})", file=log)
    errors = []
    tmp = dst.with_name(dst.name + ".part")
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=300) as r, open(tmp, "wb") as f:
                shutil.copyfileobj(r, f)
            tmp.replace(dst)
            return
        except Exception as e:  # noqa: BLE001
            errors.append(f"{url}: {e}")
    with tempfile.TemporaryDirectory() as td:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "-d", td, f"llama-cpp-python=={LCP_VERSION}"]
        subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT)
        got = Path(td) / SDIST_NAME
        if got.exists():
            shutil.move(str(got), dst)
            return
    raise RuntimeError("could not download %s:\n  %s" % (SDIST_NAME, "\n  ".join(errors)))


def fetch_sdist(log: Optional[IO[str]] = None) -> Path:
    """The sdist, checked against :data:`SDIST_SHA256`: ``$SPECDEC_LLAMA_SDIST`` if set, else
    ``<cache dir>/sdist/``, downloaded there once. A cached copy with another hash is
    deleted (a user's own file is left alone) and the call raises."""
    log = log if log is not None else sys.stderr
    env = os.environ.get("SPECDEC_LLAMA_SDIST")
    path = Path(env) if env else cache_dir() / "sdist" / SDIST_NAME
    if not path.exists():
        if env:
            raise RuntimeError(f"$SPECDEC_LLAMA_SDIST names {path}, which does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"downloading {SDIST_NAME}", file=log)
        _download(path, log)
    digest = sha256_file(path)
    if digest != SDIST_SHA256:
        if not env:
            path.unlink()
        raise RuntimeError(f"sha256 mismatch for {path}: {digest} != {SDIST_SHA256}")
    return path


def unpack_llama_cpp(archive: Path, dest: Path) -> Path:
    """Unpack the sdist's ``vendor/llama.cpp`` into ``dest`` (atomically: a temporary
    sibling renamed into place) and mark it with the pin."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            rel = m.name[len(VENDOR_PREFIX):] if m.name.startswith(VENDOR_PREFIX) else ""
            if not rel or rel == ".git" or ".." in Path(rel).parts:
                continue
            m.name = rel
            if hasattr(tarfile, "data_filter"):
                tar.extract(m, tmp, filter="data")
            else:  # Python < 3.10.12 has no extraction filters
                tar.extract(m, tmp)
    (tmp / PIN_MARKER).write_text(f"{LLAMA_CPP_PIN} {SDIST_NAME} sha256={SDIST_SHA256}\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


if __name__ == "__main__":
    # meson reads the flags here: `python specdec/_build_facts.py cpu-flags`
    if sys.argv[1:] == ["cpu-flags"]:
        print(" ".join(AMX_OFF))
    elif sys.argv[1:] == ["pin"]:
        print(LLAMA_CPP_PIN)
    else:
        raise SystemExit("usage: _build_facts.py cpu-flags | pin")
