"""The Markdown report of a benchmark run (``report.md``, and what ``specdec bench`` prints):
the headline ratios, a table per case, the interleaved floor, the oracle's ceiling and what
failed. It renders what ``report`` computed from the rows; it computes no ratio itself."""
from __future__ import annotations

from typing import Any, Dict, List

from .head_times import head_line
from .matrix import LLAMA_CPP
from .report import (Ratio, _Case, _ok, ceiling_failures, compute_ratios, failures,
                     oracle_summary, progress_of)
from .rows import BOS_PROMPT, INTERLEAVED, Row, rows_of


def oracle_table(name: str, rows: List[Row]) -> str:
    """The ceiling per prompt and draft length, and each drafter's share of it ("" if no
    oracle rows)."""
    per = oracle_summary(rows).get(name)
    if not per:
        return ""
    prompts = list(per)
    ks = sorted({k for v in per.values() for k in v["speedup"]})
    out = ["The oracle drafter proposes its own output (fast mode, every draft right): "
           "its speedup over plain decoding is the ceiling of this machine at each draft length. "
           "Below, each method's tok/s as a share of the best oracle row on the same prompt.", "",
           "| | " + " | ".join(prompts) + " |", "|---|" + "---|" * len(prompts)]
    for k in ks:
        out.append(f"| oracle n{k} speedup | " + " | ".join(
            f"{per[p]['speedup'][k]:.2f}x" if k in per[p]["speedup"] else "" for p in prompts) + " |")
    methods = list(dict.fromkeys(m for p in prompts for m in per[p]["share"]))
    for m in methods:
        out.append(f"| {m} | " + " | ".join(
            f"{per[p]['share'][m]:.0%}" if m in per[p]["share"] else "" for p in prompts) + " |")
    return "\n".join(out)



def _cell(r: Row, speedup: float) -> str:
    if r.status != "ok" or r.tok_s <= 0:
        return f"{r.status}: {r.note[:80]}" if r.note else r.status
    bits = [f"{r.tok_s:.1f}"]
    extra = []
    if speedup > 0 and r.family not in ("plain", "greedy"):
        extra.append(f"{speedup:.2f}x")
    if r.temperature and r.ref_tok_s > 0:   # sampled plain: over greedy, timed in turn with it
        extra.append(f"{r.tok_s / r.ref_tok_s:.2f}x greedy in turn")
    if r.drafted:
        extra.append(f"acc {r.acceptance:.0%}")
    if r.match is not None and r.match < 1:
        extra.append(f"match {r.match:.0%}")
    if r.check == "FAIL":
        extra.append("**FAIL**")
    if extra:
        bits.append("(" + ", ".join(extra) + ")")
    return " ".join(bits)


def headline(ratios: Dict[str, Ratio]) -> str:
    lines = ["| ratio (measured in this run) | value | target | met |", "|---|---|---|---|"]
    for r in ratios.values():
        if r.target is None:
            continue
        lines.append(f"| {r.name} | {r.value:.2f} | >= {r.target:.2f} | "
                     f"{'yes' if r.value >= r.target else 'no'} |")
    return "\n".join(lines)


def case_table(name: str, rows: List[Row]) -> str:
    c = _Case(name, rows)
    head = ["method", *c.prompts, "speedup", "exact check"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in c.methods:
        cells = []
        for p in c.prompts:
            r = c.by.get((m, p))
            cells.append("" if r is None else _cell(r, _per_prompt_speedup(c, r)))
        checks = {c.by[(m, p)].check for p in c.prompts if (m, p) in c.by}
        check = "FAIL" if "FAIL" in checks else ("PASS" if checks == {"PASS"} else
                                                   ", ".join(sorted(x for x in checks if x)))
        sp = c.speedup(m) if c.meta[m].family not in ("plain", "greedy") else 0.0
        out.append(f"| {m} | " + " | ".join(cells) + f" | {sp:.2f}x | {check} |"
                   if sp else f"| {m} | " + " | ".join(cells) + f" |  | {check} |")
    return "\n".join(out)


def interleaved_table(name: str, rows: List[Row]) -> str:
    """The adaptive methods timed round by round in turn with plain decoding ("" if none)."""
    c = _Case(name, rows)
    if not c.interleaved:
        return ""
    out = ["Adaptive methods timed round by round in turn with plain decoding, on the same "
           "requests (a slow stretch of the machine lands on both): tok/s of each side over "
           "all requests, their ratio, and the lowest and highest per-request ratio.", "",
           "| method | prompt | tok/s | plain tok/s | ratio | per request | acceptance | requests |",
           "|---|---|---|---|---|---|---|---|"]
    for r in c.interleaved:
        prompt = r.prompt[:-len(INTERLEAVED)].rstrip()
        if not _ok(r) or r.ref_tok_s <= 0:
            out.append(f"| {r.method} | {prompt} | {r.status}: {r.note[:80]} | | | | | |")
            continue
        per = [a / b for a, b in zip(r.tok_s_runs, r.ref_tok_s_runs) if b > 0]
        span = f"{min(per):.3f}-{max(per):.3f}" if per else ""
        acc = f"{r.acceptance:.0%} of {r.drafted}" if r.drafted else "no drafts"
        same = "" if r.match in (None, 1.0) else " (outputs differ!)"
        out.append(f"| {r.method} | {prompt} | {r.tok_s:.1f} | {r.ref_tok_s:.1f} | "
                   f"{r.tok_s / r.ref_tok_s:.3f}x{same} | {span} | {acc} | {len(per)} |")
    return "\n".join(out)


def _per_prompt_speedup(c: _Case, r: Row) -> float:
    if r.side == LLAMA_CPP:
        lb = c.by.get(("llama.cpp plain", BOS_PROMPT))
        return r.tok_s / lb.tok_s if lb and _ok(lb) and _ok(r) else 0.0
    plain = c.by.get((c.own_plain(r.method) or "", r.prompt))
    return r.tok_s / plain.tok_s if plain and _ok(plain) and _ok(r) else 0.0


def markdown(results: Dict[str, Any]) -> str:
    rows = rows_of(results)
    ratios = compute_ratios(rows)
    m = results["machine"]
    s = results["settings"]
    lines = [f"# specdec bench: {results['matrix']}", "",
             f"{m['cpu']}, {m['cpus']} CPUs, {m['threads']} threads; specdec {m['specdec']} "
             f"(commit {m.get('commit') or 'n/a'}), llama.cpp {m['llama_cpp_pin']}, "
             f"llama-cpp-python {results['peers'].get('llama-cpp-python') or 'not run'}; "
             f"{s['reps']} alternating rounds, medians; wall time {results.get('wall_s', 0):.0f} s; "
             f"load average at start {m.get('load_avg_start')}.", ""]
    if m.get("timing_env"):
        env = ", ".join(f"{k}={v}" for k, v in m["timing_env"].items())
        lines += [f"**Thread environment: {env}.**", ""]
    if s.get("inject_sleep_ms"):
        lines += [f"**Injected sleep: {s['inject_sleep_ms']:.0f} ms per specdec round** "
                  "(a deliberately slowed build).", ""]
    prog = progress_of(results)
    if not prog["complete"]:
        missing = [c for c in prog["planned"] if c not in prog["completed"]]
        lines += [f"**Partial results: the run stopped before it finished.** Completed cases: "
                  f"{', '.join(prog['completed']) or 'none'}; not completed: "
                  f"{', '.join(missing) or 'none'} (rows measured before the stop are kept; "
                  f"their exact-mode check may not have run).", ""]
    lines += ["## Headline ratios", "", headline(ratios), ""]
    for case in dict.fromkeys(r.case for r in rows):
        cr = [r for r in rows if r.case == case]
        lines += [f"## {case}", "",
                  "tok/s (speedup over the side's own plain decoding, acceptance, share of "
                  "tokens equal to plain greedy output when below 100%). llama.cpp's plain is "
                  "`llama-bench`; speedup column: geometric mean over the input-grounded prompts.", ""]
        bos = [r for r in cr if r.prompt == BOS_PROMPT]
        if bos:
            lines += ["Plain decoding from an empty context: " + ", ".join(
                f"{r.method} {r.tok_s:.1f} tok/s" if _ok(r) else f"{r.method} {r.status} ({r.note})"
                for r in bos), ""]
        lines += [case_table(case, cr), ""]
        if case in results.get("lm_head", {}):
            lines += [head_line(results["lm_head"][case]), ""]
        il = interleaved_table(case, cr)
        if il:
            lines += [il, ""]
        ot = oracle_table(case, cr)
        if ot:
            lines += [ot, ""]
    lines += ["## All ratios", "", "Spread: relative standard deviation of the ratio over the "
              "alternating rounds (each round's ratio alone).", "",
              "| ratio | value | spread | kind | gate |", "|---|---|---|---|---|"]
    spread = {k: v.get("spread") for k, v in results.get("ratios", {}).items()}
    lines += [f"| {r.name} | {r.value:.3f} | "
              f"{'' if spread.get(r.name) is None else format(spread[r.name], '.1%')} | "
              f"{r.kind} | {'tracked' if r.tracked else ''} |" for r in ratios.values()]
    fails = failures(rows)
    oracle = results.get("oracle_checks", [])
    oracle_fails = [c for c in oracle if c["check"] != "PASS"]
    lines += ["", "## Exact-mode output check", ""]
    if fails or oracle_fails:
        lines += [f"- **{r.case} / {r.prompt} / {r.method}: {r.check}**" for r in fails]
        lines += [f"- **{c['case']} / {c['prompt']} / oracle n{c['n_max']}: {c['check']}**"
                  for c in oracle_fails]
    else:
        n = sum(1 for r in rows if r.check == "PASS")
        lines += [f"All {n} specdec (method, prompt) pairs produce plain greedy output token for "
                  f"token in exact mode ({s['check_tokens']} tokens)."]
    if oracle and not oracle_fails:
        ks = sorted({c["n_max"] for c in oracle})
        lines += [f"An oracle drafter (the plain output itself) at n_max {', '.join(map(str, ks))} "
                  f"is accepted in full and changes nothing on all {len(oracle)} (case, prompt, "
                  f"n_max) triples: verify batches of 2 to {max(ks) + 1} rows are batch-invariant."]
    above = ceiling_failures(rows)
    if above:
        lines += ["", "## Above the oracle (failed: the oracle is no ceiling there)", ""]
        lines += [f"- **{x}**" for x in above]
    gone = [r for r in rows if r.status != "ok"]
    if gone:
        lines += ["", "## Methods that did not run", ""]
        seen = set()
        for r in gone:
            if (r.case, r.method) not in seen:
                seen.add((r.case, r.method))
                lines.append(f"- {r.case} / {r.method}: {r.status}: {r.note}")
    return "\n".join(lines) + "\n"
