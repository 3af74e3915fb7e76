"""The CI tier (``specdec bench --ci``) as a pytest-benchmark test: the same matrix, the same
runner, the same gate, against this machine class's CI baseline when there is one
(``bench/baselines/ci-<machine class>.json``).

It fails on what ``specdec bench --ci --compare`` exits 1 for: a tracked ratio below its
floor (the tolerance made of the baseline's spread) or a wrong exact-mode output. Without a
baseline for this machine class it measures and records, and says the gate did not judge.
"""
from pathlib import Path

import pytest

from specdec.benchmark import compare, machine, matrix, report, report_md
from specdec.benchmark.runner import Runner

BASELINES = Path(__file__).resolve().parent / "baselines"


@pytest.mark.peer
def test_ci_tier(benchmark, tmp_path):
    m = matrix.ci()
    path = tmp_path / "results.json"
    res = benchmark.pedantic(
        lambda: report.finalize(Runner(m, log=print, checkpoint=lambda r: report.save_json(
            report.finalize(r), path)).run()), rounds=1, iterations=1)
    benchmark.extra_info["ratios"] = {k: v["value"] for k, v in res["ratios"].items()}
    benchmark.extra_info["spread"] = {k: v["spread"] for k, v in res["ratios"].items()}
    benchmark.extra_info["machine"] = res["machine"]
    print("\n" + report_md.markdown(res))
    assert not res["failures"], res["failures"]
    base_path = BASELINES / f"ci-{machine.machine_class()}.json"
    if not base_path.exists():
        pytest.skip(f"measured; no CI baseline for this machine class ({base_path.name})")
    base = report.load_json(base_path)
    why = compare.why_not_comparable(res, base)
    assert why is None, why
    checks = compare.compare(res, base)
    print(compare.table(checks) + "\n" + compare.summary(checks))
    assert not compare.failed(checks), compare.summary(checks)
