"""``specdec bench --list``: each matrix's cases, what they run, and the ratios they report.

The ratio names are not written out by hand: each case's methods and prompts are turned into
rows with a nominal speed and handed to the same :func:`report.compute_ratios` a run uses,
so the list is what a run of that case reports, and cannot drift from it.
"""
from __future__ import annotations

from typing import List

from .matrix import LLAMA_CPP, SPECDEC, Case, Matrix
from .report import compute_ratios
from .rows import BOS_PROMPT, Row, interleaved_prompt


def _nominal_rows(case: Case) -> List[Row]:
    rows = []
    for m in case.methods:
        if m.family == "plain" and m.side == LLAMA_CPP:       # llama-bench: from BOS
            rows.append(Row(case.name, BOS_PROMPT, "plain", m.label, m.side, m.family, m.drafter,
                            tok_s=1.0))
            continue
        for p in case.prompts:
            rows.append(Row(case.name, p.name, p.category, m.label, m.side, m.family, m.drafter,
                            m.n_max, m.adaptive, m.exact, m.temperature, tok_s=1.0,
                            constraint=m.constraint))
            if case.interleave and m.side == SPECDEC and m.adaptive:
                rows.append(Row(case.name, interleaved_prompt(p.name), p.category, m.label,
                                m.side, m.family, m.drafter, m.n_max, m.adaptive, tok_s=1.0,
                                ref_tok_s=1.0))
    if any(m.family == "plain" and m.side == LLAMA_CPP for m in case.methods):
        rows.append(Row(case.name, BOS_PROMPT, "plain", "specdec plain", SPECDEC, "plain",
                        tok_s=1.0))
    return rows


def case_ratios(case: Case) -> List[str]:
    """The ratios a run of ``case`` reports (tracked ones first), as ``name (kind)``."""
    ratios = compute_ratios(_nominal_rows(case)).values()
    prefix = f"{case.name}: "
    ordered = sorted(ratios, key=lambda r: not r.tracked)
    return [f"{r.name.removeprefix(prefix)}" + ("" if r.tracked else f" [{r.kind}, not gated]")
            for r in ordered]


def describe(m: Matrix) -> str:
    minutes = (f", about {m.expected_minutes:g} min on 2 cores with peers built"
               if m.expected_minutes else "")
    lines = [f"{m.name}: {len(m.cases)} case(s), {m.reps} alternating rounds{minutes}"]
    for c in m.cases:
        lines.append(f"  {c.name}: {len(c.prompts)} prompt(s) "
                     f"({', '.join(p.name for p in c.prompts)}), {c.n_gen} tokens")
        lines.append("    methods: " + ", ".join(x.label for x in c.methods))
        lines += [f"    ratio: {r}" for r in case_ratios(c)]
    return "\n".join(lines)


def serve_line() -> str:
    from .serve import CONCURRENCY
    return ("serve (--case serve alone): specdec serve against llama-server, plain and n-gram "
            f"drafters, at concurrency {', '.join(map(str, CONCURRENCY))} (--concurrency N)")
