"""Context: decoding, zero-copy outputs, memory operations, checkpoints, and the
bad inputs that llama.cpp would abort on, which must raise instead."""
import threading
import time

import numpy as np
import pytest

import specdec
from specdec import Batch, Context, ContextFullError


def _prompt_batch(tokens, seq=0, start=0, capacity=None):
    b = Batch(capacity or max(len(tokens), 1))
    for i, t in enumerate(tokens):
        b.add(t, start + i, seq, i == len(tokens) - 1)
    return b


def test_no_amx_in_build():
    # AMX tile instructions raise SIGILL on these VMs: the build must leave them out
    assert "AMX" not in specdec.system_info()


def test_batched_decode_on_quantized_model(gemma):
    """A batched matmul on Q4_K weights (the path AMX would take) runs and matches
    token-by-token decoding closely."""
    toks = gemma.tokenize("The capital of France is Paris. The capital of Italy is")
    ctx = Context(gemma, n_ctx=256, n_batch=64)
    b = Batch(64)
    for i, t in enumerate(toks):
        b.add(t, i, 0, True)
    ctx.decode(b)
    batched = np.stack([np.array(ctx.logits(i)) for i in range(len(toks))])
    ctx.clear()
    one = Batch(1)
    single = []
    for i, t in enumerate(toks):
        one.clear()
        one.add(t, i, 0, True)
        ctx.decode(one)
        single.append(np.array(ctx.logits()))
    single = np.stack(single)
    assert np.isfinite(batched).all()
    assert (batched.argmax(1) == single.argmax(1)).mean() > 0.9
    # batched kernels round differently (see exact mode): close, relative to each row's spread
    # (measured: max 0.3, mean 0.03 of a row's std on an AMD EPYC; garbage would be ~1)
    diff, scale = np.abs(batched - single), single.std(axis=1)
    assert (diff.max(axis=1) < 0.5 * scale).all()
    assert diff.mean() < 0.1 * scale.mean()


def test_interleaved_batch_kernels(gemma):
    """A batch of 4 sequences' 20 rows each (80 rows in one KV cache) decodes with the CPU's
    reference kernels (see _batch_invariant.h): rows close to each sequence decoded alone,
    and the switch is off again after it: a one-sequence batch of 128 rows, decoded before and
    after, gives the same bits (with the switch left on, its tiled kernels would not run)."""
    ctx = Context(gemma, n_ctx=4 * 256, n_batch=128, n_seq_max=4, kv_unified=True)
    b = Batch(128, n_seq_max=4)
    long_ = [(7 * i) % 5000 + 100 for i in range(128)]

    def one_sequence_128():
        b.clear()
        for i, t in enumerate(long_):
            b.add(t, i, 0, True)
        ctx.decode(b)
        out = np.stack([np.array(ctx.logits(i)) for i in range(128)])
        ctx.clear()
        return out

    before = one_sequence_128()
    prompts = [gemma.tokenize(f"Sequence {s}: the numbers {s} {s + 1} {s + 2} go on and on")
               for s in range(4)]
    rows = [[(31 * s + 11 * r) % 3000 + 200 for r in range(20)] for s in range(4)]

    def decode_rows(seqs):
        b.clear()
        for s in seqs:
            for r, t in enumerate(rows[s]):
                b.add(t, len(prompts[s]) + r, s, True)
        ctx.decode(b)
        out = {s: np.stack([np.array(ctx.logits(i * 20 + r)) for r in range(20)])
               for i, s in enumerate(seqs)}
        for s in seqs:
            ctx.seq_rm(s, len(prompts[s]), -1)
        return out

    for s, p in enumerate(prompts):
        b.clear()
        for i, t in enumerate(p):
            b.add(t, i, s, False)
        ctx.decode(b)
    together = decode_rows(range(4))
    for s in range(4):
        alone = decode_rows([s])[s]
        # other kernels, other rounding, amplified through 18 layers on these arbitrary tokens
        # (20 rows in one batch against one at a time differ as much): close, not equal.
        # Measured: correlation >= 0.997, mean difference <= 0.08 of a row's spread
        # (another sequence's rows: correlation 0.73-0.98)
        x = together[s] - together[s].mean(1, keepdims=True)
        y = alone - alone.mean(1, keepdims=True)
        corr = (x * y).sum(1) / np.sqrt((x * x).sum(1) * (y * y).sum(1))
        assert corr.min() > 0.99
        assert np.abs(together[s] - alone).mean() < 0.2 * alone.std(axis=1).mean()
    ctx.clear()
    assert np.array_equal(one_sequence_128(), before)


def test_logits_are_zero_copy_views(gemma):
    ctx = Context(gemma, n_ctx=128, n_batch=16)
    toks = gemma.tokenize("Hello")
    ctx.decode(_prompt_batch(toks))
    a = ctx.logits()
    b = ctx.logits(len(toks) - 1)
    assert a.shape == (gemma.n_vocab,) and a.dtype == np.float32
    assert not a.flags.writeable and not a.flags.owndata
    assert a.ctypes.data == b.ctypes.data  # same memory, no copy
    with pytest.raises(ValueError):
        a[0] = 1.0
    with pytest.raises(IndexError, match="not marked for output"):
        ctx.logits(0)
    with pytest.raises(IndexError, match="out of range"):
        ctx.logits(len(toks))


def test_view_keeps_context_alive(gemma):
    ctx = Context(gemma, n_ctx=64, n_batch=8)
    ctx.decode(_prompt_batch(gemma.tokenize("Hi")))
    v = ctx.logits()
    first = float(v[0])
    del ctx
    assert float(v[0]) == first


def test_memory_ops_and_rollback(gemma):
    ctx = Context(gemma, n_ctx=128, n_batch=32)
    toks = gemma.tokenize("one two three four five six")
    ctx.decode(_prompt_batch(toks))
    ref = np.array(ctx.logits())
    n = len(toks)
    assert ctx.seq_pos_min(0) == 0 and ctx.seq_pos_max(0) == n - 1
    # extend by 3 tokens, roll back, re-decode the last prompt token: same logits
    ctx.decode(_prompt_batch([100, 200, 300], start=n))
    assert ctx.seq_pos_max(0) == n + 2
    assert ctx.seq_rm(0, n - 1, -1)
    assert ctx.seq_pos_max(0) == n - 2
    ctx.decode(_prompt_batch([toks[-1]], start=n - 1))
    assert np.allclose(np.array(ctx.logits()), ref, atol=1e-3)
    ctx.seq_cp(0, 0)  # same seq: no-op, no abort
    ctx.seq_keep(0)
    ctx.clear()
    assert ctx.seq_pos_max(0) == -1


def test_state_checkpoint_roundtrip(gemma):
    ctx = Context(gemma, n_ctx=128, n_batch=32)
    toks = gemma.tokenize("A checkpoint saves the sequence")
    ctx.decode(_prompt_batch(toks))
    state = ctx.save_state(0)
    ref = np.array(ctx.logits())
    assert len(state) > 0
    ctx.decode(_prompt_batch([5, 6, 7], start=len(toks)))
    ctx.clear()
    ctx.load_state(state, 0)
    assert ctx.seq_pos_max(0) == len(toks) - 1
    # the restored cache is the saved one: the last prompt token again gives the same logits
    assert ctx.seq_rm(0, len(toks) - 1, -1)
    ctx.decode(_prompt_batch([toks[-1]], start=len(toks) - 1))
    assert np.allclose(np.array(ctx.logits()), ref, atol=1e-3)
    with pytest.raises(ValueError):
        ctx.load_state(b"garbage" * 10, 0)
    with pytest.raises(ValueError, match="empty"):
        ctx.load_state(b"", 0)


def test_perf_counters(gemma):
    ctx = Context(gemma, n_ctx=64, n_batch=16)
    ctx.decode(_prompt_batch(gemma.tokenize("Hello there")))
    p = ctx.perf()
    assert p["n_p_eval"] + p["n_eval"] > 0 and p["t_p_eval_ms"] + p["t_eval_ms"] >= 0
    ctx.perf_reset()


# --- bad input: one test each, and the object stays usable ---------------------------------

def _still_works(ctx, model):
    ctx.clear()
    ctx.decode(_prompt_batch(model.tokenize("ok")))
    assert np.isfinite(np.array(ctx.logits())).all()


@pytest.mark.parametrize("bad", [-1, 262144, 2**31 - 1])
def test_token_out_of_range(gemma, bad):
    ctx = Context(gemma, n_ctx=64, n_batch=8)
    b = Batch(4)
    b.add(2, 0, 0, False)
    b.add(bad, 1, 0, True)
    with pytest.raises(ValueError, match="out of range"):
        ctx.decode(b)
    _still_works(ctx, gemma)


def test_batch_larger_than_n_batch(gemma):
    ctx = Context(gemma, n_ctx=128, n_batch=8)
    b = Batch(16)
    for i in range(9):
        b.add(2 + i, i, 0, i == 8)
    with pytest.raises(ValueError, match="exceeds n_batch"):
        ctx.decode(b)
    _still_works(ctx, gemma)


def test_batch_overflow(gemma):
    b = Batch(2)
    b.add(1, 0)
    b.add(1, 1)
    with pytest.raises(ValueError, match="full"):
        b.add(1, 2)
    assert len(b) == 2


def test_decode_past_n_ctx(gemma):
    ctx = Context(gemma, n_ctx=32, n_batch=32)
    n = ctx.n_ctx_seq  # llama.cpp pads n_ctx (to 256)
    toks = list(range(1000, 1000 + n))
    for i in range(0, n - 2, 32):
        ctx.decode(_prompt_batch(toks[i:min(i + 32, n - 2)], start=i))
    with pytest.raises(ContextFullError):
        ctx.decode(_prompt_batch(toks[n - 2:] + [5], start=n - 2))
    ctx.decode(_prompt_batch(toks[n - 2:], start=n - 2))
    with pytest.raises(ContextFullError):
        ctx.decode(_prompt_batch([5], start=n))
    _still_works(ctx, gemma)


@pytest.mark.parametrize("kw", [{"n_ctx": 0}, {"n_ctx": -5}, {"n_batch": 0}, {"n_ubatch": -1},
                                {"n_threads": 0}, {"n_seq_max": 0}, {"n_rollback": -1}])
def test_bad_sizes(gemma, kw):
    with pytest.raises(ValueError):
        Context(gemma, **kw)


@pytest.mark.parametrize("kw", [{"capacity": 0}, {"capacity": -3}, {"capacity": 4, "n_seq_max": 0},
                                {"capacity": 4, "n_embd": -1}])
def test_bad_batch_sizes(kw):
    with pytest.raises(ValueError):
        Batch(**kw)


def test_wrong_types(gemma):
    with pytest.raises(TypeError):
        Context(gemma, n_ctx="big")
    b = Batch(2)
    with pytest.raises(TypeError):
        b.add("a", 0)
    with pytest.raises(ValueError):
        b.add(1, -1)


def test_bad_sequence_ids(gemma):
    ctx = Context(gemma, n_ctx=64, n_batch=8, n_seq_max=2)
    with pytest.raises(ValueError, match="sequence id"):
        ctx.seq_rm(5, 0, -1)
    with pytest.raises(ValueError, match="sequence id"):
        ctx.seq_pos_max(-2)
    with pytest.raises(ValueError, match="sequence id"):
        ctx.save_state(7)
    b = Batch(2, n_seq_max=4)
    b.add(2, 0, 3, True)
    with pytest.raises(ValueError, match="sequence id"):
        ctx.decode(b)
    _still_works(ctx, gemma)


def test_empty_batch(gemma):
    ctx = Context(gemma, n_ctx=64, n_batch=8)
    with pytest.raises(ValueError, match="empty"):
        ctx.decode(Batch(4))


def test_mtp_context_on_model_without_mtp_layers(gemma, tiny_qwen35_nomtp_path):
    with pytest.raises(ValueError, match="no MTP"):
        Context(gemma, kind="mtp")
    m = specdec.Model(tiny_qwen35_nomtp_path, load_mtp=True)
    with pytest.raises(ValueError, match="no MTP"):
        Context(m, kind="mtp")
    with pytest.raises(ValueError, match="no MTP"):
        Context(gemma, mtp_hidden="dense")


def test_mtp_context_with_load_mtp_false(tiny_qwen35_path):
    m = specdec.Model(tiny_qwen35_path, load_mtp=False)
    with pytest.raises(ValueError, match="load_mtp"):
        Context(m, kind="mtp")
    Context(m, n_ctx=64)  # a target context still works


def test_n_rs_seq_checks(gemma, tiny_qwen35):
    with pytest.raises(ValueError, match="recurrent"):
        Context(gemma, n_rollback=2)
    ctx = Context(tiny_qwen35, n_ctx=64, n_batch=16, n_rollback=3)
    assert ctx.n_rollback == 3


def test_mtp_context_decodes_token_and_hidden_rows(tiny_qwen35):
    m = tiny_qwen35
    tgt = Context(m, n_ctx=64, n_batch=16, n_rollback=2, mtp_hidden="dense")
    mtp = Context(m, n_ctx=64, n_batch=16, kind="mtp")
    toks = [3, 17, 42, 99]
    tgt.decode(_prompt_batch(toks))
    rows = tgt.mtp_hidden_rows()
    assert rows.shape == (len(toks), m.n_embd_out)
    assert np.array_equal(tgt.mtp_hidden_row(1), rows[1])
    b = Batch(8, n_embd=m.n_embd_out)
    b.add(toks[1], 0, 0, False, embd=rows[0])
    b.add(toks[2], 1, 0, True, embd=rows[1])
    mtp.decode(b)
    assert mtp.logits().shape == (m.n_vocab,)
    assert mtp.mtp_hidden_row().shape == (m.n_embd_out,)
    # an MTP context needs hidden rows, a target context refuses them
    with pytest.raises(ValueError, match="hidden row"):
        mtp.decode(_prompt_batch([1, 2]))
    with pytest.raises(ValueError, match="embedding rows"):
        tgt.decode(b)


def test_recurrent_rollback_limits(tiny_qwen35):
    ctx = Context(tiny_qwen35, n_ctx=64, n_batch=16, n_rollback=3)
    ctx.decode(_prompt_batch(list(range(10, 20))))
    ctx.decode(_prompt_batch([1, 2, 3], start=10))
    # the last decode had 3 tokens: at most 2 can be rolled back
    with pytest.raises(ValueError, match="cannot roll sequence"):
        ctx.seq_rm(0, 10, -1)
    assert ctx.seq_rm(0, 11, -1)
    assert ctx.seq_pos_max(0) == 10
    # only once per decode
    with pytest.raises(ValueError, match="cannot roll sequence"):
        ctx.seq_rm(0, 10, -1)


def test_gil_released_during_decode(gemma):
    """Another Python thread keeps running while a long decode runs."""
    ctx = Context(gemma, n_ctx=1024, n_batch=512)
    toks = (gemma.tokenize("lorem ipsum dolor sit amet " * 60))[:480]
    b = _prompt_batch(toks, capacity=512)
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    c0 = counter[0]
    t0 = time.perf_counter()
    ctx.decode(b)
    dt = time.perf_counter() - t0
    c1 = counter[0]
    stop.set()
    t.join()
    assert dt > 0.05
    assert c1 - c0 > 1000, f"the other thread barely ran ({c1 - c0} loops in {dt:.2f}s)"


def test_context_busy_from_second_thread(gemma):
    ctx = Context(gemma, n_ctx=1024, n_batch=512)
    toks = (gemma.tokenize("lorem ipsum dolor sit amet " * 60))[:480]
    b = _prompt_batch(toks, capacity=512)
    errors = []
    started = threading.Event()

    def other():
        started.wait()
        time.sleep(0.02)
        try:
            ctx.seq_rm(0, -1, -1)
        except specdec.ContextBusyError as e:
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    started.set()
    ctx.decode(b)
    t.join()
    assert errors, "the second thread should have been refused while decoding"
    _still_works(ctx, gemma)
