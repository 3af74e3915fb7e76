"""MTP benchmark: specdec's MTP drafter against llama.cpp's ``draft-mtp`` on bigram models.

The models are specdec.testing's bigram qwen35 models ("mid": vocab 32000, n_embd
1024, 8 trunk layers, F16), whose MTP head predicts the trunk's next token; noise
on the head's ``eh_proj`` sets how often its first draft is right. The noise for
each target accuracy is found in numpy (``calibrate``), then the models are
written once into the cache.

For every accuracy and ``n_max`` it times greedy generation by specdec (plain and
MTP) and by llama.cpp (``llama-bench`` for plain decoding, ``llama-speculative-simple
--spec-type draft-mtp``), both on 2 threads, and prints a Markdown table of tok/s,
speedups over each side's own plain decoding, and specdec/llama.cpp. Every
specdec MTP output is checked against specdec's plain greedy output, and
llama.cpp's text against it on their common length.

    python -m bench.mtp                      # mid models, n_max 1..4 (wants an idle machine)
    python -m bench.mtp --size tiny --n-gen 64 --n-max 1 2   # quick smoke run
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import specdec
from specdec.benchmark import synthetic

from . import llama_tools
from .llama_tools import ensure_tools, run_bench

ACCURACIES = (0.9, 0.7, 0.5)
N_MAX = (1, 2, 3, 4)
N_GEN = 256
PROMPT = ("The bigram model ignores the meaning of this prompt; it only needs some tokens "
          "to start from, and a few more so that the prompt pass is not trivial. ") * 2


@dataclass
class Row:
    accuracy: float          # the head's first-draft accuracy the model was made for
    method: str              # "plain" or "n_max N"
    specdec_tok_s: float
    llama_tok_s: float
    specdec_acc: float = 0.0
    llama_acc: float = 0.0
    note: str = ""


# the models are shared with ``specdec bench`` (same cache files, same calibration)
_bench_dir = synthetic.bench_dir
_write_once = synthetic.write_once


def calibrate(size: str, targets: Sequence[float] = ACCURACIES, n_samples: int = 512,
              log: Callable[[str], None] = print) -> Dict[float, float]:
    """Noise level giving each target first-draft accuracy (``specdec.benchmark.synthetic``)."""
    return synthetic.calibrate(size, targets, n_samples, log=log)


def models(size: str, noises: Dict[float, float]) -> Dict[float, Path]:
    return synthetic.models(size, noises)


def run_draft_mtp(path, prompt: str, echo: str, n_gen: int, n_max: int, threads: int = 2,
                  tries: int = 3) -> dict:
    """``llama-speculative-simple --spec-type draft-mtp``, greedy.

    Like ``llama_tools.run_spec_simple``, but the generated text is cut after
    ``echo`` (the prompt's token pieces as the tool prints them): the bigram
    models' test vocabulary prints token ids in hex, so the prompt text itself
    is never echoed. llama.cpp's logger runs on a thread it never joins (the
    singleton is leaked on purpose, common/log.cpp), so on a loaded machine the
    tail of the log, timing summary included, can be lost at exit: such a run
    is repeated, up to ``tries`` times.
    """
    import subprocess
    import tempfile

    cmd = [str(llama_tools._tool("llama-speculative-simple")), "-m", str(path),
           "-n", str(n_gen - 1), "-t", str(threads), "--temp", "0", "--log-colors", "off",
           "--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max)]
    for _ in range(tries):
        with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
            f.write(prompt.encode() + b"\n")
            f.flush()
            res = subprocess.run(cmd + ["-f", f.name], capture_output=True)
        llama_tools._check(res, cmd)
        err = res.stderr.decode(errors="replace")
        out = res.stdout.decode(errors="replace")
        dec = llama_tools._RE_DECODED.search(err)
        i = out.find(echo)
        if dec is not None and i >= 0:
            return {"text": out[i + len(echo):].rstrip("\n"), "tok_s": float(dec.group(3)),
                    "n_drafted": llama_tools._stat(err, "n_drafted"),
                    "n_accepted": llama_tools._stat(err, "n_accept")}
    raise RuntimeError(f"llama-speculative-simple: no timing summary in {tries} runs; last "
                       f"stderr:\n{err[-2000:]}")


def _prefix_match(a: str, b: str) -> float:
    n = min(len(a), len(b))
    k = next((i for i in range(n) if a[i] != b[i]), n)
    return k / max(n, 1)


def run(size: str = "mid", accuracies: Sequence[float] = ACCURACIES,
        n_max: Sequence[int] = N_MAX, n_gen: int = N_GEN, reps: int = 1, llama: bool = True,
        log: Callable[[str], None] = print) -> List[Row]:
    """Time everything; ``reps`` repeats each measurement (specdec and llama.cpp in turn)
    and keeps the median."""
    paths = models(size, calibrate(size, accuracies, log=log))
    if llama:
        ensure_tools(("llama-bench", "llama-speculative-simple"))
    rows: List[Row] = []
    for acc, path in paths.items():
        model = specdec.Model(str(path), load_mtp=True)
        plain_dec = specdec.Decoder(model, n_ctx=2048, n_threads=2)
        plain = plain_dec.generate(PROMPT, max_tokens=n_gen)
        echo = b"".join(model.token_to_piece(t, special=True)
                        for t in plain_dec.tokenize(PROMPT)).decode("utf-8", "replace")
        sp = statistics.median([plain.stats.tokens_per_s] + [
            plain_dec.generate(PROMPT, max_tokens=n_gen).stats.tokens_per_s
            for _ in range(reps - 1)])
        lp = 0.0
        if llama:
            lp = run_bench(path, n_gen=n_gen, threads=2, reps=max(reps, 2))["tok_s_mean"]
        rows.append(Row(acc, "plain", sp, lp))
        log(f"accuracy {acc:.0%}: plain specdec {sp:.1f} tok/s, llama.cpp {lp:.1f} tok/s")
        for n in n_max:
            dec = specdec.Decoder(model, drafter="mtp", n_max=n, n_ctx=2048, n_threads=2)
            mine, theirs = [], []
            for _ in range(reps):   # alternate, so that drift hits both sides alike
                mine.append(dec.generate(PROMPT, max_tokens=n_gen))
                if llama:
                    theirs.append(run_draft_mtp(path, PROMPT, echo, n_gen, n, threads=2))
            if any(x.tokens != plain.tokens for x in mine):
                raise AssertionError(f"specdec MTP n_max {n} differs from plain greedy output")
            row = Row(acc, f"n_max {n}", statistics.median(x.stats.tokens_per_s for x in mine),
                      0.0, mine[0].stats.acceptance_rate)
            if llama:
                row.llama_tok_s = statistics.median(o["tok_s"] for o in theirs)
                row.llama_acc = theirs[0]["n_accepted"] / max(theirs[0]["n_drafted"], 1)
                m = _prefix_match(theirs[0]["text"], plain.text)
                if m < 1.0:
                    row.note = f"llama.cpp text matches {m:.0%}"
            rows.append(row)
            log(f"  n_max {n}: specdec {row.specdec_tok_s:.1f} tok/s (acc {row.specdec_acc:.0%}), "
                f"llama.cpp {row.llama_tok_s:.1f} tok/s (acc {row.llama_acc:.0%}) {row.note}")
    return rows


def table(rows: List[Row]) -> str:
    """Markdown: tok/s, speedup over each side's plain decoding, and specdec over llama.cpp."""
    plain = {r.accuracy: r for r in rows if r.method == "plain"}
    out = ["| head accuracy | method | specdec tok/s | speedup | acceptance | "
           "llama.cpp tok/s | speedup | acceptance | specdec / llama.cpp |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = plain[r.accuracy]
        s_sp = r.specdec_tok_s / p.specdec_tok_s if p.specdec_tok_s else 0.0
        l_sp = r.llama_tok_s / p.llama_tok_s if p.llama_tok_s else 0.0
        ratio = f"{r.specdec_tok_s / r.llama_tok_s:.2f}x" if r.llama_tok_s else ""
        acc = lambda a: "" if r.method == "plain" else f"{a:.0%}"   # noqa: E731
        note = f" ({r.note})" if r.note else ""
        out.append(f"| {r.accuracy:.0%} | {r.method}{note} | {r.specdec_tok_s:.1f} | {s_sp:.2f}x | "
                   f"{acc(r.specdec_acc)} | {r.llama_tok_s:.1f} | {l_sp:.2f}x | "
                   f"{acc(r.llama_acc)} | {ratio} |")
    return "\n".join(out)


def _load() -> float:
    return os.getloadavg()[0]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="mid", choices=("tiny", "mid"))
    ap.add_argument("--n-gen", type=int, default=N_GEN)
    ap.add_argument("--n-max", type=int, nargs="+", default=list(N_MAX))
    ap.add_argument("--accuracy", type=float, nargs="+", default=list(ACCURACIES))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-llama", action="store_true", help="specdec only (no reference build)")
    ap.add_argument("--force", action="store_true", help="measure even when the machine is busy")
    args = ap.parse_args(argv)
    if _load() >= 1.0 and not args.force:
        print(f"load average {_load():.2f} >= 1: timings would be meaningless "
              "(--force runs anyway)", file=sys.stderr)
        return 2
    rows = run(args.size, args.accuracy, args.n_max, args.n_gen, args.reps, not args.no_llama,
               log=lambda s: print(s, file=sys.stderr))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
