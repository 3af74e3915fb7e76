"""A verify batch of several sequences must cost less than decoding them one by one.

That is what batching is for, and what an Engine's round counts on. On the CPU, ggml's tiled
attention kernel takes 64 query rows at a time, which in a batch of 8 sequences' drafts are
rows of all 8: each tile then runs against the KV of all of them. ``Context`` decodes such
batches with the reference attention kernel instead (``_batch_invariant.h``). Measured here
on gemma3-270m with 8 sequences holding the grounded prompts (166-1,570 tokens): one batch of
8 x 9 rows against the same rows decoded a sequence at a time, in turn, medians.
"""
import statistics
import time

from specdec._core import Batch, Context, Model
from specdec.benchmark.serve import grounded_prompts

N_SEQ = 8
ROWS = 9      # last token + 8 drafts per sequence: 72 rows, past one 64-row attention tile
REPS = 7


def _decode(ctx: Context, batch: Batch, seqs, pos) -> float:
    batch.clear()
    for s in seqs:
        for r in range(ROWS):
            batch.add(100 + r, pos[s] + r, s, True)
    t0 = time.perf_counter()
    ctx.decode(batch)
    dt = time.perf_counter() - t0
    for s in seqs:
        ctx.seq_rm(s, pos[s], -1)
    return dt


def test_interleaved_verify_batch_beats_one_sequence_at_a_time(benchmark, gemma_path):
    model = Model(gemma_path)
    # one KV cache for every sequence, as an Engine's (outside exact mode and MTP)
    ctx = Context(model, n_ctx=N_SEQ * 2048, n_seq_max=N_SEQ, n_threads=2, kv_unified=True)
    batch = Batch(512, n_seq_max=N_SEQ)
    prompts = grounded_prompts()
    pos = []
    for s in range(N_SEQ):
        toks = model.tokenize(prompts[s % len(prompts)])
        for i in range(0, len(toks), 512):
            batch.clear()
            for j, t in enumerate(toks[i:i + 512]):
                batch.add(t, i + j, s, False)
            ctx.decode(batch)
        pos.append(len(toks))

    def measure():
        together, apart = [], []
        for _ in range(REPS):
            together.append(_decode(ctx, batch, range(N_SEQ), pos))
            apart.append(sum(_decode(ctx, batch, [s], pos) for s in range(N_SEQ)))
        return statistics.median(together[1:]), statistics.median(apart[1:])

    together, apart = benchmark.pedantic(measure, rounds=1, iterations=1)
    ratio = together / apart
    benchmark.extra_info.update({"together_ms": together * 1e3, "apart_ms": apart * 1e3,
                                 "ratio": ratio})
    print(f"\n{N_SEQ} sequences x {ROWS} rows: one batch {together * 1e3:.0f} ms, one sequence "
          f"at a time {apart * 1e3:.0f} ms, ratio {ratio:.2f}")
    assert ratio <= 0.85
