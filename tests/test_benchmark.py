"""specdec.benchmark: report, plots and the regression gate, on the tiny bigram model.

The gate tests run the benchmark twice against a baseline made in the same test:
once as is (it must pass) and once with ``SPECDEC_BENCH_INJECT_SLEEP_MS`` making
the specdec side sleep each round, a deliberately slowed build (it must fail).
They need llama.cpp's reference tools (built on first use), hence ``slow``.
"""
from __future__ import annotations

import json

import pytest

from specdec.benchmark import compare, matrix, report, report_md
from specdec.benchmark.runner import INJECT_ENV, Runner, rows_of


@pytest.fixture(scope="module")
def bench_cache(tmp_path_factory):
    """The benchmark writes its synthetic models into the cache dir: keep them per module.
    llama.cpp's tools (keyed by pin and flags) stay where every run builds them once."""
    from specdec.benchmark import llama_tools

    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_LLAMA_TOOLS_DIR", str(llama_tools.tools_dir()))
    mp.setenv("SPECDEC_CACHE_DIR", str(tmp_path_factory.mktemp("bench-cache")))
    mp.delenv(INJECT_ENV, raising=False)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def tiny_results(bench_cache):
    m = matrix.tiny(n_gen=48, reps=2, peers=False, exact=True)
    return report.finalize(Runner(m, peers_enabled=False, log=lambda s: None).run())


def _results(ratios: dict) -> dict:
    return {"ratios": {k: {"value": v, "tracked": True} for k, v in ratios.items()}}


def test_compare_flags_only_drops_beyond_the_margin():
    base = _results({"a": 1.0, "b": 2.0, "c": 1.5})
    cur = _results({"a": 0.91, "b": 1.6, "d": 9.0})          # a -9%, b -20%, c missing
    checks = {c.name: c for c in compare.compare(cur, base, margin=0.1)}
    assert checks["a"].status == "ok"
    assert checks["b"].status == "FAIL"
    assert checks["c"].status == "missing"
    assert "d" not in checks                                  # only the baseline's ratios are gated
    assert [c.name for c in compare.failed(list(checks.values()))] == ["b"]
    assert "gate: FAIL" in compare.summary(list(checks.values()))
    assert ("| b | 2.000 |  | 1.600 | -20.0% | 10.0% (fixed) | 1.800 | **FAIL** |"
            in compare.table(list(checks.values())))
    with pytest.raises(ValueError):
        compare.compare(cur, base, margin=1.5)


def test_untracked_ratios_are_not_gated():
    base = {"ratios": {"x": {"value": 2.0, "tracked": False}}}
    assert compare.compare(_results({"x": 0.1}), base) == []


def test_tiny_run_rows_and_exact_check(tiny_results):
    rows = rows_of(tiny_results)
    by = {(r.method, r.prompt): r for r in rows}
    plain, mtp = by[("specdec plain", "bigram")], by[("specdec mtp n2", "bigram")]
    assert plain.tok_s > 0 and len(plain.tok_s_runs) == 2
    assert mtp.tok_s > 0 and mtp.drafted > 0 and mtp.acceptance > 0.5
    assert mtp.match == 1.0 and mtp.check == "PASS"
    assert sum(mtp.drafted_per_position) == mtp.drafted
    assert tiny_results["failures"] == []
    exact = by[("specdec mtp n2 exact", "bigram")]
    assert exact.exact and exact.tok_s > 0 and exact.check == "PASS"
    cost = tiny_results["ratios"]["mtp-tiny-90: specdec mtp n2 exact / specdec mtp n2"]
    assert cost["kind"] == "exact-cost" and not cost["tracked"]
    assert cost["value"] == pytest.approx(exact.tok_s / mtp.tok_s, rel=1e-3)
    oracle = tiny_results["oracle_checks"]
    assert {c["n_max"] for c in oracle} == {4, 8, 16}
    assert oracle and all(c["check"] == "PASS" for c in oracle)
    assert tiny_results["machine"]["threads"] == 2 and tiny_results["machine"]["cpu"]
    key = "mtp-tiny-90: specdec mtp best fixed / specdec plain"
    assert tiny_results["ratios"][key]["tracked"]
    assert tiny_results["ratios"][key]["value"] == pytest.approx(mtp.tok_s / plain.tok_s, rel=1e-3)


def test_report_json_markdown_and_baseline(tiny_results, tmp_path):
    path = report.save_json(tiny_results, tmp_path / "r" / "results.json")
    again = report.finalize(report.load_json(path))
    assert again["ratios"] == json.loads(json.dumps(tiny_results["ratios"]))
    md = report_md.markdown(again)
    assert "## mtp-tiny-90" in md and "| specdec mtp n2 |" in md and "PASS" in md
    assert "specdec mtp best fixed / specdec plain" in md
    base = report.baseline_of(again)
    assert base["ratios"] and all(v["tracked"] for v in base["ratios"].values())
    checks = compare.compare(again, base)
    assert checks and not compare.failed(checks)


def test_markdown_marks_a_wrong_method(tiny_results):
    broken = json.loads(json.dumps(tiny_results))
    for r in broken["rows"]:
        if r["method"] == "specdec mtp n2":
            r["check"] = "FAIL"
    broken = report.finalize(broken)
    assert broken["failures"] == ["mtp-tiny-90 / bigram / specdec mtp n2: FAIL"]
    assert "**FAIL**" in report_md.markdown(broken)


def test_plots_are_written(tiny_results, tmp_path):
    from specdec.benchmark import plots

    paths = plots.write_all(tiny_results, tmp_path / "plots")
    assert [p.name for p in paths] == ["tok_s_by_category.png", "speedup.png",
                                      "acceptance_by_position.png", "mtp_speedup_vs_acceptance.png"]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, p


def test_interleave_times_each_side_on_the_same_requests(bench_cache):
    from specdec import Decoder
    from specdec.benchmark.interleave import interleave
    from specdec.benchmark.synthetic import model_for

    path = str(model_for("tiny", 0.9, log=lambda s: None))
    plain = Decoder(path, n_ctx=512)
    ad = Decoder(path, drafter="mtp", n_max=3, adaptive=True, n_ctx=512)
    seen = []
    got = interleave(ad, plain, list(range(10, 30)), 40, 3, before=seen.append)
    assert seen == [ad, plain] * 3
    assert got.tokens == [40, 40, 40] and got.same_tokens
    assert len(got.seconds) == len(got.ref_seconds) == 3
    assert all(t > 0 for t in got.seconds + got.ref_seconds)
    assert got.tok_s == pytest.approx(120 / sum(got.seconds))
    assert got.drafted > 0 and 0 < got.accepted <= got.drafted
    assert len(got.per_request()) == 3
    # both decoders are free again
    assert plain.generate([5, 6], max_tokens=2).tokens and ad.generate([5, 6], max_tokens=2).tokens


def test_interleave_stops_the_longer_side_where_the_shorter_ended(bench_cache):
    """Both sides time the same work: a side that ends first (a sampled one at its end of
    text, here one capped at 7 tokens) stops the other at as many tokens; ``sampling`` is
    how the first side samples, and each side's rate over its own rounds is kept."""
    from specdec import Decoder, Sampling
    from specdec.benchmark.interleave import interleave
    from specdec.benchmark.synthetic import model_for

    path = str(model_for("tiny", 0.9, log=lambda s: None))
    greedy = Decoder(path, n_ctx=512)
    sampled = Decoder(path, n_ctx=512)

    class Capped:       # ends its requests at 7 tokens, as a stop or the end of text would
        def stream(self, prompt, *, max_tokens, sampling=None):
            return sampled.stream(prompt, max_tokens=7, sampling=sampling)

    prompt, sp = list(range(10, 30)), Sampling(temperature=1.0, seed=3)
    got = interleave(Capped(), greedy, prompt, 20, 2, sampling=sp)   # type: ignore[arg-type]
    assert got.tokens == [7, 7]
    assert len(got.rounds_tok_s) == len(got.ref_rounds_tok_s) == 2
    assert all(x > 0 for x in got.rounds_tok_s + got.ref_rounds_tok_s)
    # the first side sampled (seeded: the same draw as a generate), the other stopped at 7
    assert got.last_tokens == sampled.generate(prompt, max_tokens=7, sampling=sp).tokens
    full = greedy.generate(prompt, max_tokens=20).tokens
    assert len(full) == 20 and got.ref_seconds[0] > 0
    # the stopped side is free again
    assert greedy.generate([5, 6], max_tokens=2).tokens


def test_sampling_cost_is_over_greedy_timed_in_turn_on_every_prompt():
    """The sampling-cost ratio: the geometric mean over every prompt (open prose included)
    of the sampled row's tok/s over greedy's timed in turn with it; rows from before that
    pairing (no ``ref_tok_s``) fall back to the plain rows of the grounded prompts."""
    from specdec.benchmark.rows import Row

    def rows(paired: bool):
        out = []
        for p, cat, plain, t1, ref in (("c", "code", 60.0, 45.0, 50.0),
                                       ("o", "open", 60.0, 57.0, 60.0)):
            out.append(Row("k", p, cat, "specdec plain", "specdec", "plain", tok_s=plain))
            out.append(Row("k", p, cat, "specdec plain t1", "specdec", "plain", temperature=1.0,
                           tok_s=t1, ref_tok_s=ref if paired else 0.0))
        return out

    key = "k: specdec plain t1 / specdec plain"
    r = report.compute_ratios(rows(True))[key]
    assert r.kind == "sampling-cost" and r.target == 0.95
    assert r.value == pytest.approx(((45 / 50) * (57 / 60)) ** 0.5)
    assert report.compute_ratios(rows(False))[key].value == pytest.approx(45 / 60)


def test_interleaved_rows_ratio_and_table(bench_cache):
    m = matrix.tiny(n_gen=32, reps=1, peers=False, interleave=2)
    res = report.finalize(Runner(m, peers_enabled=False, log=lambda s: None).run())
    rows = [r for r in rows_of(res) if r.prompt == "bigram (interleaved with plain)"]
    assert [r.method for r in rows] == ["specdec mtp adaptive"]
    r = rows[0]
    assert r.tok_s > 0 and r.ref_tok_s > 0 and len(r.tok_s_runs) == len(r.ref_tok_s_runs) == 2
    assert r.match == 1.0
    key = "mtp-tiny-90: specdec mtp adaptive / specdec plain, interleaved"
    ratio = res["ratios"][key]
    assert ratio["tracked"] and ratio["target"] == 0.97
    assert ratio["value"] == pytest.approx(r.tok_s / r.ref_tok_s, rel=1e-3)
    # the interleaved rows stay out of the per-prompt ratios and the exact check
    assert "mtp-tiny-90: specdec mtp adaptive / specdec plain" in res["ratios"]
    assert r.check == ""
    md = report_md.markdown(res)
    assert "timed round by round in turn with plain decoding" in md
    assert "| specdec mtp adaptive | bigram |" in md


def test_oracle_rows_ceiling_and_shares(bench_cache, tmp_path):
    """Timed oracle rows: the ceiling per n_max on each prompt, every drafter's tok/s as a
    share of the best oracle row, in the JSON, the ratios, the report and a plot."""
    from specdec.benchmark import plots

    m = matrix.tiny(n_gen=32, reps=1, peers=False, oracle=True)
    res = report.finalize(Runner(m, peers_enabled=False, log=lambda s: None).run())
    by = {(r.method, r.prompt): r for r in rows_of(res)}
    o2, o4 = by[("specdec oracle n2", "bigram")], by[("specdec oracle n4", "bigram")]
    plain, mtp = by[("specdec plain", "bigram")], by[("specdec mtp n2", "bigram")]
    for o in (o2, o4):
        assert o.tok_s > 0 and o.drafted > 0 and o.accepted == o.drafted
        assert o.check == ""          # its exactness is the oracle exact check's
    per = res["oracle"]["mtp-tiny-90"]["bigram"]
    assert per["speedup"][2] == pytest.approx(o2.tok_s / plain.tok_s, rel=1e-3)
    assert per["speedup"][4] == pytest.approx(o4.tok_s / plain.tok_s, rel=1e-3)
    best = max(o2, o4, key=lambda r: r.tok_s)
    assert per["best_n_max"] == best.n_max
    assert per["share"]["specdec mtp n2"] == pytest.approx(mtp.tok_s / best.tok_s, rel=1e-3)
    assert "specdec oracle n2" not in per["share"] and "specdec plain" not in per["share"]
    ceiling = res["ratios"]["mtp-tiny-90: specdec oracle n4 / specdec plain"]
    assert ceiling["kind"] == "oracle" and not ceiling["tracked"]
    share = res["ratios"]["mtp-tiny-90: specdec mtp best fixed / oracle best"]
    assert share["kind"] == "oracle-share" and not share["tracked"]
    # (the JSON keeps 4 decimals)
    assert share["value"] == pytest.approx(mtp.tok_s / best.tok_s, rel=1e-3, abs=1e-4)
    # the oracle is never "the best specdec drafter" of the n-gram comparisons
    assert not any("oracle best fixed / specdec plain" in k for k in res["ratios"])
    md = report_md.markdown(res)
    assert "| oracle n2 speedup |" in md and "| specdec mtp n2 |" in md
    paths = plots.write_all(res, tmp_path / "plots")
    assert paths[-1].name == "oracle.png" and paths[-1].read_bytes()[:4] == b"\x89PNG"


def test_sampled_plain_row_and_its_cost(bench_cache):
    """A sampled plain row (temperature 1, seeded: every round draws the same tokens) and its
    cost over greedy plain decoding as a ratio with the 0.95 target."""
    m = matrix.tiny(n_gen=24, reps=2, peers=False, sampled=True)
    res = report.finalize(Runner(m, peers_enabled=False, log=lambda s: None).run())
    by = {(r.method, r.prompt): r for r in rows_of(res)}
    row = by[("specdec plain t1", "bigram")]
    assert row.tok_s > 0 and row.temperature == 1.0 and row.family == "plain" and row.check == ""
    assert by[("specdec plain", "bigram")].check == "ref"
    cost = res["ratios"]["mtp-tiny-90: specdec plain t1 / specdec plain"]
    assert cost["kind"] == "sampling-cost" and cost["target"] == 0.95 and not cost["tracked"]
    # timed round by round in turn with greedy plain, a request per round
    assert len(row.tok_s_runs) == len(row.ref_tok_s_runs) == 2 and row.ref_tok_s > 0
    assert cost["value"] == pytest.approx(row.tok_s / row.ref_tok_s, rel=1e-3)
    assert "x greedy in turn" in report_md.markdown(res)


def test_unavailable_peer_gets_a_row_saying_why(bench_cache):
    m = matrix.tiny(n_gen=16, reps=1, peers=True)
    res = report.finalize(Runner(m, peers_enabled=False, log=lambda s: None).run())
    gone = [r for r in rows_of(res) if r.side == "llama.cpp"]
    assert gone and all(r.status == "unavailable" and "--no-peers" in r.note for r in gone)
    assert "## Methods that did not run" in report_md.markdown(res)


@pytest.mark.slow
def test_gate_passes_as_is_and_fails_on_a_slowed_build(bench_cache, tmp_path, monkeypatch):
    from specdec.cli import main

    base_path = tmp_path / "baseline.json"
    rc = main(["bench", "--matrix", "tiny", "--reps", "3", "--no-plots", "--quiet",
               "--out", str(tmp_path / "base"), "--save-baseline", str(base_path)])
    assert rc == 0
    base = report.load_json(base_path)
    assert "mtp-tiny-90: specdec plain / llama-bench" in base["ratios"]
    assert "mtp-tiny-90: specdec mtp best fixed / llama.cpp draft-mtp best" in base["ratios"]

    # the same build again passes the gate as users run it: each ratio's tolerance from the
    # two runs' spreads. Tiny-model timings are noisy, so here no tolerance is under 35%: a
    # fixed 35% failed in CI on the draft-mtp peer ratio, whose baseline (2.11, spread 21%,
    # one slow llama.cpp process) the next run read as 1.33 (-37%)
    monkeypatch.setattr(compare, "MIN_TOLERANCE", 0.35)
    rc = main(["bench", "--matrix", "tiny", "--reps", "3", "--no-plots", "--quiet",
               "--out", str(tmp_path / "same"), "--compare", str(base_path)])
    assert rc == 0

    # a slowed build: 2 ms per round is several times a tiny-model round
    monkeypatch.setenv(INJECT_ENV, "2")
    rc = main(["bench", "--matrix", "tiny", "--reps", "3", "--no-plots", "--quiet",
               "--out", str(tmp_path / "slow"), "--compare", str(base_path), "--margin", "0.35"])
    assert rc == 1
    slow = report.load_json(tmp_path / "slow" / "results.json")
    assert slow["settings"]["inject_sleep_ms"] == 2
    failed = {c.name for c in compare.failed(compare.compare(slow, base, 0.35))}
    assert "mtp-tiny-90: specdec plain / llama-bench" in failed


def test_matrices_cover_the_issue():
    """quick has every ratio of the note; full has every model, prompt category and drafter,
    each drafter with fixed n_max values and adaptive."""
    q, f = matrix.quick(), matrix.full()
    for m in (q, f):
        gemma = next(c for c in m.cases if c.name == "gemma3-270m")
        assert {p.category for p in gemma.prompts} == {"code", "repeat", "records", "open"}
        assert ("llama.cpp", "plain") in {(x.side, x.family) for x in gemma.methods}
        assert {c.accuracy for c in m.cases if c.name.startswith("mtp-mid")} == {0.9, 0.7, 0.5}
    # llama-cpp-python (plain, prompt lookup) in full only: quick's peer is llama.cpp's tools
    f_gemma = next(c for c in f.cases if c.name == "gemma3-270m")
    assert {("llama-cpp-python", "plain"), ("llama-cpp-python", "ngram")} <= {
        (x.side, x.family) for x in f_gemma.methods}
    # the ratios issue 30 asks of one quick run, as a run of quick reports them
    from specdec.benchmark import listing
    ratios = {c.name: listing.case_ratios(c) for c in q.cases}
    g = ratios["gemma3-270m"]
    for name in ("best specdec drafter / best llama.cpp n-gram mode",
                 "specdec plain / llama-bench",
                 "specdec plain t1 / specdec plain [sampling-cost, not gated]",
                 "specdec suffix adaptive / oracle best [oracle-share, not gated]",
                 "specdec ngram best fixed / oracle best [oracle-share, not gated]",
                 *(f"{cat} prompts: best specdec / best llama.cpp configuration"
                   for cat in ("code", "repeat", "records", "open"))):
        assert name in g, name
    mtp_cases = [c for c in q.cases if c.name.startswith("mtp-")]
    assert {c.name for c in mtp_cases} >= {"mtp-mid-q8_0-70", "mtp-mid-50"}
    for c in mtp_cases:
        assert "specdec mtp adaptive / llama.cpp draft-mtp best" in ratios[c.name], c.name
        assert "specdec mtp adaptive / specdec plain, interleaved" in ratios[c.name], c.name
    full_names = {c.name for c in f.cases}
    assert "gemma3-270m+layerskip14" in full_names and "mtp-moe-mid-90" in full_names
    by_cat = {}
    for p in next(c for c in f.cases if c.name == "gemma3-270m").prompts:
        by_cat.setdefault(p.category, []).append(p.name)
    assert all(len(v) >= 2 for v in by_cat.values()), by_cat
    for m in (q, f):
        gemma = next(c for c in m.cases if c.name == "gemma3-270m")
        # the ceiling: full times every draft length, quick the one that was the best but once
        assert {x.n_max for x in gemma.methods if x.family == "oracle"} == (
            {2, 4, 8, 16} if m is f else {16})
        # llama.cpp's ngram-simple defaults (key 12, drafts of 48) beside the short keys, and
        # sampled plain decoding at OpenAI's default temperature
        assert matrix.LLAMA_NGRAM_DEFAULT in gemma.methods
        assert matrix.SAMPLED_PLAIN in gemma.methods
        assert matrix.SAMPLED_PLAIN.label == "specdec plain t1"
    for case in f.cases:
        # (the oracle, the harness's ceiling, runs at fixed draft lengths only)
        ours = [x for x in case.methods if x.side == "specdec" and x.family not in ("plain", "oracle")]
        for fam in {x.family for x in ours}:
            assert any(x.adaptive for x in ours if x.family == fam), (case.name, fam)
            assert any(not x.adaptive for x in ours if x.family == fam), (case.name, fam)
    llama_modes = {x.drafter for c in f.cases for x in c.methods if x.side == "llama.cpp"}
    assert {"llama-bench", "ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache",
            "draft-simple", "draft-mtp"} <= llama_modes
    small = matrix.override(matrix.select(f, ["mtp-mid"]), reps=1, n_gen=16)
    assert [c.name for c in small.cases] == ["mtp-mid-90", "mtp-mid-70", "mtp-mid-50",
                                             "mtp-mid-q8_0-90", "mtp-mid-q8_0-70", "mtp-mid-q8_0-50"]
    assert {c.dtype for c in small.cases} == {"", "q8_0"}
    # both heads (the target's own, as llama.cpp runs it, and its Q4_0 copy), fixed and adaptive
    heads = {(x.drafter, x.adaptive) for x in small.cases[0].methods if x.family == "mtp"
             and x.side == "specdec"}
    assert heads == {("mtp", False), ("mtp", True), ("mtp:q4_0", False), ("mtp:q4_0", True)}
    assert small.reps == 1 and {c.n_gen for c in small.cases} == {16}
    with pytest.raises(ValueError):
        matrix.select(f, ["no-such-case"])


def test_cli_reports_saved_results_and_gates_them(tiny_results, tmp_path, capsys):
    from specdec.cli import main

    res_path = report.save_json(tiny_results, tmp_path / "run" / "results.json")
    base = report.baseline_of(tiny_results)
    ok_path = report.save_json(base, tmp_path / "ok.json")
    assert main(["bench", "--results", str(res_path), "--no-plots", "-q",
                 "--compare", str(ok_path)]) == 0
    out = capsys.readouterr().out
    assert "# specdec bench: tiny" in out and "gate: ok" in out
    assert (tmp_path / "run" / "report.md").read_text().startswith("# specdec bench: tiny")

    raised = json.loads(json.dumps(base))
    for v in raised["ratios"].values():
        v["value"] *= 3                    # a baseline build three times as fast: beyond the
                                           # widest tolerance (compare.MAX_TOLERANCE)
    hi_path = report.save_json(raised, tmp_path / "hi.json")
    assert main(["bench", "--results", str(res_path), "--no-plots", "-q",
                 "--compare", str(hi_path)]) == 1
    assert "gate: FAIL" in capsys.readouterr().out

    other = {"ratios": {"another case: x / y": {"value": 1.0, "tracked": True}}}
    other_path = report.save_json(other, tmp_path / "other.json")
    assert main(["bench", "--results", str(res_path), "--no-plots", "-q",
                 "--compare", str(other_path)]) == 2      # nothing comparable must not pass


def test_tools_build_is_shared_by_copies_of_the_pinned_tree(tmp_path, monkeypatch):
    """The tools dir is keyed by pin and flags: a build configured from another copy of the
    pinned tree (another checkout, the cache's unpacked sdist) is kept, not wiped and redone;
    a tree named by $SPECDEC_LLAMA_CPP_DIR is always the one built."""
    from specdec import _build_facts as facts
    from specdec.benchmark.llama_tools import build as b

    root, other, mine = tmp_path / "tools", tmp_path / "other", tmp_path / "mine"
    for tree in (other, mine):
        tree.mkdir()
        (tree / "CMakeLists.txt").write_text("")
    monkeypatch.setenv("SPECDEC_LLAMA_TOOLS_DIR", str(root))
    monkeypatch.delenv("SPECDEC_LLAMA_CPP_DIR", raising=False)
    monkeypatch.setattr(b, "_source_dir", lambda: mine.resolve())
    build = root / "build"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text("")
    (build / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={other}\n")
    b._write_stamp(root, {"pin": facts.LLAMA_CPP_PIN, "flags": b._flags_hash(),
                          "configured": True, "tools": {}})
    cmds = []

    def fake_run(cmd, out, desc=""):
        cmds.append(cmd)
        if "-S" in cmd:      # configure
            build.mkdir(exist_ok=True)
            (build / "build.ninja").write_text("")
            (build / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={cmd[cmd.index('-S') + 1]}\n")
        else:                # build: the targets appear
            (build / "bin").mkdir(exist_ok=True)
            for name in cmd[cmd.index("--target") + 1:]:
                (build / "bin" / name).write_text("")
                (build / "bin" / name).chmod(0o755)

    monkeypatch.setattr(b, "_run_logged", fake_run)
    assert b.ensure_tools(("llama-bench",))["llama-bench"] == build / "bin" / "llama-bench"
    assert [c[:2] for c in cmds] == [["cmake", "--build"]]       # no reconfigure, nothing wiped
    assert str(other) in (build / "CMakeCache.txt").read_text()

    cmds.clear()
    monkeypatch.setenv("SPECDEC_LLAMA_CPP_DIR", str(mine))
    b.ensure_tools(("llama-simple",))
    assert [c[:2] for c in cmds] == [["cmake", "-S"], ["cmake", "--build"]]
    assert cmds[0][2] == str(mine.resolve())
    assert not (build / "bin" / "llama-bench").exists()         # the other tree's build went


def test_thread_environment_is_reported_and_passive_waiting_warned(monkeypatch):
    from specdec.benchmark import machine
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert machine.timing_warning() is None
    assert "OMP_WAIT_POLICY" not in machine.describe(2)["timing_env"]
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    assert "OMP_WAIT_POLICY=PASSIVE" in machine.timing_warning()
    env = machine.describe(2)["timing_env"]
    assert env["OMP_WAIT_POLICY"] == "passive" and env["GOMP_SPINCOUNT"] == "1000"


def test_spec_simple_runs_again_when_its_log_lost_the_counters(monkeypatch):
    """llama.cpp's logger can lose the tail of a run's log: a log cut between the timing
    lines and the counters is run again, not parsed into an error."""
    import subprocess

    from specdec.benchmark.llama_tools import run

    head = ("0.00.001.000 I encoded   12 tokens in    0.010 seconds, speed: 1200.000 t/s\n"
            "0.00.002.000 I decoded   20 tokens in    0.020 seconds, speed: 1000.000 t/s\n")
    tail = ("0.00.002.001 I \n0.00.002.002 I n_draft   = 3\n0.00.002.003 I n_predict = 20\n"
            "0.00.002.004 I n_drafted = 9\n0.00.002.005 I n_accept  = 6\n")
    logs = [head, head + tail]
    calls = []

    def fake_run(cmd, capture_output):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, b"\n\n<bos>hi there" + b"\n\n\n\n",
                                           logs[len(calls) - 1].encode())

    monkeypatch.setattr(run, "tool", lambda name: name)
    monkeypatch.setattr(run.subprocess, "run", fake_run)
    res = run.run_spec_simple("m.gguf", "hi", 20, spec_type="ngram-mod", n_max=3)
    assert len(calls) == 2
    assert (res["text"], res["n_drafted"], res["n_accepted"], res["n_predict"]) == (" there", 9, 6, 20)

    logs[:] = [head] * (run.LOST_LOG_RETRIES + 1)
    calls.clear()
    with pytest.raises(RuntimeError, match="no complete summary"):
        run.run_spec_simple("m.gguf", "hi", 20, spec_type="ngram-mod", n_max=3)
    assert len(calls) == run.LOST_LOG_RETRIES + 1


def test_a_drafter_above_the_oracle_is_a_failure_not_a_ratio():
    """A share of the oracle above 100% means the oracle was no ceiling: a failed check in
    the results and the report, and no oracle-share ratio."""
    from specdec.benchmark.runner import Row

    def row(method, family, tok_s, n_max=0, side="specdec"):
        return Row("c", "p", "code", method, side, family, family, n_max, tok_s=tok_s)

    rows = [row("specdec plain", "plain", 10.0), row("specdec oracle n4", "oracle", 20.0, 4),
            row("specdec ngram n3", "ngram", 25.0, 3), row("specdec suffix n4", "suffix", 15.0, 4),
            row("llama.cpp ngram-simple n3", "ngram", 30.0, 3, side="llama.cpp")]
    res = report.finalize({"rows": [r.to_dict() for r in rows]})
    assert res["failures"] == ["c / p / specdec ngram n3: 125% of the oracle (above its ceiling)"]
    assert "c: specdec ngram best fixed / oracle best" not in res["ratios"]
    assert res["ratios"]["c: specdec suffix best fixed / oracle best"]["value"] == pytest.approx(0.75)
    assert report.ceiling_failures(rows) == res["failures"]


def test_each_prompt_category_gets_its_best_against_llama_cpps_best():
    """Issue 30: every category (code, repeat, records, open, or a --prompt-file's) at or above
    llama.cpp's best configuration of its speculative tool: one ratio per category, the best of
    each side taken over that category's prompts alone."""
    from specdec.benchmark.runner import Row

    def row(prompt, cat, method, family, tok_s, side="specdec"):
        return Row("g", prompt, cat, method, side, family, family, 3, tok_s=tok_s)

    rows = []
    for prompt, cat, ours_ng, ours_sfx, theirs_ng, theirs_map in (
            ("c1", "code", 40.0, 30.0, 20.0, 25.0), ("c2", "code", 10.0, 40.0, 20.0, 20.0),
            ("r1", "repeat", 90.0, 60.0, 100.0, 30.0), ("o1", "open", 12.0, 11.0, 10.0, 9.0)):
        rows += [row(prompt, cat, "specdec plain", "plain", 10.0),
                 row(prompt, cat, "specdec ngram n3", "ngram", ours_ng),
                 row(prompt, cat, "specdec suffix n4", "suffix", ours_sfx),
                 row(prompt, cat, "llama.cpp ngram-simple n3", "ngram", theirs_ng, "llama.cpp"),
                 row(prompt, cat, "llama.cpp ngram-map-k n3", "ngram-map", theirs_map,
                     "llama.cpp")]
    res = report.finalize({"rows": [r.to_dict() for r in rows]})
    got = {k: v["value"] for k, v in res["ratios"].items() if "prompts: best specdec" in k}
    code = (30.0 * 40.0) ** 0.5 / (25.0 * 20.0) ** 0.5     # suffix beats ngram over c1, c2
    assert got == pytest.approx({
        "g: code prompts: best specdec / best llama.cpp configuration": code,
        "g: repeat prompts: best specdec / best llama.cpp configuration": 0.9,
        "g: open prompts: best specdec / best llama.cpp configuration": 1.2}, rel=1e-3)
    assert all(res["ratios"][k]["target"] == 1.0 for k in got)


def test_prompt_files_replace_the_bench_prompts(tmp_path):
    """``--prompt-file [CATEGORY=]PATH``: the gemma case on the files' text, named after the
    files, the matrix's other cases left out; a missing or empty file is bad usage."""
    from specdec.benchmark import cli

    a, b = tmp_path / "header.h", tmp_path / "rows.csv"
    a.write_text("#define A 1\n")
    b.write_text("x,y\n1,2\n")
    prompts = cli._prompts_from([str(a), f"records={b}"])
    assert [(p.name, p.category, p.text) for p in prompts] == [
        ("header", "custom", "#define A 1\n"), ("rows", "records", "x,y\n1,2\n")]
    m = matrix.with_prompts(matrix.quick(), prompts)
    assert [c.name for c in m.cases] == ["gemma3-270m"] and m.cases[0].prompts == prompts
    with pytest.raises(matrix.UnknownCase, match="no gemma3-270m case"):
        matrix.with_prompts(matrix.tiny(), prompts)
    (tmp_path / "empty.txt").write_text("  \n")
    for bad in (tmp_path / "missing.txt", tmp_path / "empty.txt"):
        assert cli.main(["--prompt-file", str(bad), "--no-plots", "-q"]) == 3
