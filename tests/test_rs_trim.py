"""Recurrent snapshots sized per decode (``Context.rollback_trim``, ``_rs_graph.h``).

With ``rollback_trim`` a decode's graph writes only the snapshots its batch can roll back:
none for one-token decodes. The decisive property is that nothing observable changes:
the same script of decodes and rollbacks gives bit-identical logits with it on and off,
through llama.cpp's graph reuse (the same batch shapes recur), across sequences."""
import random

import numpy as np
import pytest

from specdec import Batch, Context, Model
from specdec._archs import ROLLBACK_TRIM_ARCHS


@pytest.fixture(scope="module")
def moe(model_cache):
    from specdec.testing import write_tiny_qwen35
    path = model_cache / "tiny-qwen35moe-random.gguf"
    if not path.exists():
        write_tiny_qwen35(str(path), arch="qwen35moe")
    return Model(str(path), load_mtp=True)


def _script(seed, n_steps=60, n_seq=2, n_rs=4):
    """Decodes as the controller issues them: prompts, one-token rounds, verify batches of
    up to n_rs + 1 tokens per sequence (sequences mixed in one batch), each followed by a
    rollback the budget allows or none."""
    rnd = random.Random(seed)
    steps = [("decode", {s: [rnd.randrange(3, 200) for _ in range(rnd.randrange(5, 12))]
                         for s in range(n_seq)})]
    for _ in range(n_steps):
        per_seq = {}
        for s in range(n_seq):
            if rnd.random() < 0.8:
                n = 1 if rnd.random() < 0.5 else rnd.randrange(2, n_rs + 2)
                per_seq[s] = [rnd.randrange(3, 200) for _ in range(n)]
        if not per_seq:
            per_seq[0] = [rnd.randrange(3, 200)]
        steps.append(("decode", per_seq))
        cut = {s: rnd.randrange(0, len(t)) for s, t in per_seq.items()
               if len(t) > 1 and rnd.random() < 0.7}
        if cut:
            steps.append(("rollback", cut))
    return steps


def _run(model, steps, trim, n_seq=2, n_rs=4):
    ctx = Context(model, n_ctx=512, n_batch=64, n_seq_max=n_seq, n_rollback=n_rs)
    ctx.rollback_trim = trim
    pos = [0] * n_seq
    out = []
    for kind, arg in steps:
        if kind == "decode":
            b = Batch(64, n_seq_max=n_seq)
            for s, toks in arg.items():
                for t in toks:
                    b.add(t, pos[s], s, True)
                    pos[s] += 1
            ctx.decode(b)
            out.append(np.stack([np.array(ctx.logits(i)) for i in range(b.n_tokens)]))
        else:
            for s, k in arg.items():
                assert ctx.seq_rm(s, pos[s] - k, -1)
                pos[s] -= k
    return out


@pytest.mark.parametrize("which", ["tiny_qwen35", "moe"])
def test_same_logits_with_and_without_trim(which, request):
    model = request.getfixturevalue(which)
    assert model.arch in ROLLBACK_TRIM_ARCHS
    for seed in range(3):
        steps = _script(seed)
        on, off = _run(model, steps, True), _run(model, steps, False)
        assert len(on) == len(off)
        for i, (a, b) in enumerate(zip(on, off)):
            assert np.array_equal(a, b), f"seed {seed}: decode {i} differs"


def test_rollback_after_one_token_rounds_equals_replay(tiny_qwen35):
    """One-token rounds (no snapshots written) then a verify batch rolled back: the state
    equals a context that only ever decoded the kept tokens."""
    ctx = Context(tiny_qwen35, n_ctx=128, n_batch=16, n_rollback=3)
    assert ctx.rollback_trim
    toks = [11, 23, 5, 77, 19, 4, 31, 8]
    b = Batch(16)
    for i, t in enumerate(toks):
        b.add(t, i, 0, i == len(toks) - 1)
    ctx.decode(b)
    pos = len(toks)
    for t in (40, 41, 42, 43, 44):
        b.clear()
        b.add(t, pos, 0, True)
        ctx.decode(b)
        pos += 1
    b.clear()
    for i, t in enumerate((50, 51, 52, 53)):
        b.add(t, pos + i, 0, True)
    ctx.decode(b)
    assert ctx.seq_rm(0, pos + 1, -1)     # keep 50, drop 51..53
    b.clear()
    b.add(60, pos + 1, 0, True)
    ctx.decode(b)
    got = np.array(ctx.logits(0))

    ref = Context(tiny_qwen35, n_ctx=128, n_batch=16, n_rollback=3)
    ref.rollback_trim = False
    seq = toks + [40, 41, 42, 43, 44, 50, 60]
    for i, t in enumerate(seq):
        b.clear()
        b.add(t, i, 0, True)
        ref.decode(b)
    want = np.array(ref.logits(0))
    assert np.allclose(got, want, atol=1e-4) and int(got.argmax()) == int(want.argmax())


def test_rs_trim_flag(tiny_qwen35, tiny_dense):
    assert not Context(tiny_qwen35, n_ctx=64, n_batch=16).rollback_trim     # no snapshots at all
    ctx = Context(tiny_qwen35, n_ctx=64, n_batch=16, n_rollback=2)
    assert ctx.rollback_trim
    ctx.rollback_trim = False
    assert not ctx.rollback_trim
    ctx.rollback_trim = True
    plain = Context(tiny_qwen35, n_ctx=64, n_batch=16)
    with pytest.raises(ValueError, match="rollback_trim needs"):
        plain.rollback_trim = True
    with pytest.raises(ValueError, match="rollback_trim needs"):
        Context(tiny_dense, n_ctx=64, n_batch=16).rollback_trim = True
    assert not plain.rollback_trim
