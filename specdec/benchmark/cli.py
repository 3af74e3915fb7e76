"""``specdec bench``: run a matrix, write results JSON, Markdown and plots, and gate
against a baseline.

Exit statuses, one meaning each (``EXIT_*``; the help and the README list them): a CI job
must tell a regression from a run that could not judge and from a mistyped command.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Dict, NoReturn, Optional

from . import compare as gate, machine

EXIT_OK = 0            # measured (and gated): within the tolerance, every exact check passed
EXIT_REGRESSION = 1    # a tracked ratio below its floor, or a specdec method's output wrong
EXIT_CANNOT_JUDGE = 2  # the gate could not judge: nothing comparable, another machine class
                       # or matrix, no device for --gpu
EXIT_BAD_INPUT = 3     # bad usage or input: unknown option or case, missing or malformed file
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (SIGINT); the partial results.json is kept

EXIT_CODES = f"""exit status:
  {EXIT_OK}    within the tolerance (with --compare), and every exact-mode check passed
  {EXIT_REGRESSION}    a regression: a tracked ratio fell below its floor, or a specdec
       method's exact-mode output differs from plain greedy output
  {EXIT_CANNOT_JUDGE}    the gate could not judge: no tracked ratio of the baseline was measured,
       or the baseline is of another machine class or matrix; --gpu without a GPU
  {EXIT_BAD_INPUT}    bad usage or input (unknown option or case, missing or malformed results
       or baseline file, a one-round baseline); a one-line message, nothing measured
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); results.json holds what was measured

results.json is rewritten (atomically) as rows are measured: a run killed at any point
leaves one that --results reports and --compare gates, listing what was not measured."""


class BadUsage(Exception):
    """Bad usage or input: one line on stderr, exit ``EXIT_BAD_INPUT``."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits with ``EXIT_BAD_INPUT`` (argparse's own 2 is the
    gate's "could not judge" here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    from .matrix import QUICK_MINUTES

    p = _Parser(
        prog="specdec bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Side-by-side benchmark: writes results.json, report.md and PNG plots, "
                    "prints the report, and with --compare fails when a tracked ratio drops "
                    "below a baseline by more than its tolerance (from the baseline's spread).",
        epilog=EXIT_CODES)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ci", dest="matrix", action="store_const", const="ci",
                   help="the CI tier: the ratios that matter most (plain vs llama-bench, best "
                   "drafters vs plain and vs llama.cpp, MTP, the 0.97 floor), sized for about 3 "
                   "minutes on 2 idle cores with peers built")
    g.add_argument("--quick", dest="matrix", action="store_const", const="quick",
                   help=f"the quick matrix (default; about {QUICK_MINUTES} minutes on 2 cores "
                   "with peers built)")
    g.add_argument("--full", dest="matrix", action="store_const", const="full",
                   help="the whole matrix (every prompt, drafter, n_max, model)")
    g.add_argument("--matrix", choices=("ci", "quick", "full", "tiny"), help=argparse.SUPPRESS)
    d = p.add_argument_group("on a GPU")
    d.add_argument("--gpu", action="store_true",
                   help="every layer of every model on the device on both sides (specdec's "
                   "n_gpu_layers, llama.cpp's -ngl): MTP on a ~1.4B synthetic model at 90/70/50%% "
                   "(n_max up to 8, adaptive) and the mid one, plain against llama-bench and "
                   "llama-simple; then an Engine's MTP drafting at 1, 4, 8 and 16 slots against "
                   "its plain decoding and llama-server's draft-mtp (the ~1.4B model), and the "
                   "serve bench (gemma3-270m) at concurrency 1, 4, 8 and 16 (--gpu --quick: the "
                   "large model only, the Engine at 90%%, serving at concurrency 1 and 16); "
                   "peers built with specdec's backend; exit 2 without a GPU")
    d.add_argument("--n-gpu-layers", "-ngl", type=int, metavar="N",
                   help="with --gpu: layers on the device on both sides (default -1: all)")
    d.add_argument("--rpc-standin", action="store_true",
                   help="with --gpu: a local specdec rpc-server per side stands in for the "
                   "device (tests the plumbing on a CPU; no serve step)")
    d.add_argument("--no-serve", action="store_true", help="with --gpu: skip the serve step (it needs gemma3-270m, "
                   "from PyPI once)")
    p.add_argument("--list", action="store_true", help="list the matrix's cases (all matrices "
                   "without --ci/--quick/--full), their methods and ratios, and exit")
    p.add_argument("--case", action="append", help="only cases whose name starts with this "
                   "(repeatable), e.g. gemma3-270m, mtp-mid-90; 'serve' alone: specdec serve "
                   "against llama-server at concurrency 1, 4 and 8; 'engine-mtp' alone: an "
                   "Engine's MTP drafting at 4 and 8 slots against its plain decoding and "
                   "llama-server's draft-mtp; 'structured': JSON-schema decoding served at "
                   "concurrency 1 and 4 against llama-server; 'rpc': every layer on two local "
                   "RPC servers behind a 2 ms delay (these two in --full, not in --quick)")
    p.add_argument("--prompt-file", action="append", metavar="[CATEGORY=]PATH",
                   help="measure the gemma3-270m case on this file's text instead of the bench's "
                   "prompts (repeatable; your own workload, or prompts the suite never saw), in "
                   "CATEGORY (default 'custom'), which gets its own best specdec / best llama.cpp "
                   "ratio; the matrix's other cases are left out")
    p.add_argument("--reps", type=int, help="alternating rounds per measurement (default: the "
                   "matrix's; a baseline needs at least 2)")
    p.add_argument("--n-gen", type=int, help="tokens per generation in every case (default: the matrix's)")
    p.add_argument("--out", "-o", help="output directory (default ./specdec-bench/<matrix>-<time>)")
    p.add_argument("--compare", metavar="BASELINE.json", help="exit 1 when a tracked ratio drops "
                   "below this baseline by more than its tolerance")
    p.add_argument("--margin", type=float, default=None,
                   help="one fixed tolerance for every ratio, a fraction (default: "
                   f"{gate.SPREAD_FACTOR:g} x the baseline's spread of that ratio, within "
                   f"{gate.MIN_TOLERANCE:g}-{gate.MAX_TOLERANCE:g}; {gate.DEFAULT_MARGIN:g} for "
                   "a ratio without a spread)")
    p.add_argument("--results", metavar="RESULTS.json", action="append",
                   help="do not measure: report (and --compare) an earlier run's results, "
                   "complete or partial; given several times (complete runs of one matrix "
                   "and machine), their merge: each ratio's median over the runs, its spread "
                   "counting how far the runs differ (a baseline from several runs, with "
                   "--save-baseline)")
    p.add_argument("--save-baseline", metavar="PATH", help="also write the tracked ratios and "
                   "their spreads as a baseline (refused from one round or a partial run)")
    p.add_argument("--no-peers", action="store_true", help="specdec only")
    p.add_argument("--no-build", action="store_true",
                   help="do not build missing peers (their rows say why they did not run)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--threads", "-t", type=int, default=2)
    p.add_argument("--concurrency", type=int, action="append", metavar="N",
                   help="--case serve: a concurrency to measure (repeatable; default 1, 4 and 8)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or lines")
    return p


def main(argv: Sequence[str]) -> int:
    """``specdec bench ARGS`` (``specdec.cli`` hands the arguments over unparsed)."""
    from .._progress import set_quiet

    args = parser().parse_args(argv)
    set_quiet(args.quiet)
    try:
        return run(args)
    except BadUsage as e:
        print(f"specdec bench: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _serve(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    from . import serve

    out = Path(args.out) if args.out else Path("specdec-bench") / (
        f"serve-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    results = serve.run(out, n_gen=args.n_gen or 64, reps=args.reps or 2, threads=args.threads,
                        concurrency=tuple(args.concurrency or serve.CONCURRENCY), log=log)
    md = serve.markdown(results)
    (out / "serve.md").write_text(md)
    print(md)
    log(f"wrote {out / 'serve.json'} and {out / 'serve.md'}")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    from . import listing, matrix as mx

    names = [_matrix_name(args)] if args.matrix or args.gpu else list(mx.MATRICES)
    for name in names:
        m = mx.tiny() if name == "tiny" else mx.get(name)
        try:
            print(listing.describe(mx.select(m, args.case)) + "\n")
        except mx.UnknownCase as e:
            raise BadUsage(str(e)) from None
    print(listing.serve_line())
    return EXIT_OK


def _check_usage(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """Everything that can be wrong with the command, found before minutes of measuring;
    returns the loaded baseline (or None)."""
    from . import report

    if args.reps is not None and args.reps < 1:
        raise BadUsage(f"--reps must be at least 1, got {args.reps}")
    if args.n_gen is not None and args.n_gen < 1:
        raise BadUsage(f"--n-gen must be at least 1, got {args.n_gen}")
    if args.threads < 1:
        # the library's own check came minutes into the run, an exception specdec's main
        # answered with 1, which says a regression to a CI job
        raise BadUsage(f"--threads must be at least 1, got {args.threads}")
    if args.concurrency and min(args.concurrency) < 1:
        raise BadUsage(f"--concurrency must be at least 1, got {min(args.concurrency)}")
    if args.margin is not None and not 0 <= args.margin < 1:
        raise BadUsage(f"--margin must be a fraction in [0, 1), got {args.margin}")
    if (args.n_gpu_layers is not None or args.rpc_standin or args.no_serve) and not args.gpu:
        raise BadUsage("--n-gpu-layers, --rpc-standin and --no-serve go with --gpu")
    if args.gpu and args.matrix in ("ci", "tiny"):
        raise BadUsage(f"--gpu has a matrix of its own (--gpu, --gpu --quick), not "
                       f"--{args.matrix}")
    if args.gpu and args.n_gpu_layers == 0:
        raise BadUsage("--gpu --n-gpu-layers 0 puts nothing on the device: drop --gpu")
    if args.save_baseline and args.reps == 1:
        raise BadUsage("--save-baseline needs at least 2 rounds (--reps 1 records no spread, "
                       "and the gate's tolerance is made of the baseline's spread)")
    if not args.compare:
        return None
    try:
        base = report.load_json(args.compare)
    except report.BadInput as e:
        raise BadUsage(str(e)) from None
    ratios = base.get("ratios")
    if not isinstance(ratios, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("value"), (int, float))
            for v in ratios.values()):
        raise BadUsage(f"{args.compare}: not a baseline (no 'ratios' of numeric 'value's)")
    return base


def _baseline(results: Dict[str, Any], path: str, log: Callable[[str], None]) -> None:
    from . import report

    if not report.progress_of(results)["complete"]:
        raise BadUsage("refusing to save a baseline from a partial run (it stopped before "
                       "every case was measured)")
    tracked = {k: v for k, v in results["ratios"].items() if v["tracked"]}
    lone = [k for k, v in tracked.items() if v.get("spread") is None]
    if lone:
        raise BadUsage(f"refusing to save a baseline: {len(lone)} tracked ratio(s) have no "
                       f"spread (one round; e.g. {lone[0]!r}); measure with --reps 2 or more")
    report.save_json(report.baseline_of(results), path)
    log(f"wrote baseline {path}")


def _gate(results: Dict[str, Any], base: Dict[str, Any], args: argparse.Namespace) -> int:
    """Print the gate's table and verdict; its exit status."""
    print(f"## Regression gate against {args.compare}\n")
    why = gate.why_not_comparable(results, base)
    if why:
        print(f"gate: cannot judge: {why}")
        return EXIT_CANNOT_JUDGE
    checks = gate.compare(results, base, args.margin)
    print(gate.table(checks) + "\n")
    print(gate.summary(checks))
    missing = gate.missing_cases(checks)
    if missing:
        print(f"not measured in this run (no judgement on them): {', '.join(missing)}")
    if gate.failed(checks):
        return EXIT_REGRESSION
    if not any(c.status == "ok" for c in checks):
        return EXIT_CANNOT_JUDGE   # nothing comparable: must not pass silently
    return EXIT_OK


def _measure(args: argparse.Namespace, out: Path, log: Callable[[str], None]) -> Dict[str, Any]:
    from . import matrix as mx, report
    from .runner import Runner

    name = _matrix_name(args)
    try:
        m = mx.select(mx.tiny() if name == "tiny" else mx.get(name), args.case)
    except mx.UnknownCase as e:
        raise BadUsage(str(e)) from None
    if args.prompt_file:
        try:
            m = mx.with_prompts(m, _prompts_from(args.prompt_file))
        except mx.UnknownCase as e:
            raise BadUsage(str(e)) from None
    if args.reps or args.n_gen:
        m = mx.override(m, reps=args.reps, n_gen=args.n_gen)
    if m.expected_minutes and not (args.case or args.reps or args.n_gen or args.prompt_file):
        log(f"{m.name} matrix: expected about {m.expected_minutes:g} minutes on 2 cores with "
            f"peers built (building them first takes about 10 more, once)")
    path = out / "results.json"

    def checkpoint(res: Dict[str, Any]) -> None:
        report.save_json(report.finalize(res), path)

    runner = Runner(m, peers_enabled=not args.no_peers, build_peers=not args.no_build,
                    threads=args.threads, log=log, checkpoint=checkpoint,
                    n_gpu_layers=_n_gpu_layers(args), device_rpc=args.rpc_standin)
    return report.finalize(runner.run())


def _prompts_from(specs: Sequence[str]) -> tuple:
    """``--prompt-file [CATEGORY=]PATH`` values as prompts named after their files."""
    from .prompts import Prompt

    out = []
    for spec in specs:
        cat, sep, path = spec.partition("=")
        if not sep or "/" in cat or not cat:
            cat, path = "custom", spec
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise BadUsage(f"--prompt-file {spec}: {e}") from None
        if not text.strip():
            raise BadUsage(f"--prompt-file {spec}: the file is empty")
        name = Path(path).stem
        if any(p.name == name for p in out):
            name = f"{name}-{len(out)}"
        out.append(Prompt(name, cat, text))
    return tuple(out)


def _matrix_name(args: argparse.Namespace) -> str:
    if args.gpu:
        return "gpu-quick" if args.matrix == "quick" else "gpu"
    for own in ("structured", "rpc"):     # matrices of their own: not part of --quick
        if args.matrix is None and args.case and all(c.startswith(own) for c in args.case):
            return own
    return args.matrix or "quick"


def _n_gpu_layers(args: argparse.Namespace) -> int:
    if not args.gpu:
        return 0
    return -1 if args.n_gpu_layers is None else args.n_gpu_layers


def _gpu_serve(args: argparse.Namespace, out: Path, log: Callable[[str], None]) -> None:
    """``--gpu``'s serve step: specdec serve against llama-server, every layer on the device,
    at concurrency 1, 4, 8 and 16 (1 and 16 with --quick); written beside the matrix's
    report, not gated (the serve bench has no baseline)."""
    from . import serve
    from ..models import ModelNotAvailable

    conc = tuple(args.concurrency or ((1, 16) if args.matrix == "quick" else
                                      serve.GPU_CONCURRENCY))
    try:
        results = serve.run(out / "serve", n_gen=args.n_gen or 64, reps=args.reps or 2,
                            threads=args.threads, concurrency=conc, log=log,
                            n_gpu_layers=_n_gpu_layers(args))
    except ModelNotAvailable as e:
        log(f"serve step skipped: {e}")
        return
    md = serve.markdown(results)
    (out / "serve" / "serve.md").write_text(md)
    print(md)


def _engine_mtp(args: argparse.Namespace, log: Callable[[str], None],
                out: Optional[Path] = None) -> int:
    """``--case engine-mtp``, and ``--gpu``'s Engine step: an Engine's MTP drafting under
    concurrency against its plain decoding and llama-server's draft-mtp. With ``--gpu``
    every layer is on the device on both sides, on the ~1.4B size at 1, 4, 8 and 16 slots
    (``--quick``: at 90% only)."""
    from . import engine_mtp as em

    out = out or (Path(args.out) if args.out else Path("specdec-bench") / (
        f"engine-mtp-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"))
    kw: Dict[str, Any] = {}
    if args.gpu:
        kw = dict(size=em.GPU_SIZE, slots=em.GPU_SLOTS, n_gpu_layers=_n_gpu_layers(args),
                  accuracies=(0.9,) if args.matrix == "quick" else em.ACCURACIES)
    results = em.run(out, n_gen=args.n_gen or (em.GPU_N_GEN if args.gpu else 48),
                     reps=args.reps or 3, threads=args.threads, peers=not args.no_peers,
                     log=log, **kw)
    md = em.markdown(results)
    (out / "engine-mtp.md").write_text(md)
    print(md)
    log(f"wrote {out / 'engine-mtp.json'} and {out / 'engine-mtp.md'}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    from . import baseline_runs, report, report_md

    from tqdm import tqdm

    # tqdm.write keeps the progress bar (a terminal only) below the log lines
    log = (lambda s: None) if args.quiet else (lambda s: tqdm.write(s, file=sys.stderr))
    if args.list:
        return _list(args)
    warning = machine.timing_warning()
    if warning and not args.results:
        print(f"specdec bench: warning: {warning}", file=sys.stderr)
    base = _check_usage(args)     # --case serve's --reps, --threads, ... too
    if args.case == ["serve"]:
        return _serve(args, log)
    if args.gpu and not args.rpc_standin and not args.results:
        from .gpu import why_no_device
        why = why_no_device()
        if why:
            print(f"specdec bench --gpu: no GPU to measure on: {why}; nothing measured",
                  file=sys.stderr)
            return EXIT_CANNOT_JUDGE
    if args.case == ["engine-mtp"]:
        return _engine_mtp(args, log)
    if args.results:
        try:
            runs = [report.load_results(r) for r in args.results]
            results = runs[0] if len(runs) == 1 else baseline_runs.merge(runs, args.results)
        except report.BadInput as e:
            raise BadUsage(str(e)) from None
        out = (Path(args.out) if args.out else Path(args.results[0]).parent if len(runs) == 1
               else Path("specdec-bench") / f"merged-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    else:
        out = Path(args.out) if args.out else Path("specdec-bench") / (
            f"{_matrix_name(args)}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
        try:
            results = _measure(args, out, log)
        except KeyboardInterrupt:
            print(f"specdec bench: interrupted; the rows measured so far are in "
                  f"{out / 'results.json'}", file=sys.stderr)
            return EXIT_INTERRUPTED
    report.save_json(results, out / "results.json")
    md = report_md.markdown(results)
    (out / "report.md").write_text(md)
    print(md)
    if not args.no_plots and results["rows"]:
        from . import plots
        for path in plots.write_all(results, out):
            log(f"wrote {path}")
    if args.save_baseline:
        _baseline(results, args.save_baseline, log)
    log(f"wrote {out / 'results.json'} and {out / 'report.md'}")
    if args.gpu and not args.results and not args.rpc_standin and not args.case:
        _engine_mtp(args, log, out / "engine-mtp")
        if not args.no_serve:
            _gpu_serve(args, out, log)
    rc = EXIT_REGRESSION if results["failures"] else EXIT_OK
    if base is not None:
        judged = _gate(results, base, args)
        rc = EXIT_REGRESSION if EXIT_REGRESSION in (rc, judged) else judged
    return rc
