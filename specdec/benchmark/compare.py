"""The regression gate: this run's tracked ratios against a baseline's.

Only ratios are compared (specdec over its own plain decoding, specdec over
llama.cpp for the same method), never absolute times: both sides of a ratio were
measured side by side, so machine drift cancels out. A ratio fails when it falls
more than ``margin`` (a fraction) below the baseline's value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

DEFAULT_MARGIN = 0.15


@dataclass
class Check:
    name: str
    baseline: float
    current: Optional[float]
    margin: float

    @property
    def floor(self) -> float:
        return self.baseline * (1.0 - self.margin)

    @property
    def status(self) -> str:
        if self.current is None:
            return "missing"
        return "ok" if self.current >= self.floor else "FAIL"

    @property
    def change(self) -> Optional[float]:
        return None if self.current is None else self.current / self.baseline - 1.0


def compare(current: Dict[str, Any], baseline: Dict[str, Any],
            margin: float = DEFAULT_MARGIN) -> List[Check]:
    """One check per tracked ratio of the baseline. A ratio this run did not measure
    (another matrix, a peer that did not run) is ``missing``, not a failure."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    cur = current.get("ratios", {})
    checks = []
    for name, b in baseline.get("ratios", {}).items():
        if not b.get("tracked", True):
            continue
        c = cur.get(name)
        checks.append(Check(name, float(b["value"]), None if c is None else float(c["value"]), margin))
    return checks


def failed(checks: List[Check]) -> List[Check]:
    return [c for c in checks if c.status == "FAIL"]


def table(checks: List[Check]) -> str:
    lines = ["| tracked ratio | baseline | this run | change | floor | status |",
             "|---|---|---|---|---|---|"]
    for c in checks:
        cur = "" if c.current is None else f"{c.current:.3f}"
        ch = "" if c.change is None else f"{c.change:+.1%}"
        st = "**FAIL**" if c.status == "FAIL" else c.status
        lines.append(f"| {c.name} | {c.baseline:.3f} | {cur} | {ch} | {c.floor:.3f} | {st} |")
    return "\n".join(lines)


def summary(checks: List[Check]) -> str:
    f = failed(checks)
    n_ok = sum(1 for c in checks if c.status == "ok")
    n_missing = sum(1 for c in checks if c.status == "missing")
    if not checks:
        return "gate: the baseline has no tracked ratio that this run measured"
    head = "gate: FAIL" if f else "gate: ok"
    return (f"{head}: {n_ok} ok, {len(f)} below the margin, {n_missing} not measured in this run"
            + ("" if not f else "; " + ", ".join(c.name for c in f)))
