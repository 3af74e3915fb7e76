"""``specdec bench --case engine-mtp``: the harness on the tiny bigram model (the speeds it
reports are measured by the benchmark itself, never asserted here)."""
from __future__ import annotations

import json
import statistics

import pytest

from specdec.benchmark import engine_mtp


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))


def test_engine_mtp_case_runs_every_method_and_reports(cache, tmp_path):
    out = tmp_path / "out"
    res = engine_mtp.run(out, n_gen=12, reps=2, accuracies=(0.9,), slots=(2,), peers=False,
                         size="tiny", log=lambda s: None)
    rows = {r["method"]: r for r in res["rows"]}
    assert set(rows) == {engine_mtp.PLAIN, engine_mtp.FIXED, engine_mtp.ADAPTIVE, engine_mtp.LLAMA}
    assert rows[engine_mtp.PLAIN]["vs_plain"] == 1.0
    for name in (engine_mtp.FIXED, engine_mtp.ADAPTIVE):
        r = rows[name]
        assert len(r["tok_s_runs"]) == 2 and r["tok_s"] > 0
        assert r["vs_plain"] == pytest.approx(r["tok_s"] / rows[engine_mtp.PLAIN]["tok_s"])
        assert r["vs_llama_server"] is None        # no peer ran
        plain_runs = rows[engine_mtp.PLAIN]["tok_s_runs"]
        assert r["vs_plain_paired"] == pytest.approx(statistics.median(
            a / b for a, b in zip(r["tok_s_runs"], plain_runs)))
    assert rows[engine_mtp.FIXED]["acceptance"] > 0.5
    # the peer's row says why it did not run
    assert "tok_s" not in rows[engine_mtp.LLAMA]
    assert rows[engine_mtp.LLAMA]["note"] == "peers disabled (--no-peers)"
    assert json.loads((out / "engine-mtp.json").read_text())["rows"] == res["rows"]
    md = engine_mtp.markdown(res)
    assert f"| 90% | 2 | {engine_mtp.FIXED} |" in md and "peers disabled" in md


def test_prompts_differ_per_request():
    ps = engine_mtp.prompts(8)
    assert len(set(ps)) == 8


def test_gpu_placement_reaches_both_sides(cache, tmp_path, monkeypatch):
    """``--gpu``'s Engine step: every Engine is asked for ``n_gpu_layers`` and llama-server for
    ``-ngl 99``; without a device the server keeps its layers on the CPU (``-ngl 0``)."""
    import specdec
    from pathlib import Path

    asked = []
    real = specdec.Engine

    def engine(model, **kw):   # this CPU build has no device: record the ask, decode on the CPU
        asked.append(kw["n_gpu_layers"])
        return real(model, **{**kw, "n_gpu_layers": 0})

    monkeypatch.setattr(specdec, "Engine", engine)
    res = engine_mtp.run(tmp_path / "out", n_gen=8, reps=1, accuracies=(0.9,), slots=(1,),
                         peers=False, size="tiny", n_gpu_layers=-1, log=lambda s: None)
    assert asked == [-1, -1, -1] and res["n_gpu_layers"] == -1
    argv = engine_mtp.llama_server_argv(Path("llama-server"), "m.gguf", 1234, 4, 2, -1)
    assert argv[argv.index("-ngl") + 1] == "99" and argv[argv.index("-np") + 1] == "4"
    cpu = engine_mtp.llama_server_argv(Path("llama-server"), "m.gguf", 1234, 4, 2, 0)
    assert "-ngl" not in cpu or cpu[cpu.index("-ngl") + 1] == "0"


def test_paired_ratio_compares_passes_of_one_round():
    """A drifting machine: plain and the method slow down together. The ratio of medians
    mixes rounds; the paired ratio compares each round's passes."""
    plain = [{"tok_s": 100.0}, {"tok_s": 50.0}, {"tok_s": 80.0}]
    method = [{"tok_s": 110.0}, {"tok_s": 55.0}, {"tok_s": 88.0}]
    assert engine_mtp.paired_ratio(method, plain) == pytest.approx(1.1)
    assert engine_mtp.paired_ratio([], plain) is None
