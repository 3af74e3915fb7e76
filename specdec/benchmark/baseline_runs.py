"""A baseline from several runs (``specdec bench --results A --results B ... --save-baseline``):
each ratio's median over the runs, and a spread that counts how far the runs differ.

Why: a run's spread is over its rounds, and its rounds share one process's state: an adaptive
policy learns over the requests of one ``Decoder`` and starts each round where the last one
left it, and the head a context uses is chosen once per process. Such rounds agree with each
other more than runs do. The mid MTP model's adaptive / plain ratio, interleaved, spread
1.2-1.5% over a run's rounds but read 1.03 to 1.17 over seven runs of two commits (the
baseline's own and one two days later) on one machine within an hour; a baseline of one run
held it at 1.192 with a tolerance of 5.8%, and runs of the very code that wrote it failed the
gate. A baseline taken from several runs holds each ratio at their median, with the larger of
the runs' own spread (their median) and the relative standard deviation between the runs: a
ratio that runs reproduce is still held tightly, one that moves from run to run loosely.
"""
from __future__ import annotations

import copy
import statistics
from typing import Any, Dict, List

from . import compare
from .report import BadInput, progress_of

#: runs a merged baseline needs at the least (two runs give a between-run spread, a poor one)
MIN_RUNS = 2


def merge(runs: List[Dict[str, Any]], names: List[str]) -> Dict[str, Any]:
    """One results record from complete ``runs`` (``names``: their files, for messages) of one
    matrix and machine class: the first run's rows and records, each ratio measured in every
    run at its median value, its ``spread`` as the module says, its values in ``run_values``.
    :class:`BadInput` for fewer than ``MIN_RUNS``, a partial run or runs that do not compare."""
    if len(runs) < MIN_RUNS:
        raise BadInput(f"a baseline from several runs needs at least {MIN_RUNS} results files")
    for run, name in zip(runs, names):
        if not progress_of(run)["complete"]:
            raise BadInput(f"{name}: a partial run (it stopped before every case was measured)")
        why = compare.why_not_comparable(run, runs[0])
        if why:
            raise BadInput(f"{name} and {names[0]} are not runs of one baseline: {why}")
    out = copy.deepcopy(runs[0])
    ratios: Dict[str, Any] = {}
    for key, first in runs[0]["ratios"].items():
        got = [run["ratios"].get(key) for run in runs]
        if any(g is None or g.get("value") is None for g in got):
            continue                     # not measured in every run: no merged value
        values = [float(g["value"]) for g in got]
        own = [g["spread"] for g in got if g.get("spread") is not None]
        mean = statistics.fmean(values)
        between = statistics.stdev(values) / mean if mean > 0 else 0.0
        r = dict(first)
        r["value"] = statistics.median(values)
        r["spread"] = max(statistics.median(own), between) if own else between
        r["run_values"] = values
        ratios[key] = r
    out["ratios"] = ratios
    out["failures"] = [f for run in runs for f in run.get("failures", [])]
    out["merged_from"] = list(names)
    return out
