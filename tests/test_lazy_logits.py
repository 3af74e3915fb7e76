"""The lazy LM head (``Context(lazy_logits=True)``): the decode stops at the final norm and
each row's logits are computed when asked, with ggml's own one-row kernels."""
from __future__ import annotations

import numpy as np
import pytest

from specdec import Batch, Context, Decoder, Model

PROMPT = "The capital of France is Paris. The capital of Germany is"


def _decode(ctx: Context, tokens, pos0: int, outputs) -> None:
    b = Batch(max(8, len(tokens)))
    for i, t in enumerate(tokens):
        b.add(t, pos0 + i, 0, i in outputs)
    ctx.decode(b)


def _pair(model: Model):
    plain = Context(model, n_ctx=256, n_batch=64, n_threads=2)
    lazy = Context(model, n_ctx=256, n_batch=64, n_threads=2, lazy_logits=True)
    return plain, lazy


@pytest.mark.parametrize("which", ["tiny_dense", "gemma"])
def test_rows_equal_llama_logits(request, which):
    """One row: bit-identical to llama.cpp's (the same vec_dot path); several rows: the
    same argmax, and equal within the batched kernels' rounding."""
    model = request.getfixturevalue(which)
    plain, lazy = _pair(model)
    assert lazy.lazy_logits == "pending" and plain.lazy_logits == "off"
    toks = model.tokenize(PROMPT)[:40]
    n = len(toks)
    for c in (plain, lazy):
        _decode(c, toks, 0, {n - 1})
    assert lazy.lazy_logits == "on"     # the first decode found the output weight
    np.testing.assert_array_equal(plain.logits(-1), lazy.logits(-1))  # a normal decode
    for c in (plain, lazy):
        _decode(c, [toks[3]], n, {0})
    np.testing.assert_array_equal(plain.logits(0), lazy.logits(0))
    draft = [toks[5], toks[6], toks[7], toks[1], toks[2]]
    for c in (plain, lazy):
        c.seq_rm(0, n, -1)
        _decode(c, draft, n, {0, 1, 2, 4})     # row 3 is not an output
    lazy.prepare_logits(0, 2)                 # some rows in one pass, the others on demand
    for i in (4, 0, 2, 1):
        a, b = plain.logits(i), lazy.logits(i)
        assert a.shape == b.shape == (model.n_vocab,)
        assert int(a.argmax()) == int(b.argmax())
        np.testing.assert_allclose(a, b, atol=1e-3 * float(a.std()) + 1e-5)
    with pytest.raises(IndexError):
        lazy.logits(3)


def test_several_sequences_fall_back(tiny_dense):
    """A batch of two sequences runs llama.cpp's head (the norm rows could be reordered)."""
    model = tiny_dense
    plain = Context(model, n_ctx=256, n_batch=64, n_threads=2, n_seq_max=2)
    lazy = Context(model, n_ctx=256, n_batch=64, n_threads=2, n_seq_max=2, lazy_logits=True)
    toks = model.tokenize(PROMPT)[:12]
    for c in (plain, lazy):
        b = Batch(64, n_seq_max=2)
        for s in (0, 1):
            for i, t in enumerate(toks[s:]):
                b.add(t, i, s, True)
        c.decode(b)
        c.prepare_logits(0, 4)
    for i in range(2 * len(toks) - 1):
        np.testing.assert_array_equal(plain.logits(i), lazy.logits(i))


@pytest.mark.parametrize("which", ["tiny_dense", "gemma"])
def test_several_sequences_in_one_kv_stream(request, which):
    """One KV stream keeps the batch order (split_simple): the head stays lazy for several
    sequences, rows interleaved, one pass for rows of different sequences."""
    model = request.getfixturevalue(which)
    kw = dict(n_ctx=512, n_batch=64, n_threads=2, n_seq_max=3, kv_unified=True)
    plain, lazy = Context(model, **kw), Context(model, lazy_logits=True, **kw)
    toks = model.tokenize(PROMPT)[:12]
    for c in (plain, lazy):
        b = Batch(64, n_seq_max=3)
        for i in range(len(toks)):          # seq 0, 1, 2, 0, 1, 2, ...
            for s in range(3):
                b.add(toks[(i + s) % len(toks)], i, s, i % 3 != 1)
        c.decode(b)
    assert lazy.lazy_logits == "on"
    lazy.prepare_logits(3, 2)
    for i in range(3 * len(toks)):
        if (i // 3) % 3 == 1:
            with pytest.raises(IndexError):
                lazy.logits(i)
            continue
        a, b = plain.logits(i), lazy.logits(i)
        assert int(a.argmax()) == int(b.argmax())
        np.testing.assert_allclose(a, b, atol=1e-3 * float(a.std()) + 1e-5)


def test_greedy_output_of_a_batch_with_a_shared_head(gemma_path):
    """Several requests verified together through the lazy head (its passes shared by the
    batch) give the output they give with llama.cpp's head. ``generate_batch`` verifies the
    same rows together on both sides: outside exact mode a row's logits depend on what else
    its batch holds, and an Engine forms its batches as requests happen to arrive."""
    prompts = ["def fibonacci(n):\n    if n < 2:\n        return n\n    return",
               "one two three four five six seven eight nine ten eleven twelve",
               "The capital of France is Paris. The capital of Italy is Rome. The capital of"]
    outs = {}
    for lazy in (True, False):
        dec = Decoder(gemma_path, drafter="ngram", n_seq_max=3, n_ctx=256, n_max=4,
                      lazy_logits=lazy)
        outs[lazy] = [r.tokens for r in dec.generate_batch(prompts, max_tokens=24)]
        if lazy:
            assert dec.ctx.lazy_logits == "on"
        dec.close()
    assert outs[True] == outs[False]


def test_refused_where_it_cannot_run(tiny_qwen35):
    with pytest.raises(ValueError, match="lazy_logits"):
        Context(tiny_qwen35, n_ctx=256, kind="mtp", lazy_logits=True)


def test_decoder_uses_it_where_it_can(tiny_dense, tiny_qwen35):
    """``lazy_logits=True`` puts the head on wherever it can run (it finds the output weight
    at the first decode); the default, ``"auto"``, keeps the head it timed faster than the
    other (``test_head_choice``), so it is on, off, or on for decodes of up to some rows
    once decoding."""
    assert Decoder(tiny_dense, drafter="ngram", lazy_logits=True).ctx.lazy_logits == "pending"
    assert Decoder(tiny_dense, lazy_logits=False).ctx.lazy_logits == "off"
    assert Decoder(tiny_qwen35, drafter="mtp", lazy_logits=True).ctx.lazy_logits == "pending"
    assert Decoder(tiny_qwen35, drafter="ngram", lazy_logits=True).ctx.lazy_logits == "pending"
    for m, d in ((tiny_dense, "ngram"), (tiny_qwen35, "mtp")):
        dec = Decoder(m, drafter=d)
        dec.generate([11, 52, 97], max_tokens=3)
        assert dec.ctx.lazy_logits in ("on", "off", f"on up to {dec.ctx.lazy_head_upto} rows")
        assert (dec.ctx.lazy_head_upto > 0) == dec.ctx.lazy_logits.startswith("on up to")


def test_hybrid_target_with_mtp_hidden_rows(tiny_qwen35):
    """A qwen35 target (recurrent snapshots, dense nextn rows for the MTP head): the graph
    stops after the hidden rows are made, so they are untouched, and every row's logits
    match llama.cpp's head through verify-sized decodes and rollbacks."""
    m = tiny_qwen35
    eager = Context(m, n_ctx=256, n_batch=64, n_rollback=4, mtp_hidden="dense")
    lazy = Context(m, n_ctx=256, n_batch=64, n_rollback=4, mtp_hidden="dense", lazy_logits=True)
    rng = np.random.default_rng(0)
    first = [int(t) for t in rng.integers(3, 200, 20)]
    for c in (eager, lazy):
        _decode(c, first, 0, set(range(20)))
    pos = 20
    for _ in range(30):
        k = int(rng.integers(1, 6))
        toks = [int(t) for t in rng.integers(3, 200, k)]
        for c in (eager, lazy):
            _decode(c, toks, pos, set(range(k)))
        assert lazy.lazy_logits == "on"
        np.testing.assert_array_equal(eager.mtp_hidden_rows(), lazy.mtp_hidden_rows())
        for i in range(k):
            a, b = np.asarray(eager.logits(i)), np.asarray(lazy.logits(i))
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)  # f32: GEMM vs vec_dot rounding
            assert int(a.argmax()) == int(b.argmax())
        keep = int(rng.integers(1, k + 1))
        if keep < k:
            for c in (eager, lazy):
                assert c.seq_rm(0, pos + keep, -1)
        pos += keep


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_greedy_output_unchanged(gemma_path, drafter):
    """Speculative greedy output with the lazy head equals plain output with llama.cpp's
    head, in exact mode (batch-invariant kernels) token for token."""
    prompt = ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
              "def fib2(n):\n    return")
    ref = Decoder(gemma_path, exact=True, lazy_logits=False).generate(prompt, max_tokens=48)
    dec = Decoder(gemma_path, drafter=drafter, n_max=6, exact=True, lazy_logits=True)
    out = dec.generate(prompt, max_tokens=48)
    assert dec.ctx.lazy_logits == "on"
    assert out.tokens == ref.tokens
    assert out.stats.drafted > 0 and out.stats.accepted > 0


def test_sampled_output_unchanged(gemma_path):
    """Sampled verification reads the same distributions: same seed, same tokens."""
    kw = dict(max_tokens=32, sampling={"temperature": 0.8, "seed": 7})
    prompt = "Once upon a time, in a small village,"
    a = Decoder(gemma_path, drafter="ngram", exact=True, lazy_logits=False).generate(prompt, **kw)
    b = Decoder(gemma_path, drafter="ngram", exact=True).generate(prompt, **kw)
    assert a.tokens == b.tokens


def test_rows_of_one_pass_equal_rows_alone(gemma):
    """The fused Q8_0 kernel (every row of a pass per weight row) gives each row the bits
    of ggml's vec_dot: twenty rows in one pass (three groups of rows over each tile of the
    weights, ``SD_HEAD_TILE``) equal twenty one-row passes."""
    together, alone = (Context(gemma, n_ctx=256, n_batch=64, n_threads=2, lazy_logits=True)
                       for _ in range(2))
    toks = gemma.tokenize(PROMPT)
    n, m = len(toks), 20
    for c in (together, alone):
        _decode(c, toks, 0, {n - 1})
        _decode(c, [1000 + 7 * i for i in range(m)], n, set(range(m)))
    together.prepare_logits(0, m)
    assert together.lazy_logits_kernel in ("fused-q8_0", "vec_dot")
    for i in range(m):
        alone.prepare_logits(i, 1)
        np.testing.assert_array_equal(together.logits(i), alone.logits(i))
