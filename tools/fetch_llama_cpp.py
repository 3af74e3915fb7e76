#!/usr/bin/env python3
"""Fetch the pinned llama.cpp tree into ``subprojects/llama.cpp`` (meson runs this at
configure time).

llama.cpp is a dependency, not part of this repository. The pin, the sdist that carries it
and the sdist's sha256 live in ``specdec/_build_facts.py``, loaded here by path (specdec is
not built yet); the archive is checked before anything is unpacked.

A user who already has a checkout at that commit (a git submodule, a local clone) can leave
it in ``subprojects/llama.cpp`` or point ``SPECDEC_LLAMA_CPP_DIR`` at it;
``SPECDEC_LLAMA_SDIST`` may name an already downloaded copy of the sdist.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _facts():
    spec = importlib.util.spec_from_file_location("_specdec_build_facts",
                                                  ROOT / "specdec" / "_build_facts.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclass/typing lookups resolve through sys.modules
    spec.loader.exec_module(mod)
    return mod


facts = _facts()


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
        if not (dest / facts.PIN_MARKER).exists():
            print(f"fetch_llama_cpp: using the existing tree in {dest} (no pin marker; "
                  f"it must be llama.cpp {facts.LLAMA_CPP_PIN})", file=sys.stderr)
        return dest
    try:
        return facts.unpack_llama_cpp(facts.fetch_sdist(), dest)
    except RuntimeError as e:
        raise SystemExit(f"fetch_llama_cpp: {e}") from None


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "subprojects" / "llama.cpp"
    print(ensure(target))
