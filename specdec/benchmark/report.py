"""Ratios and the results JSON of a benchmark run (the Markdown report is ``report_md``).

Every number that matters is a ratio of two rows measured side by side in one run:
absolute tok/s drift by +-20% within an hour on these machines, ratios much less.
A method's score over several prompts is the geometric mean of its per-prompt
ratio, over the input-grounded prompts (``open`` prose is shown, not scored).

Ratio kinds:
- ``speedup``: a specdec method over specdec plain decoding (tracked by the gate);
- ``vs-llama.cpp``: specdec against llama.cpp for the same method, and plain
  specdec against ``llama-bench`` (tracked by the gate);
- ``vs-llama-cpp-python``: shown, not tracked;
- ``exact-cost``: a method in exact mode over the same method in fast mode: shown, not tracked;
- ``sampling-cost``: sampled plain decoding (temperature 1, OpenAI's default) over greedy plain
  decoding, timed round by round in turn on the same requests, over every prompt (open prose
  included): what building the sampling distribution costs (target 0.95), not tracked;
- ``oracle``: the oracle drafter (always right: the hardware's ceiling) over plain decoding, per
  ``n_max``; ``oracle-share``: a drafter's tok/s over the best oracle row's on the same prompt
  (its speedup as a share of the ceiling's): shown, not tracked;
- ``constraint-cost``: a structured case's constrained plain decoding over its unconstrained
  plain decoding, on the same requests and token counts: what the grammar's mask costs
  (target 0.95), tracked. A structured case's other ratios are its best constrained
  drafter over its constrained plain decoding (``speedup``, target 1.3) and over
  llama-server's best constrained n-gram mode (``vs-llama.cpp``, target 1.5).
"""
from __future__ import annotations

import copy
import json
import math
import os
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from .matrix import LCP, LLAMA_CPP, SPECDEC
from .prompts import GROUNDED
from .rows import BOS_PROMPT, Row, is_interleaved, rows_of
from .structured import structured_ratios

TRACKED_KINDS = ("speedup", "vs-llama.cpp", "constraint-cost")


@dataclass
class Ratio:
    name: str
    value: float
    kind: str
    case: str
    target: Optional[float] = None
    runs: Optional[List[float]] = None     # the same ratio on each alternating round alone

    @property
    def tracked(self) -> bool:
        return self.kind in TRACKED_KINDS

    @property
    def spread(self) -> Optional[float]:
        """Relative standard deviation of the per-round ratios (None under 2 rounds): how
        far this ratio moves between rounds of one run, which the gate's tolerance is
        made of."""
        if not self.runs or len(self.runs) < 2:
            return None
        mid = statistics.median(self.runs)
        return statistics.stdev(self.runs) / mid if mid > 0 else None

    def to_dict(self) -> Dict[str, Any]:
        spread = self.spread
        return {"value": round(self.value, 4), "kind": self.kind, "case": self.case,
                "target": self.target, "tracked": self.tracked,
                "runs": [round(x, 4) for x in self.runs or []],
                "spread": None if spread is None else round(spread, 4)}


def _gmean(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def _ok(r: Row) -> bool:
    return r.status == "ok" and r.tok_s > 0


class _Case:
    """The rows of one case, indexed for ratios."""

    def __init__(self, name: str, rows: List[Row]) -> None:
        self.name = name
        self.interleaved = [r for r in rows if is_interleaved(r.prompt)]
        rows = [r for r in rows if not is_interleaved(r.prompt)]
        self.rows = rows
        self.by = {(r.method, r.prompt): r for r in rows}
        self.prompts = list(dict.fromkeys(r.prompt for r in rows if r.prompt != BOS_PROMPT))
        cats = {r.prompt: r.category for r in rows}
        grounded = [p for p in self.prompts if cats[p] in GROUNDED]
        self.scored = grounded or self.prompts
        self.methods = list(dict.fromkeys(r.method for r in rows if r.prompt != BOS_PROMPT))
        self.meta = {r.method: r for r in rows if r.prompt != BOS_PROMPT}

    def interleaved_ratios(self) -> Dict[str, float]:
        """Per adaptive method: geometric mean over its prompts of its tok/s over plain
        decoding's, timed round by round in turn (0 if any prompt failed)."""
        per: Dict[str, List[float]] = {}
        for r in self.interleaved:
            ok = _ok(r) and r.ref_tok_s > 0
            per.setdefault(r.method, []).append(r.tok_s / r.ref_tok_s if ok else 0.0)
        return {m: (_gmean(v) if all(x > 0 for x in v) else 0.0) for m, v in per.items()}

    def sampling_cost(self, method: str) -> float:
        """A sampled plain method over greedy plain decoding: the geometric mean over every
        prompt of its rows' tok/s over greedy's timed in turn with it (``ref_tok_s``); results
        from before that pairing: its tok/s over the plain row's, as ``ratio``."""
        rows = [self.by.get((method, p)) for p in self.prompts]
        if not all(r is not None and _ok(r) and r.ref_tok_s > 0 for r in rows):
            return self.ratio(method, "specdec plain")
        return _gmean(r.tok_s / r.ref_tok_s for r in rows if r is not None)

    def ratio(self, a: str, b: str) -> float:
        """Geometric mean over the scored prompts of ``a``'s tok/s over ``b``'s."""
        vals = []
        for p in self.scored:
            ra, rb = self.by.get((a, p)), self.by.get((b, p))
            if ra is None or rb is None or not _ok(ra) or not _ok(rb):
                return 0.0
            vals.append(ra.tok_s / rb.tok_s)
        return _gmean(vals)

    def own_plain(self, method: str) -> Optional[str]:
        """The plain decoding a method is a speedup over: its side's, under its constraint."""
        side, constraint = self.meta[method].side, self.meta[method].constraint
        if side == LLAMA_CPP:
            return None           # llama.cpp's plain is llama-bench (empty context), see speedup()
        return f"{side} plain" + (f" {constraint}" if constraint else "")

    def speedup(self, method: str) -> float:
        """A method over its own side's plain decoding."""
        if self.meta[method].side == LLAMA_CPP:
            lb = self.by.get(("llama.cpp plain", BOS_PROMPT))
            if lb is None or not _ok(lb):
                return 0.0
            return _gmean(self.by[(method, p)].tok_s / lb.tok_s for p in self.scored
                          if (method, p) in self.by and _ok(self.by[(method, p)]))
        plain = self.own_plain(method)
        return self.ratio(method, plain) if plain and plain in self.meta else 0.0

    def best(self, side: str, family: Optional[str] = None, adaptive: Optional[bool] = None,
             exclude_plain: bool = True) -> Optional[str]:
        """The method of ``side`` (and ``family``) with the highest score."""
        cands = [m for m in self.methods if self.meta[m].side == side
                 and (family is None or self.meta[m].family == family)
                 and (adaptive is None or self.meta[m].adaptive == adaptive)
                 and (family is not None or self.meta[m].family != "oracle")
                 and not self.meta[m].exact
                 and not (exclude_plain and self.meta[m].family == "plain")]
        scored = [(self.score(m), m) for m in cands]
        scored = [x for x in scored if x[0] > 0]
        return max(scored)[1] if scored else None

    def oracle_best(self, prompt: str) -> Optional[Row]:
        """The fastest oracle row on ``prompt`` (the ceiling there), or None."""
        rs = [self.by[(m, prompt)] for m in self.methods if self.meta[m].family == "oracle"
              and (m, prompt) in self.by and _ok(self.by[(m, prompt)])]
        return max(rs, key=lambda r: r.tok_s) if rs else None

    def oracle_share(self, method: str) -> float:
        """Geometric mean over the scored prompts of ``method``'s tok/s over the best oracle
        row's: its speedup as a share of the ceiling's (0 if a prompt lacks either)."""
        vals = []
        for p in self.scored:
            r, o = self.by.get((method, p)), self.oracle_best(p)
            if r is None or o is None or not _ok(r):
                return 0.0
            vals.append(r.tok_s / o.tok_s)
        return _gmean(vals)

    def categories(self) -> Dict[str, List[str]]:
        """The case's prompts by category, in order."""
        cats: Dict[str, List[str]] = {}
        for r in self.rows:
            if r.prompt != BOS_PROMPT and r.prompt not in cats.get(r.category, []):
                cats.setdefault(r.category, []).append(r.prompt)
        return cats

    def scored_on(self, prompts: List[str]) -> "_Case":
        """This case with its ratios taken over ``prompts`` alone."""
        view = copy.copy(self)
        view.scored = list(prompts)
        return view

    def score(self, method: str) -> float:
        """Geometric mean tok/s over the scored prompts; 0 unless it ran on all of them."""
        rs = [self.by.get((method, p)) for p in self.scored]
        if any(r is None or not _ok(r) for r in rs):
            return 0.0
        return _gmean(r.tok_s for r in rs if r is not None)


def compute_ratios(rows: List[Row]) -> Dict[str, Ratio]:
    out: Dict[str, Ratio] = {}

    def put(case: str, name: str, value: float, kind: str, target: Optional[float] = None) -> None:
        if value > 0:
            key = f"{case}: {name}"
            out[key] = Ratio(key, value, kind, case, target)

    for case in dict.fromkeys(r.case for r in rows):
        c = _Case(case, [r for r in rows if r.case == case])
        if any(c.meta[m].constraint for m in c.methods):
            structured_ratios(c, put)
            continue
        sp = c.by.get(("specdec plain", BOS_PROMPT))
        lb = c.by.get(("llama.cpp plain", BOS_PROMPT))
        if sp and lb and _ok(sp) and _ok(lb):
            put(case, "specdec plain / llama-bench", sp.tok_s / lb.tok_s, "vs-llama.cpp",
                0.97 if case.startswith("gemma") else None)
        for m in c.methods:
            if c.meta[m].family == "greedy" and "specdec plain" in c.meta:
                # the same work on both sides: greedy sampling on the same prompt
                put(case, f"specdec plain / {m}", c.ratio("specdec plain", m), "vs-llama.cpp",
                    0.98)
        families = dict.fromkeys(c.meta[m].family for m in c.methods if c.meta[m].side == SPECDEC)
        for fam in families:
            if fam == "plain":
                continue
            if fam == "oracle":
                for m in c.methods:
                    if c.meta[m].family == "oracle":
                        put(case, f"{m} / specdec plain", c.speedup(m), "oracle")
                continue
            for adaptive in (False, True):
                m = c.best(SPECDEC, fam, adaptive)
                if m is None:
                    continue
                how = "adaptive" if adaptive else "best fixed"
                put(case, f"specdec {fam} {how} / specdec plain", c.speedup(m), "speedup")
                share = c.oracle_share(m)
                if share <= 1.0:     # above: a failed check (``ceiling_failures``), no ratio
                    put(case, f"specdec {fam} {how} / oracle best", share, "oracle-share")
                theirs = c.best(LLAMA_CPP, fam)
                if theirs is not None:
                    target = None
                    if fam in ("mtp", "eagle3", "dflash"):
                        target = 1.10 if adaptive else 1.0
                    put(case, f"specdec {fam} {how} / llama.cpp {c.meta[theirs].drafter} best",
                        c.ratio(m, theirs), "vs-llama.cpp", target)
        for m, v in c.interleaved_ratios().items():
            fam = next(r.family for r in c.interleaved if r.method == m)
            put(case, f"{m} / specdec plain, interleaved", v, "speedup",
                0.97 if fam == "mtp" else None)
        for m in c.methods:
            if c.meta[m].family == "plain" and c.meta[m].side == SPECDEC and c.meta[m].temperature:
                put(case, f"{m} / specdec plain", c.sampling_cost(m), "sampling-cost", 0.95)
        for m in c.methods:
            fast = m[:-len(" exact")]
            if c.meta[m].exact and fast in c.meta:
                put(case, f"{m} / {fast}", c.ratio(m, fast), "exact-cost")
        best_ours = c.best(SPECDEC)
        ngram_fams = ("ngram", "ngram-map", "ngram-mod", "ngram-cache")
        theirs_ng = [m for m in (c.best(LLAMA_CPP, f) for f in ngram_fams) if m]
        best_theirs = max(theirs_ng, key=c.score) if theirs_ng else None
        if best_ours and best_theirs and c.meta[best_ours].family in ngram_fams + ("suffix",):
            put(case, "best specdec drafter / best llama.cpp n-gram mode",
                c.ratio(best_ours, best_theirs), "vs-llama.cpp", 1.15)
        if theirs_ng:
            # each category alone (issue 30: code, repeat, records and open each at or above
            # llama.cpp's best configuration of its speculative tool, its defaults included)
            for cat, prompts in c.categories().items():
                v = c.scored_on(prompts)
                ours, theirs = v.best(SPECDEC), v.best(LLAMA_CPP)
                if ours and theirs:
                    put(case, f"{cat} prompts: best specdec / best llama.cpp configuration",
                        v.ratio(ours, theirs), "vs-llama.cpp", 1.0)
        if "specdec plain" in c.meta and "llama-cpp-python plain" in c.meta:
            put(case, "specdec plain / llama-cpp-python plain",
                c.ratio("specdec plain", "llama-cpp-python plain"), "vs-llama-cpp-python")
        pld = c.best(LCP, "ngram")
        if best_ours and pld:
            put(case, "best specdec drafter / llama-cpp-python prompt lookup best",
                c.ratio(best_ours, pld), "vs-llama-cpp-python", 2.0)
        dm = c.best(LCP, "draft")
        ours_draft = c.best(SPECDEC, "draft")
        if dm and ours_draft:
            put(case, "specdec draft best / llama-cpp-python draft model",
                c.ratio(ours_draft, dm), "vs-llama-cpp-python")
    return out


def _round(rows: List[Row], i: int) -> List[Row]:
    """The rows as round ``i`` alone measured them (a row with fewer rounds keeps its value)."""
    out = []
    for r in rows:
        tok_s = r.tok_s_runs[i] if i < len(r.tok_s_runs) else r.tok_s
        ref = r.ref_tok_s_runs[i] if i < len(r.ref_tok_s_runs) else r.ref_tok_s
        out.append(replace(r, tok_s=tok_s, ref_tok_s=ref))
    return out


def ratios_with_spread(rows: List[Row]) -> Dict[str, Ratio]:
    """:func:`compute_ratios`, each with its value on every round alone (``runs``): both
    sides of a ratio ran in turn within a round, so a round's ratio is a sample of it."""
    out = compute_ratios(rows)
    n = max((len(r.tok_s_runs) for r in rows), default=0)
    per = [compute_ratios(_round(rows, i)) for i in range(n)] if n >= 2 else []
    for name, ratio in out.items():
        runs = [p[name].value for p in per if name in p]
        ratio.runs = runs if len(runs) == len(per) else None
    return out


def oracle_summary(rows: List[Row]) -> Dict[str, Dict[str, Any]]:
    """Per case and prompt: the oracle's speedup over plain per ``n_max`` (the ceiling per
    draft length), its best ``n_max``, and every other method's tok/s as a share of the best
    oracle row's. Cases without oracle rows are left out."""
    out: Dict[str, Dict[str, Any]] = {}
    for case in dict.fromkeys(r.case for r in rows):
        c = _Case(case, [r for r in rows if r.case == case])
        if not any(c.meta[m].family == "oracle" for m in c.methods):
            continue
        per: Dict[str, Any] = {}
        for p in c.prompts:
            best = c.oracle_best(p)
            plain = c.by.get(("specdec plain", p))
            if best is None or plain is None or not _ok(plain):
                continue
            speedup = {c.meta[m].n_max: c.by[(m, p)].tok_s / plain.tok_s
                       for m in c.methods if c.meta[m].family == "oracle"
                       and (m, p) in c.by and _ok(c.by[(m, p)])}
            share = {m: c.by[(m, p)].tok_s / best.tok_s for m in c.methods
                     if c.meta[m].family not in ("oracle", "plain") and (m, p) in c.by
                     and _ok(c.by[(m, p)])}
            per[p] = {"speedup": speedup, "best_n_max": best.n_max, "share": share}
        out[case] = per
    return out


def ceiling_failures(rows: List[Row]) -> List[str]:
    """specdec drafters (fast mode) faster than the best oracle row on a prompt: the oracle
    is then not the ceiling it is timed as, so their share is a failed check, not a row."""
    out = []
    for case, per in oracle_summary(rows).items():
        c = _Case(case, [r for r in rows if r.case == case])
        for p, v in per.items():
            out += [f"{case} / {p} / {m}: {share:.0%} of the oracle (above its ceiling)"
                    for m, share in v["share"].items()
                    if share > 1.0 and c.meta[m].side == SPECDEC and not c.meta[m].exact]
    return out


def failures(rows: List[Row]) -> List[Row]:
    """Rows whose exact-mode output differs from plain greedy output."""
    return [r for r in rows if r.check == "FAIL" or r.check.startswith("error")]


# --- files ------------------------------------------------------------------------------

def finalize(results: Dict[str, Any]) -> Dict[str, Any]:
    """Add the ratios and failures to a results dict (idempotent)."""
    rows = rows_of(results)
    results["ratios"] = {k: r.to_dict() for k, r in ratios_with_spread(rows).items()}
    results["oracle"] = oracle_summary(rows)
    results["failures"] = [f"{r.case} / {r.prompt} / {r.method}: {r.check}" for r in failures(rows)]
    results["failures"] += [f"{c['case']} / {c['prompt']} / oracle n{c['n_max']} (exact): {c['check']}"
                            for c in results.get("oracle_checks", []) if c["check"] != "PASS"]
    results["failures"] += ceiling_failures(rows)
    return results


def save_json(results: Dict[str, Any], path: os.PathLike[str] | str) -> Path:
    """Write atomically (a temporary file in the same directory, then ``os.replace``): a run
    killed while writing leaves the previous complete file, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(results, indent=1) + "\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


class BadInput(ValueError):
    """A results or baseline file that is missing or is not one (``specdec bench`` exit 3)."""


def load_json(path: os.PathLike[str] | str) -> Dict[str, Any]:
    """A JSON object from ``path``; :class:`BadInput` (one line) if it is missing or not JSON."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: cannot read it ({e})") from None
    except ValueError as e:
        raise BadInput(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: not a JSON object")
    return data


def load_results(path: os.PathLike[str] | str) -> Dict[str, Any]:
    """A results file (complete or partial) with its ratios computed; :class:`BadInput` if it
    is not one."""
    data = load_json(path)
    missing = [k for k in ("rows", "matrix", "machine", "settings") if k not in data]
    if missing or not isinstance(data["rows"], list):
        raise BadInput(f"{path}: not a results file of specdec bench (missing "
                       f"{', '.join(missing) or 'a list of rows'})")
    try:
        return finalize(data)
    except (TypeError, KeyError, ValueError) as e:
        raise BadInput(f"{path}: malformed results ({type(e).__name__}: {e})") from None


def progress_of(results: Dict[str, Any]) -> Dict[str, Any]:
    """Which cases a run planned and which it completed (measured and checked). A results
    file without the record (written before runs recorded it) counts as complete."""
    done = list(dict.fromkeys(r["case"] for r in results.get("rows", [])))
    return results.get("progress") or {"complete": True, "planned": done, "completed": done}


def baseline_of(results: Dict[str, Any]) -> Dict[str, Any]:
    """The small file kept in ``bench/baselines/``: machine, settings and tracked ratios (and
    the runs it was merged from: ``baseline_runs``)."""
    return {"schema": results.get("schema", 1), "matrix": results["matrix"],
            "machine": results["machine"], "settings": results["settings"],
            "wall_s": results.get("wall_s"),
            "ratios": {k: v for k, v in results["ratios"].items() if v["tracked"]},
            "shown": {k: v for k, v in results["ratios"].items() if not v["tracked"]},
            **({"merged_from": results["merged_from"]} if "merged_from" in results else {})}


def ratios_from(results: Dict[str, Any]) -> Dict[str, float]:
    return {k: v["value"] for k, v in results.get("ratios", {}).items()}


__all__ = ["Ratio", "BadInput", "compute_ratios", "ratios_with_spread", "finalize", "save_json",
           "load_json", "load_results", "progress_of", "baseline_of",
           "markdown", "failures", "ceiling_failures", "ratios_from", "oracle_summary", "oracle_table"]
