"""The DFlash drafter: exact greedy output at dialled acceptance levels, every draft checked
token by token against numpy, the sampled law, and bad drafts refused before llama.cpp could
abort.

The references are the periodic bigram target (specdec.testing.bigram, ``period=T``), whose
layer inputs are its token embeddings and whose greedy text repeats every T tokens, and the
synthetic DFlash draft (specdec.testing.dflash), whose block row i copies the token T back
through a known map: right on the dialled share of every cycle's tokens.
"""
from __future__ import annotations

import numpy as np
import pytest
from bigram_greedy import greedy_cycle
from joint_law import chi_square_p, speculative_counts, target_joint

from specdec import Batch, Context, Decoder, Engine, Model, Sampling
from specdec.drafters import available
from specdec.drafters.dflash import DFlashDrafter
from specdec.testing import write_bigram_mtp_model
from specdec.testing.bigram import _Tensors
from specdec.testing.dflash import dflash_drafts, target_period, write_dflash_draft

PERIOD = 16
LEVELS = [1.0, 0.9, 0.7, 0.5]


@pytest.fixture(scope="session")
def target(model_file):
    return model_file(f"bigram-qwen35-period{PERIOD}.gguf",
                      lambda p: write_bigram_mtp_model(p, period=PERIOD))


@pytest.fixture(scope="session")
def draft(model_file, target):
    """draft(acceptance, **kw) -> path of a DFlash draft of that acceptance."""
    def get(acceptance=1.0, **kw):
        tag = "-".join(f"{k}{v}" for k, v in sorted(kw.items()))
        return model_file(f"dflash-{acceptance}{tag}.gguf",
                          lambda p: write_dflash_draft(p, target, acceptance=acceptance, **kw))
    return get


def on_cycle(target, first, n):
    """A prompt of ``n`` tokens that the target's greedy text continues periodically."""
    return [first] + greedy_cycle(target, [first], n - 1)


def dialled(acceptance):
    """The share of every cycle's tokens the draft gets right (whole tokens of the period)."""
    return round(acceptance * PERIOD) / PERIOD


class Recording(DFlashDrafter):
    """The DFlash drafter, recording each draft with the history it was made from, and the
    accepted count of each round."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.drafts = []
        self.accepted = []

    def propose(self, seq, last_token, n_max):
        toks = super().propose(seq, last_token, n_max)
        if toks:
            self.drafts.append((list(self.history(seq)), list(toks)))
        return toks

    def accept(self, seq, n_accepted):
        self.accepted.append(n_accepted)


# --------------------------------------------------------------------------------------
# the core: feature rows into the draft's KV, a non-causal block decode
# --------------------------------------------------------------------------------------

def test_features_into_the_kv_and_a_block_decode(target, draft):
    """The recipe by hand on raw contexts: the block's rows are the numpy drafts."""
    path = draft(0.7)
    tm, dm = Model(target), Model(path)
    assert dm.arch == "dflash" and dm.n_embd == tm.n_embd and 0 <= dm.mask < dm.n_vocab
    assert target_period(target) == PERIOD
    ctx = Context(tm, n_ctx=256, n_batch=64)
    ctx.set_layer_inputs(dm.target_layers)
    toks = on_cycle(target, 5, 41)
    L = len(toks) - 1
    b = Batch(64)
    for i, t in enumerate(toks[:L]):
        b.add(t, i, 0, i == L - 1)
    ctx.decode(b)
    embd = _Tensors(target)["token_embd.weight"]
    feats = np.concatenate([ctx.layer_input_rows(lid) for lid in dm.target_layers], axis=1)
    np.testing.assert_array_equal(feats, np.concatenate([embd[toks[:L]]] * 2, axis=1))
    dc = Context(dm, n_ctx=256, n_batch=64, other=ctx)
    assert dc.causal_attn
    dc.set_causal_attn(False)
    assert not dc.causal_attn
    fb = Batch(64, n_embd=feats.shape[1])
    for i in range(L):
        fb.add(0, i, 0, False, embd=feats[i])
    dc.decode(fb)
    assert dc.seq_pos_max(0) == L - 1
    n = 7
    blk = Batch(16)
    blk.add(toks[L], L, 0, True)
    for i in range(1, n + 1):
        blk.add(dm.mask, L + i, 0, True)
    dc.decode(blk)
    got = [int(np.argmax(dc.logits(i))) for i in range(1, n + 1)]
    assert got == dflash_drafts(path, toks[:L], n, PERIOD)
    # the features matter: zero ones leave the draft no token to copy
    dc.clear()
    zb = Batch(64, n_embd=feats.shape[1])
    for i in range(L):
        zb.add(0, i, 0, False, embd=np.zeros(feats.shape[1]))
    dc.decode(zb)
    dc.decode(blk)
    blind = [int(np.argmax(dc.logits(i))) for i in range(1, n + 1)]
    assert blind != got


def test_core_refuses_what_llama_cpp_would_abort_on(target, draft):
    tm, dm = Model(target), Model(draft(0.7))
    ctx = Context(tm, n_ctx=64, n_batch=16)
    dc = Context(dm, n_ctx=64, n_batch=32, n_ubatch=8, other=ctx)
    dc.set_causal_attn(False)
    width = len(dm.target_layers) * tm.n_embd
    wrong = Batch(4, n_embd=tm.n_embd)
    wrong.add(0, 0, 0, False, embd=np.zeros(tm.n_embd))
    with pytest.raises(ValueError, match=f"not feature rows of {width}"):
        dc.decode(wrong)
    big = Batch(9)         # non-causal: llama.cpp asserts n_ubatch >= n_tokens
    for i in range(9):
        big.add(1, i, 0, True)
    with pytest.raises(ValueError, match="non-causal"):
        dc.decode(big)
    bad = Batch(2)
    bad.add(tm.n_vocab + 3, 0, 0, True)
    with pytest.raises(ValueError, match="out of range"):
        dc.decode(bad)
    with pytest.raises(ValueError, match="embedding rows"):
        fb = Batch(2, n_embd=width)
        fb.add(0, 0, 0, False, embd=np.zeros(width))
        ctx.decode(fb)
    # both still work
    ok = Batch(2, n_embd=width)
    ok.add(0, 0, 0, False, embd=np.zeros(width))
    dc.decode(ok)
    dc.seq_rm(0)
    dc.set_causal_attn(True)
    dc.decode(big)


# --------------------------------------------------------------------------------------
# greedy output equals plain output; drafts and acceptance follow the dial
# --------------------------------------------------------------------------------------

def test_registered(target, draft):
    assert "dflash" in available()
    dec = Decoder(target, drafter=f"dflash:{draft(0.9)}", n_max=3, n_ctx=256)
    d = dec.drafters[0]
    assert isinstance(d, DFlashDrafter) and d.has_model
    assert d.block_size == PERIOD and not d.causal and not d.draft_ctx.causal_attn
    assert dec.ctx.layer_inputs == tuple(dict.fromkeys(d.layers))
    assert d.draft_ctx.other is dec.ctx


@pytest.mark.parametrize("acceptance", LEVELS)
def test_greedy_exact_adaptive_equals_plain(target, draft, acceptance):
    n = 150
    prompt = on_cycle(target, 3, 20)
    plain = Decoder(target, n_ctx=512, exact=True).generate(prompt, max_tokens=n)
    assert plain.tokens == greedy_cycle(target, prompt, n)
    d = Recording(draft(acceptance))
    dec = Decoder(target, drafter=d, n_max=8, n_ctx=512, exact=True, adaptive=True)
    res = dec.generate(prompt, max_tokens=n)
    assert res.tokens == plain.tokens
    if acceptance == 1.0:
        assert res.stats.acceptance_rate == 1.0
    # a second request on the same decoder (its prompt prefix may be reused without rows)
    again = dec.generate(prompt + [17], max_tokens=60)
    assert again.tokens == greedy_cycle(target, prompt + [17], 60)


@pytest.mark.parametrize("n_max", [1, 3, 7, PERIOD - 1, 40])
def test_greedy_fixed_n_max(target, draft, n_max):
    d = Recording(draft(0.7))
    prompt = on_cycle(target, 9, 24)
    res = Decoder(target, drafter=d, n_max=n_max, n_ctx=512).generate(prompt, max_tokens=120)
    assert res.tokens == greedy_cycle(target, prompt, 120)
    assert res.stats.drafted > 0 and 0 < res.stats.accepted < res.stats.drafted
    assert max(len(t) for _, t in d.drafts) == min(n_max, PERIOD - 1)   # block size - 1


def test_drafts_equal_numpy(target, draft):
    """Every draft token is what the draft computes from the target features T positions
    back: wrong rows, layers, positions or a block left in the KV would change them."""
    path = draft(0.7)
    d = Recording(path)
    prompt = on_cycle(target, 100, 30)
    dec = Decoder(target, drafter=d, n_max=6, n_ctx=512)
    dec.generate(prompt, max_tokens=200)
    dec.generate([7, 8] + prompt, max_tokens=50)    # other positions, a fresh request
    assert len(d.drafts) > 40
    for hist, toks in d.drafts:
        assert toks == dflash_drafts(path, hist, len(toks), PERIOD)
    assert d.synced(0) == len(d.history(0))


def test_acceptance_tracks_the_dial(target, draft):
    measured = {}
    for acceptance in LEVELS:
        d = Recording(draft(acceptance))
        dec = Decoder(target, drafter=d, n_max=3, n_ctx=1024)
        for first in (2, 40, 77):        # three cycles of the target
            dec.generate(on_cycle(target, first, PERIOD), max_tokens=160)
        rate = float(np.mean(np.array(d.accepted) >= 1))
        measured[acceptance] = rate
        assert abs(rate - dialled(acceptance)) < 0.1, (acceptance, rate)
    rates = [measured[a] for a in LEVELS]
    assert rates == sorted(rates, reverse=True)


def test_causal_draft_and_multi_sequence(target, draft):
    """A draft that asks for causal attention gets it; two sequences share the context."""
    dec = Decoder(target, drafter=f"dflash:{draft(0.9, causal=True)}", n_max=5, n_ctx=1024,
                  n_seq_max=2)
    d = dec.drafters[0]
    assert d.causal and d.draft_ctx.causal_attn
    prompts = [on_cycle(target, 3, 20), [40, 41, 42]]
    res = dec.generate_batch(prompts, max_tokens=80)
    for p, r in zip(prompts, res):
        assert r.tokens == greedy_cycle(target, p, 80)
    assert res[0].stats.accepted > 0


def test_engine_slots_draft_together(target, draft):
    """The Engine's slots share one draft context: each keeps its own features."""
    prompts = [on_cycle(target, first, 20) for first in (3, 40, 77)]
    with Engine(target, drafters={"dflash": f"dflash:{draft(0.9)}"}, n_slots=3, n_ctx=512,
                n_max=7) as eng:
        handles = [eng.submit(p, max_tokens=60) for p in prompts]
        res = [h.result(120) for h in handles]
    for p, r in zip(prompts, res):
        assert r.tokens == greedy_cycle(target, p, 60)
        assert r.stats.accepted > 0


# --------------------------------------------------------------------------------------
# sampled mode keeps the target's law
# --------------------------------------------------------------------------------------

def test_sampled_distribution_matches_target(target, draft):
    """Rejection sampling with DFlash drafts (one-hot q): the first three tokens of a hot
    bigram target follow the target's exact joint law (min_p as in test_eagle3)."""
    model = Model(target)
    temp, min_p, n_seq, n_samples = 8.0, float(np.exp(-15.47)), 16, 2400
    prompt = on_cycle(target, 11, 20)
    joint = target_joint(model, prompt, 3, temp, min_p)
    tgt = Context(model, n_ctx=64 * n_seq, n_batch=64, n_seq_max=n_seq, n_rollback=2)
    counts, st = speculative_counts(tgt, DFlashDrafter(draft(0.7)), prompt, 3, 2, temp, min_p,
                                    n_samples)
    assert st["drafted"] > 0 and 0 < st["accepted"] < st["drafted"]
    p = chi_square_p(counts, joint)
    assert p > 1e-3, f"chi-square p={p:.2e}"


def test_sampled_mode_runs(target, draft):
    dec = Decoder(target, drafter=f"dflash:{draft(0.9)}", n_max=3, n_ctx=512)
    res = dec.generate(on_cycle(target, 3, 20), max_tokens=80,
                       sampling=Sampling(temperature=0.8, seed=4))
    assert len(res.tokens) == 80


# --------------------------------------------------------------------------------------
# bad drafts: clear errors, never an abort
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    ({"target_layers": (1, 9)}, r"do not exist"),
    ({"n_vocab": 300}, r"vocabulary"),
    ({"mask_token": -1}, r"no mask token"),
    ({"block_size": 1}, r"block size 1"),
])
def test_bad_draft_is_refused(target, draft, kw, match):
    with pytest.raises(ValueError, match=match):
        Decoder(target, drafter=f"dflash:{draft(0.9, **kw)}", n_max=3, n_ctx=256)
    # nothing was left broken: a good draft still works in the same process
    prompt = on_cycle(target, 3, 20)
    res = Decoder(target, drafter=f"dflash:{draft(0.9)}", n_max=3, n_ctx=256).generate(
        prompt, max_tokens=20)
    assert res.tokens == greedy_cycle(target, prompt, 20)


def test_not_a_dflash_file_or_target(target, draft, tiny_mamba2_path, model_file, tmp_path):
    with pytest.raises(ValueError, match="not a DFlash draft"):
        Decoder(target, drafter=f"dflash:{target}", n_max=3, n_ctx=256)
    with pytest.raises(ValueError, match="does not hand out"):
        Decoder(tiny_mamba2_path, drafter=f"dflash:{draft(0.9)}", n_max=3, n_ctx=256)
    with pytest.raises(ValueError, match="dflash:PATH"):
        DFlashDrafter()
    with pytest.raises(ValueError, match="is a DFlash draft.*load it as dflash:PATH"):
        Decoder(target, drafter=f"draft:{draft(0.9)}", n_max=3, n_ctx=256)
    with pytest.raises(ValueError, match="constant dim 0"):     # the writer's own check
        write_dflash_draft(tmp_path / "x.gguf", model_file("bigram-qwen35-n0.0.gguf",
                                                           lambda p: write_bigram_mtp_model(p)))


def test_hooks_need_binding(draft):
    from specdec.drafters._run import run_propose
    d = DFlashDrafter(draft(0.9))
    with pytest.raises(RuntimeError, match="not bound"):
        run_propose(d, 0, 1, 2)
