"""The benchmark matrix as a pytest-benchmark suite: one test per case (model) of the
quick matrix (``SPECDEC_BENCH_MATRIX=full`` for the full one), peers included.

Each test runs its case once through ``specdec.benchmark`` (alternating rounds,
medians), prints the Markdown table, stores every ratio in the benchmark's
``extra_info`` (so ``--benchmark-json`` keeps them) and fails when a specdec method's
exact-mode output differs from plain greedy output or a specdec method did not run.
``specdec bench`` runs the same matrix in one command with plots and the gate.
"""
import os
from dataclasses import replace

import pytest

from specdec.benchmark import matrix, report, report_md
from specdec.benchmark.runner import Runner, rows_of

MATRIX = matrix.get(os.environ.get("SPECDEC_BENCH_MATRIX", "quick"))


@pytest.mark.peer
@pytest.mark.parametrize("case", MATRIX.cases, ids=lambda c: c.name)
def test_case(benchmark, case):
    one = replace(MATRIX, cases=(case,))     # the matrix's settings, this case alone
    res = benchmark.pedantic(lambda: report.finalize(Runner(one, log=print).run()),
                             rounds=1, iterations=1)
    benchmark.extra_info["ratios"] = {k: v["value"] for k, v in res["ratios"].items()}
    benchmark.extra_info["machine"] = res["machine"]
    print("\n" + report_md.markdown(res))
    assert not res["failures"], res["failures"]
    broken = [f"{r.method} / {r.prompt}: {r.note}" for r in rows_of(res)
              if r.side == "specdec" and r.status != "ok"]
    assert not broken, broken
