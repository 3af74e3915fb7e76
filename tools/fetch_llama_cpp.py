#!/usr/bin/env python3
"""Fetch the pinned llama.cpp tree into ``subprojects/llama.cpp``.

llama.cpp is a dependency, not part of this repository. The exact upstream
commit we build against (0c1e570) ships inside the sdist of
``llama-cpp-python==0.3.36`` under ``vendor/llama.cpp``; PyPI is reachable
where GitHub may not be, so that sdist is the source of truth. The archive is
checked against a pinned sha256 before anything is unpacked.

A user who already has a checkout at that commit (a git submodule, a local
clone) can leave it in ``subprojects/llama.cpp`` or point
``SPECDEC_LLAMA_CPP_DIR`` at it; ``SPECDEC_LLAMA_SDIST`` may name an already
downloaded copy of the sdist.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

SDIST_NAME = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/ec/e9/"
    "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/" + SDIST_NAME
)
SIMPLE_INDEX = "https://pypi.org/simple/llama-cpp-python/"
VENDOR_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
PIN = "0c1e570"
MARKER = ".specdec-pin"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _cache_dir() -> Path:
    """The sdist's place in the specdec cache dir (the rule lives in specdec/cache.py,
    loaded by path: this script runs before specdec is built)."""
    spec = importlib.util.spec_from_file_location(
        "_specdec_cache", Path(__file__).resolve().parent.parent / "specdec" / "cache.py")
    mod = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mod)
    return mod.cache_dir() / "sdist"


def _download(dst: Path) -> None:
    urls = [SDIST_URL]
    try:  # the simple API also works behind registry mirrors that lack the JSON API
        req = urllib.request.Request(
            SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            for f in json.load(r).get("files", []):
                if f.get("filename") == SDIST_NAME and f["url"] not in urls:
                    urls.append(f["url"])
    except Exception as e:  # noqa: BLE001 - the pinned URL may still work
        print(f"fetch_llama_cpp: index lookup failed ({e})", file=sys.stderr)
    errors = []
    for url in urls:
        try:
            tmp = dst.with_suffix(".part")
            with urllib.request.urlopen(url, timeout=300) as r, open(tmp, "wb") as f:
                shutil.copyfileobj(r, f)
            tmp.replace(dst)
            return
        except Exception as e:  # noqa: BLE001
            errors.append(f"{url}: {e}")
    # last resort: pip, which honours the user's index configuration
    with tempfile.TemporaryDirectory() as td:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "-d", td, "llama-cpp-python==0.3.36"]
        subprocess.run(cmd, check=False, capture_output=True)
        got = Path(td) / SDIST_NAME
        if got.exists():
            shutil.move(str(got), dst)
            return
    raise SystemExit("fetch_llama_cpp: could not download %s:\n  %s" % (SDIST_NAME, "\n  ".join(errors)))


def _sdist() -> Path:
    env = os.environ.get("SPECDEC_LLAMA_SDIST")
    path = Path(env) if env else _cache_dir() / SDIST_NAME
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"fetch_llama_cpp: downloading {SDIST_NAME}", file=sys.stderr)
        _download(path)
    digest = _sha256(path)
    if digest != SDIST_SHA256:
        if not env:
            path.unlink()
        raise SystemExit(
            f"fetch_llama_cpp: sha256 mismatch for {path}: {digest} != {SDIST_SHA256}"
        )
    return path


def _unpack(archive: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            if not m.name.startswith(VENDOR_PREFIX):
                continue
            rel = m.name[len(VENDOR_PREFIX):]
            if not rel or rel == ".git" or ".." in Path(rel).parts:
                continue
            m.name = rel
            tar.extract(m, tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extract(m, tmp)
    (tmp / MARKER).write_text(f"{PIN} {SDIST_NAME} sha256={SDIST_SHA256}\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def ensure(dest: Path) -> Path:
    override = os.environ.get("SPECDEC_LLAMA_CPP_DIR")
    if override:
        src = Path(override).resolve()
        if not (src / "include" / "llama.h").exists():
            raise SystemExit(f"fetch_llama_cpp: {src} is not a llama.cpp tree")
        if dest.is_symlink() or not dest.exists():
            if dest.is_symlink():
                dest.unlink()
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(src, target_is_directory=True)
        return dest
    if (dest / "include" / "llama.h").exists():
        if not (dest / MARKER).exists():
            print(f"fetch_llama_cpp: using the existing tree in {dest} (no pin marker; "
                  f"it must be llama.cpp {PIN})", file=sys.stderr)
        return dest
    _unpack(_sdist(), dest)
    return dest


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "subprojects" / "llama.cpp"
    print(ensure(target))
