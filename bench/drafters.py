"""Drafter benchmark on gemma3-270m: specdec's drafters against plain decoding and
against llama.cpp's own n-gram speculative modes, measured in one run.

``python -m bench.drafters [--quick]`` prints a Markdown table; ``run()`` returns the rows.
Every method's greedy output is compared with specdec's plain greedy output: the
match rate (common prefix / length) is reported, so a fast but wrong method shows.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

import specdec

from specdec.benchmark.runner import forget_texts
from .llama_tools import ensure_tools, run_spec_simple
from .prompts import Prompt, all_prompts

N_GEN = 256


@dataclass
class Row:
    method: str
    prompt: str
    category: str
    tok_s: float
    drafted: int = 0
    accepted: int = 0
    match: float = 1.0          # share of tokens equal to plain greedy, from the start
    note: str = ""

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def _prefix_match(a: Sequence[int], b: Sequence[int]) -> float:
    n = min(len(a), len(b))
    k = next((i for i in range(n) if a[i] != b[i]), n)
    return k / max(n, 1)


def _text_match(a: str, b: str) -> float:
    n = min(len(a), len(b))
    k = next((i for i in range(n) if a[i] != b[i]), n)
    return k / max(n, 1)


SPECDEC_METHODS: Dict[str, dict] = {
    "ngram n3": dict(drafter="ngram", n_max=3),
    "ngram n4": dict(drafter="ngram", n_max=4),
    "ngram n7": dict(drafter="ngram", n_max=7),
    "ngram adaptive": dict(drafter="ngram", n_max=8, adaptive=True),
    "suffix n3": dict(drafter="suffix", n_max=3),
    "suffix n7": dict(drafter="suffix", n_max=7),
    "suffix adaptive": dict(drafter="suffix", n_max=16, adaptive=True),
    "ngram-map adaptive": dict(drafter="ngram-map", n_max=8, adaptive=True),
    "ngram-cache adaptive": dict(drafter="ngram-cache", n_max=8, adaptive=True),
}
QUICK_METHODS = ["ngram n3", "ngram adaptive", "suffix n3", "suffix adaptive"]

# llama.cpp's n-gram modes with the n_max values swept (each mode's best is reported)
LLAMA_MODES: Dict[str, dict] = {
    "ngram-simple": dict(n_max=(3, 4, 6, 8), extra=("--spec-ngram-simple-size-n", "3")),
    "ngram-map-k": dict(n_max=(3, 4, 6, 8), extra=("--spec-ngram-map-k-size-n", "3")),
    "ngram-mod": dict(n_max=(4, 8, 16), extra=()),
}


def run(prompts: Optional[List[Prompt]] = None, methods: Optional[List[str]] = None,
        llama_modes: Optional[List[str]] = None, n_gen: int = N_GEN, model_path: Optional[str] = None,
        log=print) -> List[Row]:
    model_path = model_path or str(specdec.default_model_path())
    prompts = prompts or all_prompts()
    methods = methods if methods is not None else list(SPECDEC_METHODS)
    llama_modes = llama_modes if llama_modes is not None else list(LLAMA_MODES)
    model = specdec.Model(model_path)
    available = set(specdec.drafters.available())
    plain_dec = specdec.Decoder(model, n_ctx=8192, n_threads=2)
    decs = {}
    for name in methods:
        kw = SPECDEC_METHODS[name]
        if kw["drafter"] not in available:
            log(f"skip {name}: drafter {kw['drafter']!r} not available")
            continue
        decs[name] = specdec.Decoder(model, n_ctx=8192, n_threads=2, **kw)
    if llama_modes:
        ensure_tools(("llama-speculative-simple",))
    rows: List[Row] = []
    for p in prompts:
        plain = plain_dec.generate(p.text, max_tokens=n_gen)
        rows.append(Row("specdec plain", p.name, p.category, plain.stats.tokens_per_s))
        log(f"{p.name}: plain {plain.stats.tokens_per_s:.1f} tok/s")
        for name, dec in decs.items():
            forget_texts(dec)      # each prompt from nothing, as llama.cpp's tools run it
            r = dec.generate(p.text, max_tokens=n_gen)
            rows.append(Row(f"specdec {name}", p.name, p.category, r.stats.tokens_per_s,
                            r.stats.drafted, r.stats.accepted, _prefix_match(r.tokens, plain.tokens)))
            log(f"  {name}: {r.stats.tokens_per_s:.1f} tok/s, acc {r.stats.acceptance_rate:.2f}")
        for mode in llama_modes:
            cfg = LLAMA_MODES[mode]
            best: Optional[Row] = None
            for n_max in cfg["n_max"]:
                try:
                    out = run_spec_simple(model_path, p.text, n_gen, spec_type=mode, n_max=n_max,
                                          threads=2, extra=cfg["extra"])
                except Exception as e:  # a peer that cannot run gets a row saying why
                    row = Row(f"llama.cpp {mode}", p.name, p.category, 0.0, note=f"failed: {e}")
                else:
                    row = Row(f"llama.cpp {mode}", p.name, p.category, out["tok_s"], out["n_drafted"],
                              out["n_accepted"], _text_match(out["text"], plain.text),
                              note=f"n_max {n_max}")
                if best is None or row.tok_s > best.tok_s:
                    best = row
            rows.append(best)
            log(f"  llama.cpp {mode}: {best.tok_s:.1f} tok/s ({best.note})")
    return rows


def table(rows: List[Row]) -> str:
    """Markdown: tok/s per method and prompt, speedup over specdec plain, acceptance, match."""
    prompts = list(dict.fromkeys(r.prompt for r in rows))
    methods = list(dict.fromkeys(r.method for r in rows))
    plain = {r.prompt: r.tok_s for r in rows if r.method == "specdec plain"}
    by = {(r.method, r.prompt): r for r in rows}
    out = ["| method | " + " | ".join(prompts) + " | mean speedup (grounded) |",
           "|---|" + "---|" * (len(prompts) + 1)]
    for m in methods:
        cells, speed = [], []
        for p in prompts:
            r = by.get((m, p))
            if r is None:
                cells.append("")
                continue
            sp = r.tok_s / plain[p] if plain.get(p) else 0.0
            if r.category != "open":
                speed.append(sp)
            extra = f", acc {r.acceptance:.0%}" if r.drafted else ""
            extra += f", match {r.match:.0%}" if r.match < 1 else ""
            extra += f", {r.note}" if r.note else ""
            cells.append(f"{r.tok_s:.1f} ({sp:.2f}x{extra})")
        mean = statistics.mean(speed) if speed else 0.0
        out.append(f"| {m} | " + " | ".join(cells) + f" | {mean:.2f}x |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one prompt per category, fewer methods")
    ap.add_argument("--n-gen", type=int, default=N_GEN)
    args = ap.parse_args(argv)
    prompts = all_prompts()
    methods = None
    if args.quick:
        seen, quick = set(), []
        for p in prompts:
            if p.category not in seen:
                seen.add(p.category)
                quick.append(p)
        prompts, methods = quick, QUICK_METHODS
    rows = run(prompts, methods, n_gen=args.n_gen, log=lambda s: print(s, file=sys.stderr))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
