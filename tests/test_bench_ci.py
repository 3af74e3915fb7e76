"""``specdec bench`` as a CI job runs it: the CI tier, exit codes with one meaning each,
results that survive a kill, the spread-based gate, ``--list``.

Measuring runs use the tiny bigram model without peers, so they take seconds.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from specdec.benchmark import cli as bench_cli, compare, matrix, report
from specdec.benchmark.runner import INJECT_ENV, Runner
from specdec.cli import main


@pytest.fixture(scope="module")
def bench_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_CACHE_DIR", str(tmp_path_factory.mktemp("bench-cache")))
    mp.delenv(INJECT_ENV, raising=False)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def tiny(bench_cache, tmp_path_factory):
    """A complete tiny run (2 rounds), saved; and its baseline."""
    m = matrix.tiny(n_gen=24, reps=2, peers=False)
    res = report.finalize(Runner(m, peers_enabled=False, log=lambda s: None).run())
    d = tmp_path_factory.mktemp("tiny")
    return {"results": res, "path": report.save_json(res, d / "run" / "results.json"),
            "baseline": report.save_json(report.baseline_of(res), d / "base.json")}


def _bench(*args) -> int:
    return main(["bench", "--no-plots", "-q", *map(str, args)])


# --- exit 0, 1 and 2: the gate -----------------------------------------------------------

def test_exit_0_within_the_tolerance(tiny, capsys):
    assert _bench("--results", tiny["path"], "--compare", tiny["baseline"]) == 0
    out = capsys.readouterr().out
    assert "gate: ok" in out and "| tolerance |" in out


def test_exit_1_a_ratio_below_its_floor(tiny, tmp_path, capsys):
    base = report.load_json(tiny["baseline"])
    for v in base["ratios"].values():
        v["value"] *= 3      # beyond the widest tolerance (MAX_TOLERANCE), whatever the spread
    assert _bench("--results", tiny["path"], "--compare",
                  report.save_json(base, tmp_path / "hi.json")) == 1
    assert "gate: FAIL" in capsys.readouterr().out


def test_exit_1_a_wrong_exact_mode_output(tiny, tmp_path, capsys):
    broken = json.loads(json.dumps(tiny["results"]))
    for r in broken["rows"]:
        if r["method"] == "specdec mtp n2":
            r["check"] = "FAIL"
    path = report.save_json(broken, tmp_path / "r" / "results.json")
    assert _bench("--results", path) == 1
    # and with a baseline it passes otherwise: still a regression
    assert _bench("--results", path, "--compare", tiny["baseline"]) == 1


def test_exit_2_nothing_comparable(tiny, tmp_path, capsys):
    other = {"ratios": {"another case: x / y": {"value": 1.0, "tracked": True}}}
    assert _bench("--results", tiny["path"], "--compare",
                  report.save_json(other, tmp_path / "other.json")) == 2
    assert "cannot judge" in capsys.readouterr().out


def test_exit_2_another_machine_class(tiny, tmp_path, capsys):
    base = report.load_json(tiny["baseline"])
    base["machine"]["class"] = "some-other-cpu-64c"
    assert _bench("--results", tiny["path"], "--compare",
                  report.save_json(base, tmp_path / "b.json")) == 2
    assert "machine class 'some-other-cpu-64c'" in capsys.readouterr().out


def test_exit_2_another_matrix(tiny, tmp_path, capsys):
    base = report.load_json(tiny["baseline"])
    base["matrix"] = "quick"
    assert _bench("--results", tiny["path"], "--compare",
                  report.save_json(base, tmp_path / "b.json")) == 2
    assert "'quick' matrix" in capsys.readouterr().out


# --- exit 3: bad usage or input, one line, no traceback ----------------------------------

def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err)
    last = err[-1]
    assert last.startswith("specdec bench: error: "), err
    for n in needles:
        assert n in last, last


def test_exit_3_missing_results_file(tmp_path, capsys):
    assert _bench("--results", tmp_path / "nope.json") == 3
    _one_line_error(capsys, "nope.json: no such file")


def test_exit_3_results_file_not_json(tmp_path, capsys):
    (tmp_path / "r.json").write_text("{not json")
    assert _bench("--results", tmp_path / "r.json") == 3
    _one_line_error(capsys, "not JSON")


def test_exit_3_results_file_without_rows(tmp_path, capsys):
    (tmp_path / "r.json").write_text(json.dumps({"ratios": {}}))
    assert _bench("--results", tmp_path / "r.json") == 3
    _one_line_error(capsys, "not a results file", "rows")


def test_exit_3_malformed_rows(tiny, tmp_path, capsys):
    bad = json.loads(json.dumps(tiny["results"]))
    bad["rows"][0] = {"case": "x"}
    path = report.save_json(bad, tmp_path / "r.json")
    assert _bench("--results", path) == 3
    _one_line_error(capsys, "malformed results")


def test_exit_3_missing_or_malformed_baseline(tiny, tmp_path, capsys):
    assert _bench("--results", tiny["path"], "--compare", tmp_path / "none.json") == 3
    _one_line_error(capsys, "none.json: no such file")
    (tmp_path / "b.json").write_text(json.dumps({"ratios": {"a": {"value": "fast"}}}))
    assert _bench("--results", tiny["path"], "--compare", tmp_path / "b.json") == 3
    _one_line_error(capsys, "not a baseline")


def test_exit_3_unknown_case_lists_the_valid_ones(capsys):
    assert _bench("--ci", "--case", "nosuchcase") == 3
    _one_line_error(capsys, "'nosuchcase'", "gemma3-270m", "mtp-mid-90")
    assert _bench("--list", "--quick", "--case", "nosuchcase") == 3


def test_exit_3_unknown_option_is_not_the_gates_2(capsys):
    # argparse exits itself (SystemExit, as a shell sees it): with 3, not its own 2
    for argv in (["--no-such-option"], ["--reps", "many"]):
        with pytest.raises(SystemExit) as e:
            _bench(*argv)
        assert e.value.code == 3
    err = capsys.readouterr().err
    assert "unrecognized arguments: --no-such-option" in err and "Traceback" not in err
    assert "argument --reps: invalid int value: 'many'" in err


@pytest.mark.parametrize("argv, needle", [
    (["--ci", "--threads", "0"], "--threads must be at least 1, got 0"),
    (["--case", "serve", "--concurrency", "4", "--concurrency", "0"],
     "--concurrency must be at least 1, got 0"),
])
def test_exit_3_bad_threads_or_concurrency_not_a_regression(argv, needle, capsys):
    # refused before measuring anything: the library's own errors came minutes into the
    # run as 1, a regression to a CI job
    assert _bench(*argv) == 3
    _one_line_error(capsys, needle)


def test_exit_3_a_baseline_from_one_round(tiny, tmp_path, capsys):
    # refused before measuring anything
    assert _bench("--matrix", "tiny", "--reps", "1", "--save-baseline", tmp_path / "b.json") == 3
    _one_line_error(capsys, "at least 2 rounds")
    assert not (tmp_path / "b.json").exists()
    # and from an earlier one-round run's results
    one = json.loads(json.dumps(tiny["results"]))
    for r in one["rows"]:
        r["tok_s_runs"] = r["tok_s_runs"][:1]
    path = report.save_json(one, tmp_path / "one" / "results.json")
    assert _bench("--results", path, "--save-baseline", tmp_path / "b.json") == 3
    _one_line_error(capsys, "no spread")
    assert not (tmp_path / "b.json").exists()


def _scaled(results, method, factor):
    """``results`` whose rounds agree (each row's rounds at its median), with ``method``'s
    speed times ``factor``: another run, as it were."""
    other = json.loads(json.dumps(results))
    for r in other["rows"]:
        if r.get("tok_s_runs"):
            r["tok_s_runs"] = [r["tok_s"]] * len(r["tok_s_runs"])
        if r["method"] == method:
            r["tok_s"] *= factor
            r["tok_s_runs"] = [t * factor for t in r["tok_s_runs"]]
    return other


def test_a_baseline_from_several_runs_takes_their_median_and_their_spread(tiny, tmp_path):
    # three runs of which the mtp method's speed moves by +-20%: the merged baseline holds
    # each ratio at the runs' median, with a spread no smaller than the runs' differences
    paths = [report.save_json(_scaled(tiny["results"], "specdec mtp n2", f),
                              tmp_path / f"r{i}" / "results.json")
             for i, f in enumerate((1.0, 1.2, 0.8))]
    base = tmp_path / "merged.json"
    out = tmp_path / "merged-report"
    assert _bench(*[a for p in paths for a in ("--results", p)], "--out", out,
                  "--save-baseline", base) == 0
    merged = report.load_json(base)
    runs = [report.load_results(p) for p in paths]
    moved = [k for k, v in runs[0]["ratios"].items() if v["tracked"]
             and runs[1]["ratios"][k]["value"] != v["value"]]
    assert moved
    for key, r in merged["ratios"].items():
        values = [run["ratios"][key]["value"] for run in runs]
        assert r["value"] == pytest.approx(sorted(values)[1]) and r["run_values"] == values
        if key in moved:      # the runs' +-20% shows in the spread, their rounds agreeing
            assert r["spread"] > 0.1 > max(run["ratios"][key]["spread"] for run in runs)
        else:
            assert r["spread"] == pytest.approx(0.0, abs=1e-9)
    assert merged["merged_from"] == [str(p) for p in paths]
    # the earlier runs' files are left as they were; the report went to --out
    assert report.load_results(paths[0])["ratios"] == runs[0]["ratios"]
    assert (out / "results.json").exists()
    # each run passes the merged baseline's gate
    for p in paths:
        assert _bench("--results", p, "--compare", base) == 0


def test_a_baseline_from_several_runs_refuses_runs_that_are_not_one_baselines(tiny, tmp_path,
                                                                               capsys):
    first = report.save_json(tiny["results"], tmp_path / "a" / "results.json")
    other = json.loads(json.dumps(tiny["results"]))
    other["machine"]["class"] = "some-other-cpu-64c"
    second = report.save_json(other, tmp_path / "b" / "results.json")
    assert _bench("--results", first, "--results", second, "--save-baseline",
                  tmp_path / "m.json") == 3
    _one_line_error(capsys, "not runs of one baseline", "some-other-cpu-64c")
    partial = json.loads(json.dumps(tiny["results"]))
    partial["progress"] = {"complete": False, "planned": ["x"], "completed": []}
    third = report.save_json(partial, tmp_path / "c" / "results.json")
    assert _bench("--results", first, "--results", third, "--save-baseline",
                  tmp_path / "m.json") == 3
    _one_line_error(capsys, "a partial run")
    assert not (tmp_path / "m.json").exists()


def test_help_documents_every_exit_code(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for code in (bench_cli.EXIT_OK, bench_cli.EXIT_REGRESSION, bench_cli.EXIT_CANNOT_JUDGE,
                 bench_cli.EXIT_BAD_INPUT, bench_cli.EXIT_INTERRUPTED):
        assert f"\n  {code} " in out, code
    assert "--ci" in out and "about 3" in out


def test_exit_130_interrupted_keeps_the_partial_file(bench_cache, tmp_path, monkeypatch, capsys):
    def interrupted(args, out, log):
        report.save_json({"schema": 1, "rows": []}, out / "results.json")
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_cli, "_measure", interrupted)
    assert _bench("--matrix", "tiny", "--out", tmp_path) == 130
    assert "interrupted" in capsys.readouterr().err
    assert (tmp_path / "results.json").exists()


# --- statistics --------------------------------------------------------------------------

def test_ratios_record_their_spread_and_the_gate_uses_it(tiny):
    res = tiny["results"]
    key = "mtp-tiny-90: specdec mtp best fixed / specdec plain"
    r = res["ratios"][key]
    assert len(r["runs"]) == 2 and r["spread"] is not None and r["spread"] >= 0
    base = report.baseline_of(res)
    assert base["ratios"][key]["spread"] == r["spread"]
    # a steady ratio is held tightly, a noisy one loosely; a ratio without spread: fixed
    steady = {"ratios": {"a": {"value": 1.0, "spread": 0.01}, "b": {"value": 1.0, "spread": 0.1},
                         "c": {"value": 1.0}}}
    cur = {"ratios": {"a": {"value": 0.9}, "b": {"value": 0.9}, "c": {"value": 0.9}}}
    checks = {c.name: c for c in compare.compare(cur, steady)}
    assert checks["a"].margin == compare.MIN_TOLERANCE and checks["a"].status == "FAIL"
    assert checks["b"].margin == pytest.approx(0.3) and checks["b"].status == "ok"
    assert checks["c"].margin == compare.DEFAULT_MARGIN and checks["c"].basis == "fixed"
    # --margin fixes the tolerance for all
    assert {c.margin for c in compare.compare(cur, steady, 0.2)} == {0.2}
    # this run's spread widens it: the drop is a difference of two noisy measurements
    noisy = {"ratios": {"a": {"value": 0.9, "spread": 0.04}}}
    check = compare.compare(noisy, steady)[0]
    assert check.margin == pytest.approx(3 * (0.01 ** 2 + 0.04 ** 2) ** 0.5)
    assert check.status == "ok"
    assert compare.compare({"ratios": {"a": {"value": 0.8, "spread": 0.04}}}, steady)[0].status \
        == "FAIL"


def test_per_round_ratio_is_the_ratio_of_that_round():
    from specdec.benchmark.runner import Row

    rows = [Row("c", "p", "code", "specdec plain", "specdec", "plain", tok_s=10,
                tok_s_runs=[10, 8, 12]),
            Row("c", "p", "code", "specdec ngram n3", "specdec", "ngram", "ngram", 3,
                tok_s=20, tok_s_runs=[20, 20, 18])]
    r = report.ratios_with_spread(rows)["c: specdec ngram best fixed / specdec plain"]
    assert r.runs == pytest.approx([2.0, 2.5, 1.5])
    assert r.value == pytest.approx(2.0) and r.spread == pytest.approx(0.25)


# --- --list and the CI tier --------------------------------------------------------------

def test_list_shows_cases_and_ratios(capsys):
    assert _bench("--list", "--ci") == 0
    out = capsys.readouterr().out
    assert out.startswith("ci: 2 case(s), 3 alternating rounds, about 3 min")
    for needle in ("gemma3-270m:", "mtp-mid-90:", "ratio: specdec plain / llama-bench",
                   "ratio: best specdec drafter / best llama.cpp n-gram mode",
                   "ratio: specdec mtp best fixed / llama.cpp draft-mtp best",
                   "ratio: specdec mtp adaptive / specdec plain, interleaved",
                   "ratio: specdec suffix adaptive / specdec plain", "serve (--case serve"):
        assert needle in out, needle
    assert _bench("--list") == 0
    out = capsys.readouterr().out
    assert "\nquick: " in out and "\nfull: " in out


def test_ci_tier_tracks_the_ratios_that_matter():
    """Each ratio the issue names is among the CI tier's tracked ratios, with a spread
    (3 rounds), and the quick matrix states its expected duration."""
    from specdec.benchmark import listing

    ci = matrix.ci()
    assert ci.reps >= 3 and ci.expected_minutes <= 3
    names = {c.name: listing.case_ratios(c) for c in ci.cases}
    g, m = names["gemma3-270m"], names["mtp-mid-90"]
    assert "specdec plain / llama-bench" in g and "specdec plain / llama-bench" in m
    assert "best specdec drafter / best llama.cpp n-gram mode" in g
    assert "specdec suffix adaptive / specdec plain" in g
    assert "specdec mtp best fixed / llama.cpp draft-mtp best" in m
    assert "specdec mtp adaptive / specdec plain, interleaved" in m
    assert matrix.quick().expected_minutes > 0


def test_the_quick_matrix_states_what_it_takes():
    """--quick states its measured duration, for the steps it was measured at: a quick that
    grows past them states a duration nobody measured. The README says the same."""
    q = matrix.quick()
    assert q.expected_minutes == matrix.QUICK_MINUTES
    assert Runner(q)._count() <= matrix.QUICK_STEPS
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"quick matrix: about {matrix.QUICK_MINUTES:g} minutes on 2 cores" in readme


def test_the_quick_matrix_is_sized_under_ten_minutes():
    """issue 33: --quick stays under 10 minutes (measured: 472 s, 2026-11-27)."""
    assert matrix.QUICK_MINUTES < 10


# --- results that survive a kill ---------------------------------------------------------

def _spawn(out: Path, env: dict) -> "subprocess.Popen[bytes]":
    return subprocess.Popen([sys.executable, "-m", "specdec", "bench", "--matrix", "tiny",
                             "--no-peers", "--reps", "2", "--n-gen", "16", "--no-plots", "-q",
                             "--out", str(out)], env=env, cwd=tempfile.gettempdir(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for(path: Path, proc: subprocess.Popen, ready, timeout: float = 600) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            data = json.loads(path.read_text())
            if ready(data):
                return data
        except (OSError, ValueError):
            pass
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.02)
    raise AssertionError(f"{path} never became ready")


def _killed_run(out: Path, want_rows: bool) -> dict:
    """Start a tiny run, stop it (SIGSTOP) once its results.json has the prompt's rows (or, without
    ``want_rows``, as soon as it exists), check the run was still unfinished, SIGKILL it.
    Returns what it left. A stop that lands after the case completed (the tiny case's exact
    check is short) is retried with a fresh run."""
    env = dict(os.environ, **{INJECT_ENV: "5"})       # slower rounds: time to stop it mid-run
    for _ in range(5):
        if out.exists():
            for f in out.iterdir():
                f.unlink()
        proc = _spawn(out, env)
        try:
            # rows of the prompt (not only plain from an empty context): ratios to gate
            _wait_for(out / "results.json", proc, lambda d: any(
                r["prompt"] == "bigram" for r in d["rows"]) if want_rows else not d["rows"])
            proc.send_signal(signal.SIGSTOP)
            left = json.loads((out / "results.json").read_text())
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == -signal.SIGKILL
        if not left["progress"]["completed"]:
            return json.loads((out / "results.json").read_text())
    raise AssertionError("the run always completed before it could be stopped")


@pytest.mark.parametrize("stage", ["before the first row", "after rows, before the case completed"])
def test_a_killed_run_leaves_results_that_report_and_gate(tiny, tmp_path, stage, capsys):
    want_rows = stage != "before the first row"
    out = tmp_path / "run"
    left = _killed_run(out, want_rows)
    assert left["progress"]["complete"] is False
    assert left["progress"]["planned"] == ["mtp-tiny-90"]
    assert left["progress"]["completed"] == []
    assert bool(left["rows"]) == want_rows

    assert _bench("--results", out / "results.json") == 0
    md = capsys.readouterr().out
    assert "Partial results" in md and "not completed: mtp-tiny-90" in md

    rc = _bench("--results", out / "results.json", "--compare", tiny["baseline"],
                "--margin", "0.9")
    gated = capsys.readouterr().out
    if want_rows:
        assert rc == 0 and "gate: ok" in gated
    else:
        assert rc == 2 and "none of the baseline's" in gated
        assert "not measured in this run (no judgement on them): mtp-tiny-90" in gated
    # a partial run is no baseline
    assert _bench("--results", out / "results.json", "--save-baseline", tmp_path / "b.json") == 3
    assert "partial run" in capsys.readouterr().err


def test_a_complete_run_says_so(tiny):
    assert tiny["results"]["progress"] == {"complete": True, "planned": ["mtp-tiny-90"],
                                           "completed": ["mtp-tiny-90"]}
