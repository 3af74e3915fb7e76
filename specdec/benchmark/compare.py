"""The regression gate: this run's tracked ratios against a baseline's.

Only ratios are compared (specdec over its own plain decoding, specdec over
llama.cpp for the same method), never absolute times: both sides of a ratio were
measured side by side, so machine drift cancels out.

A ratio fails when it falls below the baseline's value by more than its tolerance. The
tolerance comes from the baseline's own spread: each ratio is also measured on every
alternating round alone, and ``SPREAD_FACTOR`` times the relative standard deviation of
those per-round values (at least ``MIN_TOLERANCE``, at most ``MAX_TOLERANCE``) is how far it
may drop. A steady ratio is held tightly and a noisy one loosely, instead of one fixed 15%
for all. This run's spread counts too: the drop is the difference of two measurements, and
its noise is both runs' (the spreads add in quadrature). A baseline taken on a quiet machine
held a ratio to 6% while a run on the same machine, its rounds 12% apart, fell 17% on noise
alone; a run that noisy is not evidence of a regression of that size. A baseline without a spread (one round, or written before spreads were recorded)
falls back to ``DEFAULT_MARGIN``; ``--margin`` forces one fixed margin for every ratio.

Whether the gate can judge at all is a separate verdict (``Verdict``): a baseline of another
machine class or another matrix, or one with nothing this run measured, gives no judgement,
which must neither pass nor fail silently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

DEFAULT_MARGIN = 0.15      # a ratio without a recorded spread
SPREAD_FACTOR = 3.0        # tolerance = this many relative standard deviations of the baseline
MIN_TOLERANCE = 0.05       # rounds that happened to agree do not make a 1% gate
MAX_TOLERANCE = 0.5


def tolerance_for(spread: Optional[float], margin: Optional[float] = None,
                  current_spread: Optional[float] = None) -> float:
    """How far below its baseline value a ratio may fall: ``margin`` if given, else from the
    baseline's spread and this run's (see the module docstring)."""
    if margin is not None:
        return margin
    if spread is None:
        return DEFAULT_MARGIN
    both = (spread ** 2 + (current_spread or 0.0) ** 2) ** 0.5
    return min(max(SPREAD_FACTOR * both, MIN_TOLERANCE), MAX_TOLERANCE)


@dataclass
class Check:
    name: str
    baseline: float
    current: Optional[float]
    margin: float                       # the tolerance, a fraction of the baseline value
    basis: str = "fixed"                # "spread" (from the baseline's spread) or "fixed"
    spread: Optional[float] = None      # the baseline's
    current_spread: Optional[float] = None

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
            margin: Optional[float] = None) -> List[Check]:
    """One check per tracked ratio of the baseline. A ratio this run did not measure
    (another matrix, a peer that did not run, a run that stopped early) is ``missing``,
    not a failure. ``margin``: one fixed tolerance instead of the baseline's spreads."""
    if margin is not None and not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    cur = current.get("ratios", {})
    checks = []
    for name, b in baseline.get("ratios", {}).items():
        if not b.get("tracked", True):
            continue
        c = cur.get(name)
        spread = b.get("spread")
        checks.append(Check(name, float(b["value"]), None if c is None else float(c["value"]),
                            tolerance_for(spread, margin, None if c is None else c.get("spread")),
                            "spread" if margin is None and spread is not None else "fixed",
                            spread, None if c is None else c.get("spread")))
    return checks


def why_not_comparable(current: Dict[str, Any], baseline: Dict[str, Any]) -> Optional[str]:
    """Why this run cannot be judged against ``baseline`` at all, or None: another machine
    class (ratios differ between kinds of CPU or device), another matrix (other prompts,
    lengths and rounds). A baseline that does not record them is judged."""
    bm, cm = baseline.get("machine") or {}, current.get("machine") or {}
    if bm.get("class") and cm.get("class") and bm["class"] != cm["class"]:
        return (f"the baseline is of machine class {bm['class']!r}, this run of {cm['class']!r}: "
                f"ratios compare within one class only")
    if baseline.get("matrix") and current.get("matrix") and baseline["matrix"] != current["matrix"]:
        return (f"the baseline is of the {baseline['matrix']!r} matrix, this run of "
                f"{current['matrix']!r}: run the same tier as the baseline")
    return None


def failed(checks: List[Check]) -> List[Check]:
    return [c for c in checks if c.status == "FAIL"]


def table(checks: List[Check]) -> str:
    lines = ["| tracked ratio | baseline | spread | this run | change | tolerance | floor | status |",
             "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        cur = "" if c.current is None else f"{c.current:.3f}"
        ch = "" if c.change is None else f"{c.change:+.1%}"
        sp = "" if c.spread is None else f"{c.spread:.1%}"
        tol = f"{c.margin:.1%}" + (" (fixed)" if c.basis == "fixed" else "")
        st = "**FAIL**" if c.status == "FAIL" else c.status
        lines.append(f"| {c.name} | {c.baseline:.3f} | {sp} | {cur} | {ch} | {tol} | "
                     f"{c.floor:.3f} | {st} |")
    return "\n".join(lines)


def summary(checks: List[Check]) -> str:
    f = failed(checks)
    n_ok = sum(1 for c in checks if c.status == "ok")
    n_missing = sum(1 for c in checks if c.status == "missing")
    if not checks:
        return "gate: the baseline has no tracked ratio"
    if not f and not n_ok:
        return f"gate: cannot judge: none of the baseline's {len(checks)} tracked ratios was measured"
    head = "gate: FAIL" if f else "gate: ok"
    return (f"{head}: {n_ok} ok, {len(f)} below the tolerance, {n_missing} not measured in this run"
            + ("" if not f else "; " + ", ".join(c.name for c in f)))


def missing_cases(checks: List[Check]) -> List[str]:
    """The cases (the part of a ratio's name before ': ') whose ratios this run lacks."""
    return list(dict.fromkeys(c.name.split(": ", 1)[0] for c in checks if c.status == "missing"))
