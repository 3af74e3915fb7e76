"""``specdec bench --case structured`` runs and reports its ratios: its concurrency-1 case on a
tiny synthetic chat model with small schemas (served by ``specdec serve`` children), its rows
and exact check, the ratios the gate tracks, and ``--list`` naming them."""
import pytest

pytest.importorskip("llguidance")
pytest.importorskip("starlette")

from specdec.benchmark import listing, matrix, report, report_md, structured  # noqa: E402
from specdec.benchmark.case_models import CaseModels  # noqa: E402
from specdec.benchmark.runner import Runner, rows_of  # noqa: E402
from specdec.benchmark.structured_prompts import (ORDER_SCHEMA, PASS_REQUESTS, SETS,  # noqa: E402
                                                  Request, pass_requests)
from specdec.testing.chat import write_tiny_chat  # noqa: E402

LABEL = {"type": "object", "properties": {"label": {"type": "string", "enum": ["alpha", "beta"]},
                                          "ok": {"type": "boolean"}},
         "required": ["label", "ok"], "additionalProperties": False}
TRACKED = ("best specdec json_schema / specdec plain json_schema",
           "specdec plain json_schema / specdec plain")


def test_matches_checks_what_the_requests_use():
    schema = ORDER_SCHEMA
    good = {"customer": "A", "email": "a@b", "city": "C", "order_id": "X-1", "total": 1.5,
            "items": [{"name": "n", "quantity": 2}]}
    assert structured.matches(good, schema)
    for bad in ({**good, "extra": 1}, {**good, "total": "1"}, {**good, "items": [{"name": "n"}]},
                {**good, "items": [{"name": "n", "quantity": 100}]}, {**good, "city": "C" * 31},
                {k: v for k, v in good.items() if k != "email"}):
        assert not structured.matches(bad, schema)


def test_each_round_sends_requests_no_earlier_round_sent():
    # a drafter that remembers earlier answers (suffix decoding's corpus) must not be asked
    # for one again: the rounds take the sets' groups in turn
    for name, reqs in SETS.items():
        assert len({r.text for r in reqs}) == len(reqs)
        groups = len(reqs) // PASS_REQUESTS
        assert groups >= 3, name
        seen = set()
        for rep in range(groups):
            idx = pass_requests(len(reqs), rep)
            assert len(idx) == PASS_REQUESTS and not seen & set(idx)
            seen |= set(idx)
        assert pass_requests(len(reqs), groups) == pass_requests(len(reqs), 0)
        # the warm-up's group is the last, which the first rounds do not send
        assert pass_requests(len(reqs), -1) == pass_requests(len(reqs), groups - 1)
    assert pass_requests(3, 5) == range(3)       # a set of one group or less: all of it


def test_the_structured_case_runs_and_reports_its_ratios(tmp_path, monkeypatch):
    model = str(write_tiny_chat(tmp_path / "tiny.gguf", "chatml", chat_template=None,
                                reply="Hi_thEre!"))
    monkeypatch.setattr(CaseModels, "target", lambda self, case: model)
    sets = {"extract": (Request("Extract: alpha", LABEL), Request("Extract: beta", LABEL)),
            "classify": (Request("Classify: x", LABEL), Request("Classify: y", LABEL))}
    monkeypatch.setattr(structured, "SETS", sets)
    case = matrix.structured_cases(n_gen=48)[0]
    assert case.name == "structured-c1" and case.concurrency == 1
    m = matrix.Matrix("t", (case,), reps=2, check_tokens=48)
    results = report.finalize(Runner(m, peers_enabled=False, log=lambda s: None).run())
    rows = {(r.method, r.prompt): r for r in rows_of(results)}
    for p in sets:
        for meth in case.methods:
            r = rows[(meth.label, p)]
            if meth.side == matrix.LLAMA_SERVER:
                assert r.status == "unavailable" and "--no-peers" in r.note
                continue
            assert r.status == "ok" and r.tok_s > 0 and len(r.tok_s_runs) == 2, r
            assert r.constraint == meth.constraint
            if meth.constraint and meth.family != "plain":
                assert r.check == "PASS"
                # forced tokens at least (the adaptive policy may find drafting costs more)
                assert r.drafted > 0 or meth.adaptive
    assert rows[("specdec plain json_schema", "extract")].check == "ref"
    ratios = results["ratios"]
    for name in TRACKED:
        r = ratios[f"structured-c1: {name}"]
        assert r["tracked"] and r["value"] > 0 and len(r["runs"]) == 2
    assert ratios["structured-c1: specdec plain json_schema / specdec plain"]["kind"] == \
        "constraint-cost"
    assert results["failures"] == []
    md = report_md.markdown(results)
    assert "## structured-c1" in md and "specdec suffix adaptive json_schema" in md
    # --list names the same ratios, the one against llama-server first among them
    listed = listing.case_ratios(case)
    assert "best specdec json_schema / best llama-server n-gram json_schema" in listed
    assert all(name in listed for name in TRACKED)


def test_the_structured_and_full_matrices_hold_the_structured_cases_quick_does_not():
    for name in ("structured", "full"):
        cases = {c.name: c for c in matrix.get(name).cases}
        assert cases["structured-c1"].concurrency == 1 and cases["structured-c4"].concurrency == 4
    assert not any(c.name.startswith("structured") for c in matrix.quick().cases)


def test_case_structured_alone_runs_the_structured_matrix():
    from specdec.benchmark.cli import _matrix_name
    from types import SimpleNamespace
    assert _matrix_name(SimpleNamespace(gpu=False, matrix=None, case=["structured"])) == "structured"
    assert _matrix_name(SimpleNamespace(gpu=False, matrix="full", case=["structured"])) == "full"
    assert _matrix_name(SimpleNamespace(gpu=False, matrix=None, case=["gemma3-270m"])) == "quick"


def test_the_exact_check_decodes_once_for_both_concurrencies(monkeypatch):
    # the check is in process and the same for c=1 and c=4: the second case takes the
    # first's verdicts (and still ticks its progress steps)
    calls, ticks = [], []

    def verdicts(runner, case, path, reqs, checked):
        calls.append(case.name)
        return "PASS", {m.label: "PASS" for m in checked}

    monkeypatch.setattr(structured, "_exact_verdicts", verdicts)
    monkeypatch.setattr(structured, "_VERDICTS", {})
    sets = {"extract": (Request("Extract: alpha", LABEL),),
            "classify": (Request("Classify: x", LABEL),)}
    monkeypatch.setattr(structured, "SETS", sets)
    c1, c4 = matrix.structured_cases(n_gen=48)
    runner = Runner(matrix.Matrix("t", (c1, c4), reps=2, check_tokens=48), peers_enabled=False,
                    log=lambda s: None)
    monkeypatch.setattr(runner, "_tick", ticks.append)
    for case in (c1, c4):
        row = structured.Row(case.name, "extract", "extract", "specdec ngram n8 json_schema",
                             matrix.SPECDEC, "ngram", "ngram", 8, False, True, 0.0,
                             constraint="json_schema")
        row.status = "ok"
        structured._exact_check(runner, case, "m.gguf", [row])
        assert row.check == "PASS"
    assert calls == ["structured-c1"]
    checked = sum(1 for m in c4.methods if m.side == matrix.SPECDEC and m.constraint
                  and m.family != "plain")
    assert len(ticks) == 2 + checked and all("structured-c4" in t for t in ticks)
    # other requests are checked again
    monkeypatch.setattr(structured, "SETS", {**sets, "extract": (Request("Extract: beta", LABEL),)})
    structured._exact_check(runner, c4, "m.gguf", [])
    assert calls == ["structured-c1", "structured-c4"]


def test_a_structured_case_whose_servers_all_fail_reports_why(tmp_path, monkeypatch):
    # no server started (a missing dependency, a port in use): the rows say why, no crash
    model = str(write_tiny_chat(tmp_path / "tiny.gguf", "chatml", chat_template=None,
                                reply="Hi_thEre!"))
    monkeypatch.setattr(CaseModels, "target", lambda self, case: model)
    monkeypatch.setattr(structured, "SETS", {"extract": (Request("Extract: alpha", LABEL),),
                                             "classify": (Request("Classify: x", LABEL),)})

    def none_start(runner, case, model, log_path, errors):
        for m in case.methods:
            errors[m] = "RuntimeError: the server did not start"
        return {}

    monkeypatch.setattr(structured, "_start_servers", none_start)
    case = matrix.structured_cases(n_gen=16)[0]
    runner = Runner(matrix.Matrix("t", (case,), reps=2, check_tokens=16), peers_enabled=False,
                    log=lambda s: None)
    rows = structured.run_case(runner, case)
    assert rows and all(r.status == "unavailable" and "did not start" in r.note for r in rows)
