"""What CPU this is, by name: part of the key of a choice measured on it (the LM head,
``head_choice``) and of the benchmark's record of the machine."""
from __future__ import annotations

import platform
import re
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else platform.machine()
