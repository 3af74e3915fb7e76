"""Rollback and checkpoint sequences shared by the tests of memory off the host (RPC servers,
GPUs): each returns every logits row it saw, so that a placement can be compared with the CPU."""
from __future__ import annotations

from specdec import Batch, Context


def steps(ctx, b, toks, pos0):
    """One-token decodes; their logits."""
    out = []
    for i, t in enumerate(toks):
        b.clear()
        b.add(t, pos0 + i, 0, True)
        ctx.decode(b)
        out.append(ctx.logits(0).copy())
    return out


def rollback_and_checkpoint(m, toks):
    """Prompt, steps, a KV rollback and a checkpoint round trip: every logits row seen. The
    rows decoded again after the rollback and after the restore must be bit-identical to the
    first ones (the same batches on the same backend)."""
    ctx = Context(m, n_ctx=256, n_batch=32)
    b = Batch(64)
    for i, t in enumerate(toks[:20]):
        b.add(t, i, 0, i == 19)
    ctx.decode(b)
    seen = [ctx.logits(19).copy()]
    state = ctx.save_state(0)
    seen += steps(ctx, b, toks[20:23], 20)
    assert ctx.seq_rm(0, 21)                     # roll back two tokens
    assert ctx.seq_pos_max(0) == 20
    again = steps(ctx, b, toks[21:23], 21)
    assert all((x == y).all() for x, y in zip(again, seen[2:]))
    ctx.clear()
    ctx.load_state(state, 0)                     # the checkpoint, restored
    assert ctx.seq_pos_max(0) == 19
    restored = steps(ctx, b, toks[20:21], 20)
    assert (restored[0] == seen[1]).all()
    return seen


def recurrent_rollback(m):
    """A recurrent model's state rolled back by two tokens (n_rollback snapshots), then saved
    and restored: every logits row seen."""
    ctx = Context(m, n_ctx=128, n_batch=16, n_rollback=3)
    b = Batch(16)
    seen = []
    for pos0, toks in ((0, [5, 6, 7, 8]), (4, [9, 10, 11])):
        b.clear()
        for i, t in enumerate(toks):
            b.add(t, pos0 + i, 0, True)
        ctx.decode(b)
        seen += [ctx.logits(i).copy() for i in range(len(toks))]
    assert ctx.seq_rm(0, 5)      # keep one of the three: the recurrent state goes back by 2
    b.clear()
    b.add(12, 5, 0, True)
    ctx.decode(b)
    seen.append(ctx.logits(0).copy())
    state = ctx.save_state(0)
    ctx.clear()
    ctx.load_state(state, 0)
    b.clear()
    b.add(13, 6, 0, True)
    ctx.decode(b)
    seen.append(ctx.logits(0).copy())
    return seen
