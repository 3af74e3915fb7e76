"""What machine and which build a benchmark ran on, so results and baselines say so."""
from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any, Dict, Optional

from .. import _build_facts as facts
from .._cpu import cpu_model


def _slug(text: str) -> str:
    text = re.sub(r"\(r\)|\(tm\)|cpu|@.*$", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def machine_class(threads: int = 2, device: Optional[str] = None) -> str:
    """A file-name-safe class for baselines: CPU model and core count, e.g.
    ``intel-xeon-processor-2c``, and the device the layers ran on, if not the CPU (``--gpu``:
    ``...-16c-nvidia-h100-80gb-hbm3``). Ratios only compare within one class."""
    base = f"{_slug(cpu_model())}-{os.cpu_count() or 1}c"
    return f"{base}-{_slug(device)}" if device else base


def git_commit() -> Optional[str]:
    """The commit of the source tree specdec was imported from, ``+dirty`` if modified;
    None for an installed package outside a checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


#: environment variables that change how llama.cpp's threads wait, and with it every timing
TIMING_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "OMP_PROC_BIND",
              "OMP_PLACES", "KMP_BLOCKTIME")


def timing_env() -> Dict[str, str]:
    """The :data:`TIMING_ENV` variables that are set."""
    return {k: os.environ[k] for k in TIMING_ENV if k in os.environ}


def timing_warning() -> Optional[str]:
    """Why this environment's timings are not the machine's, or None.

    With ``OMP_WAIT_POLICY=PASSIVE`` llama.cpp's OpenMP threads sleep at each of a decode's
    few hundred barriers, and each wake-up costs tens of microseconds: gemma3-270m decodes
    at half its speed, and the fixed cost of a decode, which speculation saves, is inflated.
    Both sides of a comparison inherit it, so ratios stay side by side, but they are not
    those of the machine as it is normally run."""
    if os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE":
        return ("OMP_WAIT_POLICY=PASSIVE is set: llama.cpp's threads sleep between graph "
                "nodes, decodes run about half as fast and their fixed cost is inflated; "
                "unset it for numbers that describe this machine")
    return None


def describe(threads: int, device: Optional[str] = None) -> Dict[str, Any]:
    """The machine record of results and baselines; ``device``: what the layers ran on when
    not this CPU (it joins the machine class)."""
    from .. import __version__
    from .._core import system_info

    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "threads": threads,
        "class": machine_class(device=device),
        "device": device,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "specdec": __version__,
        "commit": git_commit(),
        "llama_cpp_pin": facts.LLAMA_CPP_PIN,
        "ggml": system_info(),
        "load_avg_start": round(os.getloadavg()[0], 2),
        "timing_env": timing_env(),
    }
