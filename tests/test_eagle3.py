"""The EAGLE-3 drafter: exact greedy output at dialled acceptance levels, drafts checked
token by token against numpy, the sampled law, and bad drafts refused before llama.cpp could
abort.

The references are the bigram target (specdec.testing.bigram), whose layer inputs are its
token embeddings and whose greedy output is the successor cycle, and the synthetic EAGLE-3
draft (specdec.testing.eagle3), whose first draft is computed in numpy from the target
features it must be fed.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from bigram_greedy import greedy_cycle
from joint_law import chi_square_p, speculative_counts, target_joint

from specdec import Batch, Context, Decoder, Engine, Model, Sampling
from specdec.drafters import available
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.testing import write_bigram_mtp_model
from specdec.testing.bigram import _Tensors
from specdec.testing.eagle3 import (eagle3_draft_accuracy, eagle3_first_draft,
                                    noise_for_acceptance, write_eagle3_draft)

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
LEVELS = [1.0, 0.9, 0.7, 0.5]


@pytest.fixture(scope="session")
def target(model_file):
    return model_file("bigram-qwen35-n0.0.gguf", lambda p: write_bigram_mtp_model(p))


@pytest.fixture(scope="session")
def draft(model_file, target):
    """draft(acceptance, **kw) -> path of an EAGLE-3 draft of that first-draft acceptance."""
    def get(acceptance=1.0, **kw):
        noise = 0.0 if acceptance >= 1.0 else _noise(target, acceptance)
        tag = "-".join(f"{k}{v}" for k, v in sorted(kw.items()))
        return model_file(f"eagle3-{acceptance}{tag}.gguf",
                          lambda p: write_eagle3_draft(p, target, noise=noise, **kw))
    return get


@functools.lru_cache(maxsize=None)
def _noise(target, acceptance):
    return noise_for_acceptance(target, acceptance)


class Recording(Eagle3Drafter):
    """The EAGLE-3 drafter, recording each draft with the newest committed token, and the
    accepted count of each round."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.drafts = []
        self.accepted = []

    def propose(self, seq, last_token, n_max):
        toks = super().propose(seq, last_token, n_max)
        if toks:
            self.drafts.append((int(self.history(seq)[-1]), int(last_token), list(toks)))
        return toks

    def accept(self, seq, n_accepted):
        self.accepted.append(n_accepted)


# --------------------------------------------------------------------------------------
# the core: layer inputs out of the target, features through the draft's encoder
# --------------------------------------------------------------------------------------

def test_target_hands_out_layer_inputs_and_draft_encodes_them(target, draft):
    tm, dm = Model(target), Model(draft(0.7))
    assert dm.arch == "eagle3" and len(dm.target_layers) == 3
    assert dm.target_hidden_size == tm.n_embd and tm.target_layers == ()
    embd = _Tensors(target)["token_embd.weight"]
    ctx = Context(tm, n_ctx=128, n_batch=32)
    ctx.set_layer_inputs(dm.target_layers)
    assert ctx.layer_inputs == tuple(dict.fromkeys(dm.target_layers))
    with pytest.raises(IndexError, match="no decode"):
        ctx.layer_input_rows(dm.target_layers[0])
    toks = [7, 300, 2, 99, 511]
    b = Batch(32)
    for i, t in enumerate(toks):
        b.add(t, i, 0, i == len(toks) - 1)
    ctx.decode(b)
    for lid in dm.target_layers:    # the bigram target's residual stream is the embedding
        rows = ctx.layer_input_rows(lid)
        assert rows.shape == (len(toks), tm.n_embd) and not rows.flags.writeable
        np.testing.assert_array_equal(rows, embd[toks])
    with pytest.raises(ValueError, match="not kept"):
        ctx.layer_input_rows(0 if 0 not in dm.target_layers else 1)
    dc = Context(dm, n_ctx=128, n_batch=32, mtp_hidden="dense", other=ctx)
    eb = Batch(8, n_embd=3 * tm.n_embd)
    feats = np.concatenate([embd[toks]] * 3, axis=1)
    for i, f in enumerate(feats):
        eb.add(0, i, 0, True, embd=f)
    dc.encode(eb)
    fc = _Tensors(draft(0.7))["fc.weight"]
    np.testing.assert_allclose(dc.mtp_hidden_rows(), feats @ fc.T, atol=1e-4)


def test_core_refuses_what_llama_cpp_would_abort_on(target, draft, tiny_mamba2_path):
    tm = Model(target)
    ctx = Context(tm, n_ctx=64, n_batch=16)
    with pytest.raises(ValueError, match="do not exist in the target"):
        ctx.set_layer_inputs([0, tm.n_layer])
    with pytest.raises(TypeError):
        ctx.set_layer_inputs(["1"])
    assert ctx.layer_inputs == ()
    with pytest.raises(ValueError, match="does not hand out"):
        Context(Model(tiny_mamba2_path), n_ctx=64, n_batch=16).set_layer_inputs([0])
    with pytest.raises(ValueError, match="encoder of"):
        ctx.encode(Batch(4, n_embd=tm.n_embd))
    dm = Model(draft(0.7))
    dc = Context(dm, n_ctx=64, n_batch=16, mtp_hidden="dense")
    for bad in (Batch(4, n_embd=tm.n_embd), Batch(4)):
        bad.add(0, 0, 0, True, **({"embd": np.zeros(bad.n_embd)} if bad.n_embd else {}))
        with pytest.raises(ValueError, match="rows of"):
            dc.encode(bad)
    big = Batch(dc.n_ubatch + 1, n_embd=3 * tm.n_embd)
    for i in range(dc.n_ubatch + 1):
        big.add(0, i, 0, True, embd=np.zeros(3 * tm.n_embd))
    with pytest.raises(ValueError, match="n_ubatch"):
        dc.encode(big)
    with pytest.raises(ValueError, match="other= is for"):
        Context(tm, n_ctx=64, n_batch=16, other=ctx)
    # both contexts still work
    b = Batch(4)
    b.add(1, 0, 0, True)
    ctx.decode(b)
    ok = Batch(2, n_embd=3 * tm.n_embd)
    ok.add(0, 0, 0, True, embd=np.zeros(3 * tm.n_embd))
    dc.encode(ok)
    # a draft context that borrows the target's weights stops when the target is closed
    borrower = Context(dm, n_ctx=64, n_batch=16, mtp_hidden="dense", other=ctx)
    ctx.close()
    with pytest.raises(RuntimeError, match="borrows from is closed"):
        borrower.encode(ok)


# --------------------------------------------------------------------------------------
# greedy output equals plain output; acceptance follows the dial
# --------------------------------------------------------------------------------------

def test_registered(target, draft):
    assert "eagle3" in available()
    dec = Decoder(target, drafter=f"eagle3:{draft(0.9)}", n_max=3, n_ctx=256)
    d = dec.drafters[0]
    assert isinstance(d, Eagle3Drafter) and d.has_model
    assert dec.ctx.layer_inputs == tuple(dict.fromkeys(d.layers))
    assert d.draft_ctx.other is dec.ctx


@pytest.mark.parametrize("acceptance", LEVELS)
def test_greedy_exact_adaptive_equals_plain(target, draft, acceptance):
    n = 150
    plain = Decoder(target, n_ctx=512, exact=True).generate(PROMPT, max_tokens=n)
    assert plain.tokens == greedy_cycle(target, PROMPT, n)
    d = Recording(draft(acceptance))
    dec = Decoder(target, drafter=d, n_max=4, n_ctx=512, exact=True, adaptive=True)
    res = dec.generate(PROMPT, max_tokens=n)
    assert res.tokens == plain.tokens
    if acceptance == 1.0:
        assert res.stats.acceptance_rate == 1.0
    # a second request on the same decoder (its prompt prefix may be reused without rows)
    again = dec.generate(PROMPT + [17], max_tokens=60)
    assert again.tokens == greedy_cycle(target, PROMPT + [17], 60)


@pytest.mark.parametrize("n_max", [1, 3, 5])
def test_greedy_fixed_n_max(target, draft, n_max):
    d = Recording(draft(0.7))
    res = Decoder(target, drafter=d, n_max=n_max, n_ctx=512).generate(PROMPT, max_tokens=120)
    assert res.tokens == greedy_cycle(target, PROMPT, 120)
    assert res.stats.drafted > 0 and 0 < res.stats.accepted < res.stats.drafted


def test_first_drafts_equal_numpy(target, draft):
    """Every first draft token is what the draft computes from the target features of the
    newest committed token: wrong rows, layers or positions would change them."""
    path = draft(0.7)
    d = Recording(path)
    Decoder(target, drafter=d, n_max=3, n_ctx=512).generate(PROMPT, max_tokens=200)
    x0 = np.array([x for x, _, _ in d.drafts])
    x1 = np.array([y for _, y, _ in d.drafts])
    got = np.array([t[0] for _, _, t in d.drafts])
    want = eagle3_first_draft(target, path, x0, x1)
    assert len(got) > 40
    assert np.mean(got == want) >= 0.97
    # the features matter: without them (zero rows) the draft would propose other tokens
    blind = eagle3_first_draft(target, path, np.zeros_like(x0), x1)
    assert np.mean(got == blind) < 0.9


def test_acceptance_tracks_the_dial(target, draft):
    measured = {}
    for acceptance in LEVELS:
        path = draft(acceptance)
        predicted = eagle3_draft_accuracy(target, path)
        d = Recording(path)
        Decoder(target, drafter=d, n_max=3, n_ctx=1024).generate(PROMPT, max_tokens=400)
        rate = float(np.mean(np.array(d.accepted) >= 1))
        measured[acceptance] = rate
        assert abs(rate - predicted) < 0.1, (acceptance, rate, predicted)
        assert abs(rate - acceptance) < 0.12, (acceptance, rate)
    rates = [measured[a] for a in LEVELS]
    assert rates == sorted(rates, reverse=True)


def test_multi_sequence(target, draft):
    dec = Decoder(target, drafter=f"eagle3:{draft(0.9)}", n_max=3, n_ctx=1024, n_seq_max=2)
    prompts = [PROMPT, [40, 41, 42]]
    res = dec.generate_batch(prompts, max_tokens=80)
    for p, r in zip(prompts, res):
        assert r.tokens == greedy_cycle(target, p, 80)


def test_engine_slots_draft_together(target, draft):
    """The Engine's slots share one KV cache (each may fill it), and so does the draft."""
    prompts = [PROMPT, [40, 41, 42], [7, 8]]
    with Engine(target, drafters={"eagle3": f"eagle3:{draft(0.9)}"}, n_slots=3, n_ctx=512,
                n_max=4) as eng:
        res = [h.result(120) for h in [eng.submit(p, max_tokens=60) for p in prompts]]
    for p, r in zip(prompts, res):
        assert r.tokens == greedy_cycle(target, p, 60)
        assert r.stats.accepted > 0


# --------------------------------------------------------------------------------------
# sampled mode keeps the target's law
# --------------------------------------------------------------------------------------

def test_sampled_distribution_matches_target(target, draft):
    """Rejection sampling with EAGLE-3 drafts (one-hot q): the first three tokens of a hot
    bigram target follow the target's exact joint law (min_p cuts the support between
    two of the bigram's tied logit steps, as in test_mtp)."""

    model = Model(target)
    temp, min_p, n_seq, n_samples = 8.0, float(np.exp(-15.47)), 16, 2400
    prompt = [11, 52, 97]
    joint = target_joint(model, prompt, 3, temp, min_p)
    tgt = Context(model, n_ctx=64 * n_seq, n_batch=64, n_seq_max=n_seq, n_rollback=2)
    counts, st = speculative_counts(tgt, Eagle3Drafter(draft(0.7)), prompt, 3, 2, temp, min_p,
                                    n_samples)
    assert st["drafted"] > 0 and 0 < st["accepted"] < st["drafted"]
    p = chi_square_p(counts, joint)
    assert p > 1e-3, f"chi-square p={p:.2e}"


def test_sampled_mode_runs(target, draft):
    dec = Decoder(target, drafter=f"eagle3:{draft(0.9)}", n_max=3, n_ctx=512)
    res = dec.generate(PROMPT, max_tokens=80, sampling=Sampling(temperature=0.8, seed=4))
    assert len(res.tokens) == 80 and res.stats.acceptance_rate > 0.5


# --------------------------------------------------------------------------------------
# bad drafts: clear errors, never an abort
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    ({"target_layers": (1, 2, 9)}, r"do not exist"),
    ({"target_layers": (0, 1)}, r"EAGLE-3 reads 3|exactly 3"),
    ({"target_hidden_size": 64}, r"hidden size 64"),
    ({"n_vocab": 300}, r"vocabulary"),
])
def test_bad_draft_is_refused(target, draft, kw, match):
    with pytest.raises(ValueError, match=match):
        Decoder(target, drafter=f"eagle3:{draft(0.9, **kw)}", n_max=3, n_ctx=256)
    # nothing was left broken: a good draft still works in the same process
    res = Decoder(target, drafter=f"eagle3:{draft(0.9)}", n_max=3, n_ctx=256).generate(
        PROMPT, max_tokens=20)
    assert res.tokens == greedy_cycle(target, PROMPT, 20)


def test_not_an_eagle3_file_or_target(target, draft, tiny_mamba2_path):
    with pytest.raises(ValueError, match="not an EAGLE-3 draft"):
        Decoder(target, drafter=f"eagle3:{target}", n_max=3, n_ctx=256)
    with pytest.raises(ValueError, match="does not hand out"):
        Decoder(tiny_mamba2_path, drafter=f"eagle3:{draft(0.9)}", n_max=3, n_ctx=256)
    with pytest.raises(ValueError, match="eagle3:PATH"):
        Eagle3Drafter()
    # given as a plain draft model, it says which drafter reads it
    with pytest.raises(ValueError, match="is an EAGLE-3 draft.*load it as eagle3:PATH"):
        Decoder(target, drafter=f"draft:{draft(0.9)}", n_max=3, n_ctx=256)


def test_hooks_need_binding(draft):
    from specdec.drafters._run import run_propose
    d = Eagle3Drafter(draft(0.9))
    with pytest.raises(RuntimeError, match="not bound"):
        run_propose(d, 0, 1, 2)
