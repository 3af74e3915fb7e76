"""PNG plots of a benchmark run (matplotlib, Agg backend, imported only when plotting).

- ``tok_s_by_category.png``: tokens/s per method and prompt category, per case;
- ``speedup.png``: each method over its own side's plain decoding;
- ``acceptance_by_position.png``: P(draft i accepted | proposed), per specdec method;
- ``mtp_speedup_vs_acceptance.png``: MTP speedup against acceptance, specdec and llama.cpp;
- ``oracle.png`` (cases with timed oracle rows): the oracle's speedup per prompt and ``n_max``
  (the ceiling), and each drafter's share of the best oracle row per prompt.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List

from .matrix import LLAMA_CPP, SPECDEC
from .prompts import GROUNDED
from .report import _Case, oracle_summary
from .rows import BOS_PROMPT, Row, is_interleaved, rows_of

COLORS = {SPECDEC: "tab:blue", LLAMA_CPP: "tab:orange", "llama-cpp-python": "tab:green"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _gmean(xs: List[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else 0.0


def _cases(rows: List[Row]) -> Dict[str, List[Row]]:
    out: Dict[str, List[Row]] = defaultdict(list)
    for r in rows:
        out[r.case].append(r)
    return out


def tok_s_by_category(rows: List[Row], path: Path) -> Path:
    """One panel per case with several prompt categories (bars per category); cases with
    a single prompt (the MTP models) share one panel, with bars per case."""
    plt = _plt()
    rows = [r for r in rows if r.prompt != BOS_PROMPT]
    panels = []
    single: List[Row] = []
    for case, rs in _cases(rows).items():
        if len({r.prompt for r in rs}) > 1:
            panels.append((case, rs, lambda r: r.category))
        else:
            single += rs
    if single:
        panels.append(("single-prompt cases", single, lambda r: r.case))
    n_bars = max((len({r.method for r in rs}) for _, rs, _ in panels), default=1)
    fig, axes = plt.subplots(len(panels) or 1, 1, squeeze=False,
                             figsize=(11, (1.2 + 0.32 * n_bars) * max(len(panels), 1) + 0.8))
    for ax, (title, rs, group) in zip(axes[:, 0], panels):
        groups = list(dict.fromkeys(group(r) for r in rs))
        methods = list(dict.fromkeys(r.method for r in rs))
        h = 0.8 / max(len(groups), 1)
        for j, g in enumerate(groups):
            vals = [_gmean([r.tok_s for r in rs if r.method == m and group(r) == g and r.status == "ok"])
                    for m in methods]
            ax.barh([i + j * h for i in range(len(methods))], vals, height=h, label=g)
        ax.set_yticks([i + h * (len(groups) - 1) / 2 for i in range(len(methods))], methods, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s (geometric mean over the group's prompts)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    return _save(plt, fig, path)


def speedup(rows: List[Row], path: Path) -> Path:
    plt = _plt()
    labels, vals, colors = [], [], []
    for case, rs in _cases(rows).items():
        c = _Case(case, rs)
        for m in c.methods:
            if c.meta[m].family == "plain":
                continue
            v = c.speedup(m)
            if v > 0:
                labels.append(f"{case}: {m}")
                vals.append(v)
                colors.append(COLORS.get(c.meta[m].side, "gray"))
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.22 * max(len(labels), 1)))
    ax.barh(range(len(vals)), vals, color=colors)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"speedup over the same side's plain decoding (grounded prompts: {', '.join(GROUNDED)})")
    return _save(plt, fig, path)


def acceptance_by_position(rows: List[Row], path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    sums: Dict[str, List[List[int]]] = {}
    for r in rows:
        if r.side != SPECDEC or not r.drafted_per_position:
            continue
        key = f"{r.case}: {r.method}"
        d, a = sums.setdefault(key, [[], []])
        for i, (x, y) in enumerate(zip(r.drafted_per_position, r.accepted_per_position)):
            if i >= len(d):
                d.append(0)
                a.append(0)
            d[i] += x
            a[i] += y
    for key, (d, a) in sums.items():
        pos = [i + 1 for i in range(len(d)) if d[i]]
        acc = [a[i] / d[i] for i in range(len(d)) if d[i]]
        ax.plot(pos, acc, marker="o", ms=3, label=key)
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accepted | proposed)")
    ax.set_ylim(0, 1.05)
    if sums:
        ax.legend(fontsize=6, ncol=2)
    return _save(plt, fig, path)


def mtp_speedup_vs_acceptance(rows: List[Row], path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for case, rs in _cases(rows).items():
        c = _Case(case, rs)
        for m in c.methods:
            meta = c.meta[m]
            if meta.family != "mtp":
                continue
            rr = [c.by[(m, p)] for p in c.prompts if (m, p) in c.by]
            drafted = sum(r.drafted for r in rr)
            if not drafted:
                continue
            x = sum(r.accepted for r in rr) / drafted
            y = c.speedup(m)
            marker = "s" if meta.adaptive else "o"
            ax.scatter([x], [y], color=COLORS.get(meta.side, "gray"), marker=marker)
            parts = case.split("-")
            tag = "".join(f"{t} " for t in parts[1:-1] if t not in ("mid", "tiny"))
            ax.annotate(f"{tag}{parts[-1]}% {m.split(' ', 1)[1]}", (x, y), fontsize=6)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("acceptance (accepted / drafted)")
    ax.set_ylabel("speedup over own plain decoding")
    ax.set_title("MTP: specdec (blue; squares adaptive) and llama.cpp draft-mtp (orange)", fontsize=9)
    return _save(plt, fig, path)


def oracle(rows: List[Row], path: Path) -> Path:
    """Per case with oracle rows: left, the oracle's speedup against ``n_max`` per prompt;
    right, each method's share of the best oracle row per prompt."""
    plt = _plt()
    summary = {case: per for case, per in oracle_summary(rows).items() if per}
    fig, axes = plt.subplots(max(len(summary), 1), 2, squeeze=False,
                             figsize=(12, 3.8 * max(len(summary), 1)))
    for (ax1, ax2), (case, per) in zip(axes, summary.items()):
        for p, v in per.items():
            ks = sorted(v["speedup"])
            ax1.plot(ks, [v["speedup"][k] for k in ks], marker="o", label=p)
        ax1.axhline(1.0, color="black", lw=0.8)
        ax1.set_xscale("log", base=2)
        ax1.set_xlabel("oracle n_max")
        ax1.set_ylabel("speedup over plain")
        ax1.set_title(f"{case}: the ceiling (every draft right)", fontsize=9)
        ax1.legend(fontsize=7)
        prompts = list(per)
        methods = list(dict.fromkeys(m for v in per.values() for m in v["share"]))
        h = 0.8 / max(len(prompts), 1)
        for j, p in enumerate(prompts):
            ax2.barh([i + j * h for i in range(len(methods))],
                     [per[p]["share"].get(m, 0.0) for m in methods], height=h, label=p)
        ax2.set_yticks([i + h * (len(prompts) - 1) / 2 for i in range(len(methods))], methods,
                       fontsize=7)
        ax2.invert_yaxis()
        ax2.axvline(1.0, color="black", lw=0.8)
        ax2.set_xlabel("tok/s as a share of the best oracle row")
        ax2.set_title(f"{case}: drafters against the ceiling", fontsize=9)
    return _save(plt, fig, path)


def rpc_latency(rows: List[Row], delays: Dict[str, float], path: Path) -> Path:
    """Speedup over the same side's plain decoding against the one-way network delay of the
    RPC cases: one line per method."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    lines: Dict[str, List[tuple]] = {}
    side_of: Dict[str, str] = {}
    for case, rs in _cases(rows).items():
        if case not in delays:
            continue
        c = _Case(case, rs)
        for m in c.methods:
            v = c.speedup(m) if c.meta[m].family != "plain" else 0.0
            if v > 0:
                lines.setdefault(m, []).append((delays[case], v))
                side_of[m] = c.meta[m].side
    for m, pts in sorted(lines.items()):
        pts.sort()
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o",
                ls="-" if side_of[m] == SPECDEC else "--", label=m)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("one-way delay per message (ms), every layer on 2 local RPC servers")
    ax.set_ylabel("speedup over the same side's plain decoding")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(results: Dict[str, Any], out_dir: Path) -> List[Path]:
    """Write every plot into ``out_dir``; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # the interleaved rows (adaptive vs plain in turn) are a separate measurement, in the report
    rows = [r for r in rows_of(results) if not is_interleaved(r.prompt)]
    delays = {name: c["rpc_delay_ms"] for name, c in results.get("settings", {}).get("cases", {}).items()
              if c.get("rpc_delay_ms") is not None}
    return [tok_s_by_category(rows, out_dir / "tok_s_by_category.png"),
            speedup(rows, out_dir / "speedup.png"),
            acceptance_by_position(rows, out_dir / "acceptance_by_position.png"),
            mtp_speedup_vs_acceptance(rows, out_dir / "mtp_speedup_vs_acceptance.png")] + (
                [oracle(rows, out_dir / "oracle.png")] if any(oracle_summary(rows).values()) else []
            ) + ([rpc_latency(rows, delays, out_dir / "rpc_latency.png")] if delays else [])
