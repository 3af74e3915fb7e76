"""``specdec bench --gpu``: whether this build and machine have a device to put every layer on.

A GPU run without a GPU would measure the CPU under a GPU label, so it is refused (the CLI
exits 2, "could not judge") with the reason: no GPU backend compiled in, or one compiled in
and no device of it found.
"""
from __future__ import annotations

from typing import List, Optional

#: ggml backends that are not a device to offload to
NOT_DEVICES = ("CPU", "RPC", "BLAS")


def ngl(n_gpu_layers: int) -> str:
    """llama.cpp's ``-ngl`` for specdec's ``n_gpu_layers`` (-1, every layer: 99)."""
    return "99" if n_gpu_layers < 0 else str(n_gpu_layers)


def placement_flags(n_gpu_layers: int) -> List[str]:
    """llama.cpp's tools' flags placing the layers as specdec's ``n_gpu_layers`` does: every
    layer on the device for -1, none for 0 (a GPU-built tool would offload by default)."""
    from .llama_tools import cpu_only_flags
    return ["-ngl", ngl(n_gpu_layers)] if n_gpu_layers else list(cpu_only_flags())


def device_names() -> List[str]:
    """The GPUs (discrete, else integrated) found at run time, by description."""
    from .._core import devices

    devs = [d for d in devices() if d["backend"] not in NOT_DEVICES]
    gpus = [d for d in devs if d["type"] == "gpu"] or [d for d in devs if d["type"] == "igpu"]
    return [d["description"] or d["name"] for d in gpus]


def why_no_device() -> Optional[str]:
    """Why ``--gpu`` cannot run here, or None when a GPU was found."""
    from .._core import backends

    if device_names():
        return None
    compiled = [b for b in backends() if b not in NOT_DEVICES]
    if compiled:
        return (f"this build has {', '.join(compiled)}, but no such device was found at run "
                "time")
    return ("this build has no GPU backend (build specdec with -Dcuda=true, -Dvulkan=true or "
            "-Dmetal=enabled)")
