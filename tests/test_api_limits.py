"""The API cases that used to take the process down (issue 17), and the rules they broke:
argument types and ranges checked on every Model / Context entry point, the limits llama.cpp
asserts (n_outputs_max, n_rollback) checked before the call, views that outlive their context,
integer overflow, contexts smaller than llama.cpp's allocation granularity, and drafters
that try to change the target's memory.
"""
import gc

import numpy as np
import pytest

import specdec
from specdec import Batch, Context, ContextFullError, Decoder, DrafterError
from specdec._core import TargetView
from specdec.drafters import Drafter

REF_PROMPT = [1, 2, 3, 4, 5, 1, 2, 3]


@pytest.fixture(scope="module")
def qwen35(tiny_qwen35_nomtp_path):
    return specdec.Model(tiny_qwen35_nomtp_path)


def _decode(ctx, n, n_out, seq=0, pos0=0):
    b = Batch(max(n, 1), n_seq_max=ctx.n_seq_max)
    for i in range(n):
        b.add(1 + i % 50, pos0 + i, seq, i >= n - n_out)
    ctx.decode(b)


# --- the 8 API cases of issue 17 -------------------------------------------------------------


def test_vocab_compatible_none(tiny_dense):
    with pytest.raises(TypeError):
        tiny_dense.vocab_compatible(None)
    assert tiny_dense.vocab_compatible(tiny_dense)


def test_more_output_rows_than_n_outputs_max(tiny_dense):
    ctx = Context(tiny_dense, n_ctx=256, n_outputs_max=1)
    with pytest.raises(ValueError, match="n_outputs_max"):
        _decode(ctx, 3, 3)
    _decode(ctx, 3, 1)          # one output row fits, and the context is still usable
    assert ctx.logits(2).shape == (tiny_dense.n_vocab,)


@pytest.mark.parametrize("n_batch", [512, 2048])
def test_n_rs_seq_1000(qwen35, n_batch):
    """llama.cpp keeps a sequence's last n_rollback + 1 tokens in one ubatch and asserts
    n_ubatch > n_rollback + 1 (its n_rs_seq): refused up front, whatever n_batch made n_ubatch."""
    if n_batch <= 1001:
        with pytest.raises(ValueError, match="n_ubatch"):
            Context(qwen35, n_rollback=1000, n_batch=n_batch)
    else:
        ctx = Context(qwen35, n_rollback=1000, n_batch=n_batch, n_ctx=n_batch)
        _decode(ctx, 2, 1)
        assert ctx.n_rollback == 1000


def test_n_rs_seq_64_then_two_tokens(qwen35):
    with pytest.raises(ValueError, match="n_ubatch >= 66"):
        Context(qwen35, n_rollback=64, n_batch=64)
    with pytest.raises(ValueError, match="n_ubatch"):
        Context(qwen35, n_rollback=64, n_batch=512, n_ubatch=32)
    with pytest.raises(ValueError, match="n_ubatch"):
        Context(qwen35, n_rollback=64, n_ctx=48)      # llama.cpp caps n_batch at n_ctx
    ctx = Context(qwen35, n_rollback=64, n_batch=66)
    _decode(ctx, 2, 1)
    assert ctx.seq_rm(0, 1, -1)


def test_logits_view_after_close(tiny_dense):
    """A view keeps its context's memory: read after close() it holds what it held before."""
    ctx = Context(tiny_dense, n_ctx=256)
    _decode(ctx, 4, 2)
    view = ctx.logits(3)
    rows = ctx.logits(2)
    before = np.array(view)
    ctx.close()
    with pytest.raises(RuntimeError, match="closed"):
        ctx.logits(3)
    junk = [np.ones(1 << 16, np.float32) for _ in range(64)]   # reuse freed memory, if any
    assert np.array_equal(view, before)
    assert np.isfinite(rows).all()
    del view, rows, junk
    gc.collect()
    ctx.close()                 # twice is fine


def test_view_outlives_its_context_object(tiny_dense):
    view = Context(tiny_dense, n_ctx=256)
    _decode(view, 3, 1)
    view = view.logits(2)       # the only reference left to the context is the view's
    gc.collect()
    assert np.isfinite(view).all()


# --- entry points: types and ranges ------------------------------------------------------


BAD_INTS = [None, 1.5, "3", True, 2**31, -2**31 - 1, 2**64, [1]]


@pytest.mark.parametrize("bad", BAD_INTS, ids=repr)
def test_context_int_arguments(tiny_dense, bad):
    ctx = Context(tiny_dense, n_ctx=256, n_seq_max=2, n_batch=16)
    _decode(ctx, 3, 1)
    calls = [lambda: ctx.logits(bad), lambda: ctx.seq_rm(bad), lambda: ctx.seq_rm(0, bad),
             lambda: ctx.seq_cp(bad, 1), lambda: ctx.seq_keep(bad), lambda: ctx.seq_pos_max(bad),
             lambda: ctx.seq_pos_min(bad), lambda: ctx.save_state(bad),
             lambda: ctx.prepare_logits(bad, 1), lambda: ctx.set_threads(bad)]
    for call in calls:
        with pytest.raises((TypeError, ValueError)):
            call()
    for kw in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_rollback", "n_outputs_max",
               "n_threads"):
        if bad is None and kw in ("n_ubatch", "n_threads"):
            continue            # None: the default
        with pytest.raises((TypeError, ValueError)):
            Context(tiny_dense, **{kw: bad})
    assert int(np.argmax(ctx.logits(2))) >= 0


@pytest.mark.parametrize("bad", [None, 5, 1.0, b"\xff", object()], ids=repr)
def test_model_arguments(tiny_dense, bad):
    for call in (lambda: tiny_dense.vocab_compatible(bad), lambda: tiny_dense.meta(bad),
                 lambda: specdec.Model(bad), lambda: tiny_dense.token_text(bad),
                 lambda: tiny_dense.detokenize(bad), lambda: tiny_dense.tokenize(bad)):
        try:
            call()
        except (TypeError, ValueError, FileNotFoundError):
            pass
    assert tiny_dense.meta("general.architecture") == "llama"


def test_integer_overflow_is_value_error(tiny_dense):
    dec = Decoder(tiny_dense, drafter="ngram", n_ctx=256)
    for kw in ({"max_tokens": 2**31}, {"max_tokens": 2**64},
               {"sampling": {"temperature": 0.5, "top_k": 2**31}},
               {"sampling": {"temperature": 0.5, "top_k": 2**63}},
               {"sampling": {"temperature": 0.5, "seed": 2**64}}):
        with pytest.raises(ValueError):
            dec.generate(REF_PROMPT, **kw)
    for kw in ({"n_ctx": 2**31}, {"n_batch": 2**40}, {"n_threads": 2**33}, {"n_seq_max": 2**31},
               {"n_ubatch": 2**32}):
        with pytest.raises(ValueError):
            Decoder(tiny_dense, **kw)
    ctx = Context(tiny_dense, n_ctx=256)
    for call in (lambda: ctx.seq_rm(0, 2**31), lambda: ctx.logits(2**40),
                 lambda: ctx.seq_cp(0, 0, 2**40), lambda: Batch(2**31),
                 lambda: specdec.Model(tiny_dense.path, n_gpu_layers=2**31)):
        with pytest.raises(ValueError):
            call()
    assert dec.generate(REF_PROMPT, max_tokens=3).finish_reason == "length"


# --- contexts smaller than llama.cpp's granularity -----------------------------------------


@pytest.mark.parametrize("n_ctx", [1, 2, 8, 32, 300])
def test_small_context_holds_what_was_asked(tiny_dense, n_ctx):
    """llama.cpp allocates whole multiples of 256 positions; the context holds n_ctx."""
    ctx = Context(tiny_dense, n_ctx=n_ctx)
    assert ctx.n_ctx == n_ctx and ctx.n_ctx_seq == n_ctx
    assert ctx.n_batch == min(n_ctx, 512)
    _decode(ctx, min(n_ctx, 4), 1)
    with pytest.raises(ContextFullError):
        _decode(ctx, 1, 1, pos0=n_ctx)


@pytest.mark.parametrize("n_ctx", [1, 2, 5])
def test_small_context_with_a_drafter_says_n_ctx(tiny_dense, n_ctx):
    with pytest.raises(ValueError, match=f"n_ctx={n_ctx} is too small for drafts of n_max=4"):
        Decoder(tiny_dense, drafter="ngram", n_max=4, n_ctx=n_ctx)
    dec = Decoder(tiny_dense, drafter="ngram", n_max=4, n_ctx=8)
    r = dec.generate([1, 2], max_tokens=50)
    assert r.finish_reason in ("context", "length") and len(r.tokens) == 8 - 2 + 1
    assert r.tokens == Decoder(tiny_dense, n_ctx=8).generate([1, 2], max_tokens=50).tokens


# --- drafters see the target read-only ----------------------------------------------------


class Meddler(Drafter):
    """Reads what a drafter may read, then tries one change of the target's memory."""

    def __init__(self, attack):
        super().__init__("meddler")
        self.attack = attack
        self.seen = None

    def propose(self, seq, last_token, n_max):
        t = self.target
        self.seen = (t.n_vocab, t.model.arch, t.seq_pos_max(seq), t.tokenize("ab"),
                     float(t.logits(-1)[0]) if t.lazy_logits == "off" else None)
        if self.attack:
            self.attack(t)
        return self.history(seq)[-n_max:]


@pytest.mark.parametrize("attack", [
    lambda t: t.seq_rm(0), lambda t: t.clear(), lambda t: t.seq_rm(0, 2, -1),
    lambda t: t.decode(Batch(1)), lambda t: t.load_state(b"x"), lambda t: t.close(),
    lambda t: t.set_mtp_hidden(None), lambda t: t.seq_keep(0), lambda t: t.interrupt(),
    lambda t: setattr(t, "_ctx", None), lambda t: t._ctx,
], ids=["seq_rm", "clear", "seq_rm_tail", "decode", "load_state", "close", "set_mtp_hidden",
        "seq_keep", "interrupt", "set_ctx", "get_ctx"])
def test_drafter_cannot_mutate_the_target(tiny_dense, attack):
    ref = Decoder(tiny_dense, n_ctx=256).generate(REF_PROMPT, max_tokens=12).tokens
    d = Meddler(attack)
    dec = Decoder(tiny_dense, drafter=d, n_ctx=256, lazy_logits=False)
    assert isinstance(d.target, TargetView)
    with pytest.raises(DrafterError, match="meddler"):
        dec.generate(REF_PROMPT, max_tokens=12)
    # switched off, the same drafter's reads work and the output is the target's own
    d.attack = None
    assert dec.generate(REF_PROMPT, max_tokens=12).tokens == ref
    assert d.seen[0] == tiny_dense.n_vocab and d.seen[1] == "llama"
    with pytest.raises(AttributeError):
        d.target = dec.ctx


def test_guarded_drafter_gets_the_view_too(tiny_dense):
    ref = Decoder(tiny_dense, n_ctx=256).generate(REF_PROMPT, max_tokens=12).tokens
    d = Meddler(lambda t: t.seq_rm(0))
    dec = Decoder(tiny_dense, drafter=d, n_ctx=256, drafter_timeout=5.0, on_drafter_error="disable")
    with pytest.warns(RuntimeWarning, match="read-only"):
        r = dec.generate(REF_PROMPT, max_tokens=12)
    assert r.tokens == ref
