"""``specdec bench``: run a matrix, write results JSON, Markdown and plots, and gate
against a baseline."""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import compare as gate, machine


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specdec bench",
        description="Side-by-side benchmark: writes results.json, report.md and PNG plots, "
                    "prints the report, and with --compare fails when a tracked ratio drops "
                    "below a baseline.")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", dest="matrix", action="store_const", const="quick",
                   help="the quick matrix (default; under 10 minutes on 2 cores)")
    g.add_argument("--full", dest="matrix", action="store_const", const="full",
                   help="the whole matrix (every prompt, drafter, n_max, model)")
    g.add_argument("--matrix", choices=("quick", "full", "tiny"), help=argparse.SUPPRESS)
    p.add_argument("--case", action="append", help="only cases whose name starts with this "
                   "(repeatable), e.g. gemma3-270m, mtp-mid-90; 'serve' alone: specdec serve "
                   "against llama-server at concurrency 1, 4 and 8")
    p.add_argument("--reps", type=int, help="alternating rounds per measurement (default: the matrix's)")
    p.add_argument("--n-gen", type=int, help="tokens per generation in every case (default: the matrix's)")
    p.add_argument("--out", "-o", help="output directory (default ./specdec-bench/<matrix>-<time>)")
    p.add_argument("--compare", metavar="BASELINE.json", help="fail (exit 1) when a tracked ratio "
                   "drops more than --margin below this baseline")
    p.add_argument("--margin", type=float, default=gate.DEFAULT_MARGIN,
                   help=f"allowed drop below a baseline ratio, as a fraction (default {gate.DEFAULT_MARGIN})")
    p.add_argument("--results", metavar="RESULTS.json",
                   help="do not measure: report (and --compare) an earlier run's results")
    p.add_argument("--save-baseline", metavar="PATH", help="also write the tracked ratios as a baseline")
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
    return run(args)


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
    return 0


def run(args: argparse.Namespace) -> int:
    from . import matrix as mx, report

    from tqdm import tqdm

    # tqdm.write keeps the progress bar (a terminal only) below the log lines
    log = (lambda s: None) if args.quiet else (lambda s: tqdm.write(s, file=sys.stderr))
    name = args.matrix or "quick"
    warning = machine.timing_warning()
    if warning and not args.results:
        print(f"specdec bench: warning: {warning}", file=sys.stderr)
    if args.case == ["serve"]:
        return _serve(args, log)
    if args.results:
        results = report.finalize(report.load_json(args.results))
        out = Path(args.out) if args.out else Path(args.results).parent
    else:
        from .runner import Runner

        m = mx.select(mx.tiny() if name == "tiny" else mx.get(name), args.case)
        if args.reps or args.n_gen:
            m = mx.override(m, reps=args.reps, n_gen=args.n_gen)
        out = Path(args.out) if args.out else Path("specdec-bench") / (
            f"{m.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
        results = report.finalize(Runner(m, peers_enabled=not args.no_peers,
                                         build_peers=not args.no_build, threads=args.threads,
                                         log=log).run())
    report.save_json(results, out / "results.json")
    md = report.markdown(results)
    (out / "report.md").write_text(md)
    print(md)
    if not args.no_plots:
        from . import plots
        for path in plots.write_all(results, out):
            log(f"wrote {path}")
    if args.save_baseline:
        report.save_json(report.baseline_of(results), args.save_baseline)
        log(f"wrote baseline {args.save_baseline}")
    log(f"wrote {out / 'results.json'} and {out / 'report.md'}")
    rc = 1 if results["failures"] else 0
    if args.compare:
        checks = gate.compare(results, report.load_json(args.compare), args.margin)
        print(f"## Regression gate against {args.compare} (margin {args.margin:.0%})\n")
        print(gate.table(checks) + "\n")
        print(gate.summary(checks))
        if gate.failed(checks):
            rc = 1
        elif not any(c.status == "ok" for c in checks):
            rc = 2      # nothing comparable: the gate says nothing, which must not pass silently
    return rc
