"""Exact mode's foundation: with ``Context(batch_invariant=True)`` the logits of a row at
position p after the same prefix are bit-identical whatever the batch: 2 to 33 rows, the row's
place in the batch, another sequence's rows beside it, and prefixes past Gemma's 512-token
sliding window.

Without it, ggml-cpu computes K-quant matmuls of 8 rows or more with a tiled kernel and smaller
ones with vec_dot: a verify of 8+ rows rounds differently from plain decoding (see
``specdec/_batch_invariant.h``).
"""
from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec import Batch, Context

SIZES = range(2, 34)


def _text(n_lines: int) -> str:
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    return "\n".join(f"static const int field_{i} = {i * 7919 % 1009}; /* {words[i % 6]} {i % 7} */"
                     for i in range(n_lines))


def _decode(ctx: Context, b: Batch, rows) -> None:
    b.clear()
    for tok, pos, seq, out in rows:
        b.add(tok, pos, seq, out)
    ctx.decode(b)


def _check_rows(ctx: Context, prefix, cont, other, *, reprefill: bool) -> list:
    """Decode ``cont[:n]`` after ``prefix`` on sequence 0 for every n in SIZES, with
    ``n % 3`` rows of sequence 1 (after ``other``) in front of them; returns the mismatches
    (n, row, first n holding that row) against the first batch that computed each row."""
    b = Batch(max(len(prefix), len(other)) + 64, n_seq_max=2)
    P, Q = len(prefix), len(other)

    def prefill() -> None:
        ctx.clear()
        _decode(ctx, b, [(t, i, 0, False) for i, t in enumerate(prefix)])
        _decode(ctx, b, [(t, i, 1, False) for i, t in enumerate(other)])

    prefill()
    ref: dict = {}
    bad = []
    for n in SIZES:
        if reprefill:
            prefill()
        else:
            ctx.seq_rm(0, P, -1)
            ctx.seq_rm(1, Q, -1)
        m = n % 3
        rows = [(other[(Q + j) % Q], Q + j, 1, True) for j in range(m)]
        rows += [(cont[j], P + j, 0, True) for j in range(n)]
        _decode(ctx, b, rows)
        for j in range(n):
            got = ctx.logits(m + j).copy()
            if j not in ref:
                ref[j] = (n, got)
            elif not np.array_equal(ref[j][1], got):
                bad.append((n, j, ref[j][0]))
    return bad


@pytest.fixture(scope="module")
def gemma_unpacked(gemma_path):
    return specdec.Model(gemma_path, use_extra_bufts=False)


@pytest.mark.parametrize("n_prefix", [150, 600])
def test_gemma_rows_do_not_depend_on_the_batch(gemma_unpacked, n_prefix):
    m = gemma_unpacked
    toks = m.tokenize(_text(80))
    assert len(toks) > n_prefix + 40
    prefix, cont = toks[:n_prefix], toks[n_prefix:n_prefix + 40]
    other = m.tokenize("The quick brown fox jumps over the lazy dog, again and again.")
    ctx = Context(m, n_ctx=2048, n_batch=1024, n_seq_max=2, batch_invariant=True)
    bad = _check_rows(ctx, prefix, cont, other, reprefill=False)
    assert not bad, f"rows differ (batch size, row, reference batch size): {bad[:10]}"


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_qwen35_rows_do_not_depend_on_the_batch(model_file, dtype):
    from specdec.testing import write_tiny_qwen35
    path = model_file(f"tiny-qwen35-{dtype}.gguf", lambda p: write_tiny_qwen35(p, dtype=dtype))
    m = specdec.Model(path, use_extra_bufts=False)
    rng = np.random.default_rng(0)
    toks = [int(t) for t in rng.integers(3, m.n_vocab, 120)]
    prefix, cont, other = toks[:60], toks[60:100], toks[100:]
    # the recurrent state cannot be cut back by 33 tokens: every batch starts from a fresh prefill
    ctx = Context(m, n_ctx=512, n_batch=256, n_seq_max=2, n_rollback=4, batch_invariant=True)
    bad = _check_rows(ctx, prefix, cont, other, reprefill=True)
    assert not bad, f"rows differ (batch size, row, reference batch size): {bad[:10]}"


def test_batch_invariant_needs_unpacked_weights(gemma):
    with pytest.raises(ValueError, match="use_extra_bufts=False"):
        Context(gemma, n_ctx=256, batch_invariant=True)


def test_exact_controller_needs_a_batch_invariant_context(gemma_unpacked):
    from specdec._controller import Controller
    ctx = Context(gemma_unpacked, n_ctx=256)
    assert not ctx.batch_invariant
    with pytest.raises(ValueError, match="batch_invariant=True"):
        Controller(ctx, [], exact=True)
