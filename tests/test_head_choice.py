"""The LM head chosen by measurement (``lazy_logits="auto"``, specdec.head_choice): the
choice is timed once per model, CPU and setting, recorded in the cache dir and honoured
by later loads; True / False override it; a record that does not parse or was made for
something else is ignored; output is the same whichever head runs."""
import json

import numpy as np
import pytest

from specdec import Batch, Decoder, head_choice
from specdec.head_choice import HeadChoice, HeadTimes


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    return tmp_path


def _records(cache_dir):
    d = cache_dir / head_choice.KIND
    return sorted(d.glob("*.json")) if d.is_dir() else []


def _no_measuring(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("measured although a valid record was there")
    monkeypatch.setattr(head_choice, "measure", refuse)


def _fields(path, **kw):
    """The key fields of a Decoder like the ones the tests build (ngram, n_max 4)."""
    with Decoder(path, drafter="ngram", lazy_logits=True, **kw) as dec:
        return head_choice.key_fields(dec.ctx, verify_rows=5, exact=kw.get("exact", False))


def _plant(path, lazy, **kw):
    fields = _fields(path, **kw)
    head_choice.save(head_choice.record_path(fields), fields,
                     HeadChoice(head_choice.EVERY if lazy else 0, HeadTimes(1.0, 2.0, 3.0, 4.0),
                                cached=False))
    return fields


def test_auto_measures_once_and_records_the_choice(tiny_dense_path, cache_dir, monkeypatch):
    # (a tiny model's decodes take tens of microseconds, where a loaded machine's jitter can
    # exceed the noise bounds: the recording is what is checked here, the bounds below)
    monkeypatch.setattr(head_choice, "NOISY_SPREAD", float("inf"))
    monkeypatch.setattr(head_choice, "IMPLAUSIBLE", float("inf"))
    dec = Decoder(tiny_dense_path, drafter="ngram")
    (rec_path,) = _records(cache_dir)
    rec = json.loads(rec_path.read_text())
    assert rec["verify_rows"] == 5 and rec["exact"] is False and rec["n_threads"] == dec.ctx.n_threads
    t = rec["times"]
    assert all(t[k] > 0 for k in ("lazy_plain", "graph_plain", "lazy_verify", "graph_verify"))
    upto = HeadTimes(**t).upto
    lazy = upto == head_choice.EVERY
    assert rec["upto"] == upto and dec.ctx.lazy_head_upto == (0 if lazy else upto)
    assert (dec.ctx.lazy_logits != "off") == (upto > 0)
    out = dec.generate([11, 52, 97], max_tokens=12).tokens
    dec.close()
    _no_measuring(monkeypatch)
    with Decoder(tiny_dense_path, drafter="ngram") as again:   # read back, not timed
        assert (again.ctx.lazy_logits != "off") == (upto > 0)
        assert again.generate([11, 52, 97], max_tokens=12).tokens == out
    assert _records(cache_dir) == [rec_path]


@pytest.mark.parametrize("lazy", [True, False])
def test_a_recorded_choice_is_honoured(tiny_dense_path, monkeypatch, lazy):
    _plant(tiny_dense_path, lazy)
    _no_measuring(monkeypatch)
    with Decoder(tiny_dense_path, drafter="ngram") as dec:
        assert (dec.ctx.lazy_logits == "off") == (not lazy)
        dec.generate([11, 52, 97], max_tokens=4)
        assert dec.ctx.lazy_logits == ("on" if lazy else "off")


def test_true_and_false_override_the_record(tiny_dense_path, cache_dir, monkeypatch):
    _plant(tiny_dense_path, False)
    _no_measuring(monkeypatch)
    with Decoder(tiny_dense_path, drafter="ngram", lazy_logits=True) as dec:
        dec.generate([11, 52, 97], max_tokens=4)
        assert dec.ctx.lazy_logits == "on"
    before = [p.read_text() for p in _records(cache_dir)]
    with Decoder(tiny_dense_path, drafter="ngram", lazy_logits=False) as dec:
        assert dec.ctx.lazy_logits == "off"
        with pytest.raises(ValueError, match="without lazy_logits"):
            dec.ctx.set_lazy_head(True)
    assert [p.read_text() for p in _records(cache_dir)] == before
    with pytest.raises(ValueError, match="lazy_logits must be True, False or 'auto'"):
        Decoder(tiny_dense_path, lazy_logits="yes")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other cpu", "other model",
                                    "not an int", "no times"])
def test_a_corrupt_or_foreign_record_is_ignored(tiny_dense_path, monkeypatch, damage):
    fields = _plant(tiny_dense_path, True)
    path = head_choice.record_path(fields)
    rec = json.loads(path.read_text())
    if damage == "garbage":
        path.write_bytes(b"\x00\xffnot json")
    elif damage == "truncated":
        path.write_text(path.read_text()[:40])
    elif damage == "other cpu":
        path.write_text(json.dumps(dict(rec, cpu="some other CPU")))
    elif damage == "other model":
        path.write_text(json.dumps(dict(rec, model="0123456789abcdef")))
    elif damage == "not an int":
        path.write_text(json.dumps(dict(rec, upto="yes")))
    else:
        path.write_text(json.dumps({k: v for k, v in rec.items() if k != "times"}))
    calls = []

    def fake(ctx, *, plain_rows, verify_rows):   # llama.cpp's head "measures" faster
        calls.append((plain_rows, verify_rows))
        return HeadTimes(2.0, 1.0, 4.0, 3.0)
    monkeypatch.setattr(head_choice, "measure", fake)
    with Decoder(tiny_dense_path, drafter="ngram") as dec:
        assert dec.ctx.lazy_logits == "off"
    assert calls == [(1, 5)]
    assert head_choice.load(path, fields) == HeadChoice(0, HeadTimes(2.0, 1.0, 4.0, 3.0),
                                                        cached=True)


def test_measure_times_both_heads_and_leaves_the_context_as_it_was(tiny_dense_path):
    with Decoder(tiny_dense_path, drafter="ngram", lazy_logits=True) as dec:
        times = head_choice.measure(dec.ctx, plain_rows=1, verify_rows=5)
        assert times is not None and min(times.lazy_plain, times.graph_plain,
                                         times.lazy_verify, times.graph_verify) > 0
        assert dec.ctx.lazy_logits == "on" and dec.ctx.seq_pos_max(0) == -1
        plain = Decoder(tiny_dense_path, lazy_logits=False)
        assert dec.generate([11, 52, 97], max_tokens=16).tokens == \
            plain.generate([11, 52, 97], max_tokens=16).tokens


@pytest.mark.parametrize("lazy", [True, False])
def test_exact_output_whichever_head_was_chosen(tiny_dense_path, monkeypatch, lazy):
    """exact=True: speculative greedy output equals exact plain output with either head."""
    _plant(tiny_dense_path, lazy, exact=True)
    _no_measuring(monkeypatch)
    prompt = [11, 52, 97, 140, 11, 52]
    with Decoder(tiny_dense_path, drafter="ngram", exact=True) as dec:
        assert (dec.ctx.lazy_logits == "off") == (not lazy)
        got = dec.generate(prompt, max_tokens=40).tokens
    with Decoder(tiny_dense_path, exact=True, lazy_logits=False) as plain:
        assert got == plain.generate(prompt, max_tokens=40).tokens


def test_the_bench_times_the_head_alone_on_both_paths(tiny_dense):
    from specdec.benchmark.head_times import VERIFY_ROWS, head_line, time_heads
    h = time_heads(tiny_dense, 2, 256)
    v = VERIFY_ROWS
    ms = [h["lazy_1_ms"], h["graph_1_ms"], h[f"lazy_{v}_ms"], h[f"graph_{v}_ms"]]
    assert min(ms) > 0
    assert h["faster"] == ("lazy" if ms[0] + ms[2] <= ms[1] + ms[3] else "llama.cpp")
    line = head_line(h)
    assert f"{h['lazy_1_ms']:.2f} / {h['graph_1_ms']:.2f}" in line and h["faster"] in line


@pytest.mark.parametrize("exact", [False, True])
def test_grammar_rows_keep_the_lazy_head_where_llama_cpps_won(tiny_bytes_path, monkeypatch,
                                                               exact):
    """Where llama.cpp's head was chosen, decodes holding a grammar's rows still stop at the
    norm: a row that allows few tokens gets their logits alone (the sparse path), and the
    output is the same as with llama.cpp's head; unconstrained decodes keep llama.cpp's."""
    _plant(tiny_bytes_path, False, exact=exact)
    _no_measuring(monkeypatch)
    rx = r"[0-9]{3}-[a-c]{2}"
    with Decoder(tiny_bytes_path, drafter="ngram", exact=exact) as dec, \
            Decoder(tiny_bytes_path, drafter="ngram", exact=exact, lazy_logits=False) as ref:
        assert dec.ctx.lazy_logits == "off" and dec.ctx.lazy_head_grammar
        free = dec.generate("xyz", max_tokens=12)
        assert dec.ctx.lazy_logits_masked_rows == 0
        assert free.tokens == ref.generate("xyz", max_tokens=12).tokens
        got = dec.generate("xyz", max_tokens=12, regex=rx)
        assert dec.ctx.lazy_logits_masked_rows > 0 and dec.ctx.lazy_logits == "off"
        assert got.tokens == ref.generate("xyz", max_tokens=12, regex=rx).tokens
        assert ref.ctx.lazy_logits_masked_rows == 0
        with pytest.raises(ValueError, match="without lazy_logits"):
            ref.ctx.set_lazy_head(False, grammar=True)


@pytest.mark.parametrize("times", [HeadTimes(2.3, 0.25, 2.3, 0.25, spread=1.1),
                                   HeadTimes(1.0, 1.1, 2.0, 2.1, spread=4.0)],
                         ids=["implausible", "runs-disagree"])
def test_a_disturbed_measurement_is_used_not_recorded(tiny_dense_path, cache_dir, monkeypatch,
                                                      times):
    """A measurement taken while other processes held the cores (a head 9x the other, or
    runs of one path 4x apart) decides that load's head, and is not recorded: the next load
    measures again instead of keeping a wrong choice for good."""
    calls = []

    def fake(ctx, *, plain_rows, verify_rows):
        calls.append((plain_rows, verify_rows))
        return times
    monkeypatch.setattr(head_choice, "measure", fake)
    assert not times.steady
    for _ in range(2):
        with Decoder(tiny_dense_path, drafter="ngram") as dec:
            assert (dec.ctx.lazy_logits != "off") == (times.upto > 0)
    assert calls == [(1, 5), (1, 5)]
    assert _records(cache_dir) == []
    assert HeadTimes(1.0, 1.2, 2.0, 2.5, spread=1.9).steady


def test_measure_reports_how_far_its_runs_agree(tiny_dense_path):
    with Decoder(tiny_dense_path, drafter="ngram", lazy_logits=True) as dec:
        times = head_choice.measure(dec.ctx, plain_rows=1, verify_rows=5)
    assert times is not None and times.spread >= 1.0


@pytest.mark.parametrize("times, upto", [
    # the lazy head wins the plain step and loses the verify: where their times cross
    (HeadTimes(12.0, 14.0, 247.0, 239.0, plain_rows=1, verify_rows=65), 1 + 64 * 2 // 10),
    # ... found between the two shapes on either side of the crossing (Gemma on an EPYC)
    (HeadTimes(12.1, 14.3, 247.0, 238.0, plain_rows=1, verify_rows=65, mid_rows=17,
               lazy_mid=74.5, graph_mid=91.2), 17 + int(48 * 16.7 / (16.7 + 9.0))),
    (HeadTimes(1.0, 2.0, 3.0, 4.0, plain_rows=1, verify_rows=5), head_choice.EVERY),
    (HeadTimes(1.0, 2.0, plain_rows=1), head_choice.EVERY),          # nothing drafts
    (HeadTimes(2.0, 1.0, 3.0, 4.0, plain_rows=1, verify_rows=5), 0),  # loses the plain step
    (HeadTimes(1.0, 1.0, 5.0, 4.0, plain_rows=2, verify_rows=9), 2),  # a tie goes lazy
], ids=["two-shapes", "mid-shape", "wins-all", "plain-only", "loses-plain", "tie"])
def test_the_lazy_head_takes_the_decodes_whose_rows_it_is_faster_for(times, upto):
    assert times.upto == upto
    choice = HeadChoice(times.upto, times, cached=False)
    assert choice.lazy == (upto == head_choice.EVERY)
    assert choice.upto == upto


def test_decodes_up_to_upto_rows_take_the_lazy_head_the_rest_llama_cpps(tiny_dense_path,
                                                                         monkeypatch):
    """A choice of ``upto`` rows: plain steps (one row) run the lazy head, a verify of more
    rows llama.cpp's; the output is the same as with either head alone."""
    monkeypatch.setattr(head_choice, "measure", lambda ctx, *, plain_rows, verify_rows: HeadTimes(
        1.0, 2.0, 9.0, 6.0, plain_rows=plain_rows, verify_rows=verify_rows))
    prompt = [11, 52, 97, 140, 11, 52, 97, 140, 11, 52, 97, 140]
    with Decoder(tiny_dense_path, drafter="ngram", n_max=8) as dec, \
            Decoder(tiny_dense_path, drafter="ngram", n_max=8, lazy_logits=False) as ref:
        assert dec.ctx.lazy_head_upto == 1 + 8 * 1 // 4
        assert dec.ctx.lazy_logits == "pending"     # the first decode finds the weight
        passes0 = dec.ctx.lazy_logits_passes
        for n, expect_lazy in ((1, False), (1, True), (3, True), (4, False), (9, False)):
            b = Batch(n)
            for i in range(n):
                b.add(11 + i, i, 0, True)
            dec.ctx.seq_rm(0, -1, -1)
            dec.ctx.decode(b)
            got = np.array(dec.ctx.logits(n - 1))
            ref.ctx.seq_rm(0, -1, -1)
            ref.ctx.decode(b)
            assert np.allclose(got, ref.ctx.logits(n - 1), atol=1e-3)
            passes = dec.ctx.lazy_logits_passes
            assert (passes != passes0) == expect_lazy, n
            passes0 = passes
        assert dec.ctx.lazy_logits == "on up to 3 rows"
        dec.ctx.seq_rm(0, -1, -1)
        assert dec.generate(prompt, max_tokens=24).tokens == \
            ref.generate(prompt, max_tokens=24).tokens
        with pytest.raises(ValueError, match="upto must be an int"):
            dec.ctx.set_lazy_head(False, upto=-1)
        assert dec.ctx.lazy_head_upto == 3
        dec.ctx.set_lazy_head(False, upto=0)
        assert dec.ctx.lazy_logits == "off"
        with pytest.raises(ValueError, match="without lazy_logits"):
            ref.ctx.set_lazy_head(False, upto=2)


def test_an_engine_times_the_heads_up_to_its_widest_decode(tiny_dense_path, monkeypatch):
    """Every slot's verify in one decode: an Engine of 4 slots at n_max 4 decodes up to 20
    rows, so its heads are timed up to 20 (a plain Engine: one row per slot), at most
    ``HEAD_ROWS_TIMED``."""
    from specdec import Engine, _setup
    calls = []

    def fake(ctx, *, plain_rows, verify_rows):
        calls.append(verify_rows)
        return HeadTimes(1.0, 2.0, 3.0, 4.0, plain_rows=plain_rows, verify_rows=verify_rows)
    monkeypatch.setattr(head_choice, "measure", fake)
    for kw, rows in ((dict(drafters=["ngram"], n_max=4), 20), (dict(), 4),
                     (dict(drafters=["ngram"], n_max=40), 128)):
        with Engine(tiny_dense_path, n_slots=4, n_ctx=1024, **kw) as eng:
            assert calls[-1] == min(rows, _setup.HEAD_ROWS_TIMED) and eng is not None
    assert _setup.HEAD_ROWS_TIMED == 128


def test_exact_output_with_the_head_chosen_per_decode(tmp_path, monkeypatch):
    """exact=True with ``upto`` between a plain step and a verify (the lazy head for short
    decodes, llama.cpp's for long ones; a Q8_0 head, which the lazy head serves in exact
    mode): speculative greedy output equals exact plain output with either head alone."""
    from specdec.testing import write_tiny_dense
    path = str(write_tiny_dense(tmp_path / "tiny-q8_0.gguf", dtype="q8_0"))
    monkeypatch.setattr(head_choice, "measure", lambda ctx, *, plain_rows, verify_rows: HeadTimes(
        1.0, 2.0, 9.0, 6.0, plain_rows=plain_rows, verify_rows=verify_rows))
    prompt = [11, 52, 97, 140, 11, 52, 97, 140, 11, 52]
    with Decoder(path, drafter="ngram", n_max=8, exact=True) as dec:
        got = dec.generate(prompt, max_tokens=40)
        upto = dec.ctx.lazy_head_upto
        assert 2 <= upto < 9 and dec.ctx.lazy_logits == f"on up to {upto} rows"
        assert dec.ctx.lazy_logits_passes[0] > 0 and got.stats.accepted > upto   # both heads ran
    for lazy in (True, False):
        with Decoder(path, exact=True, lazy_logits=lazy) as plain:
            assert got.tokens == plain.generate(prompt, max_tokens=40).tokens
