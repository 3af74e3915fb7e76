"""The MTP drafter: exact greedy output, the drafts themselves, and its error paths.

Three references:

* the bigram models (specdec.testing.bigram) know their greedy output (the
  successor cycle) and, in numpy, what the MTP head must draft from the target's
  hidden rows, so both the output and every draft token are checked exactly;
* on random-weight qwen35 models, where the MTP KV and the hidden rows all matter,
  each draft is recomputed from scratch (a fresh target decode of the whole
  history for the hidden rows, a fresh MTP context fed every position) and must
  equal the incremental drafter's;
* plain greedy decoding.
"""
from __future__ import annotations


import numpy as np
import pytest

import specdec
from specdec import Batch, Context, Decoder, Model, Sampling
from specdec._controller import Controller
from specdec.config import SpecConfig
from specdec.drafters import Drafter, available
from specdec.drafters._run import run_observe, run_propose
from bigram_greedy import greedy_cycle
from mtp_scratch import Checking, Scratch
from joint_law import chi_square_p, speculative_counts, target_joint
from specdec.drafters.mtp import MtpDrafter
from specdec.drafters._test_hooks import ChainedHeadsMtpDrafter
from specdec.testing import write_bigram_mtp_model, write_tiny_qwen35
from specdec.testing.bigram import _rmsnorm, _Tensors

ARCHS = ["qwen35", "qwen35moe"]
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="session")
def bigram(model_file):
    """bigram(arch, noise) -> path of a tiny bigram model (noise on the MTP head's eh_proj)."""
    def get(arch="qwen35", noise=0.0):
        return model_file(f"bigram-{arch}-n{noise}.gguf",
                       lambda p: write_bigram_mtp_model(p, arch=arch, noise=noise))
    return get


@pytest.fixture(scope="session")
def split_qwen35(model_file):
    """The same random weights as one file, as a trunk-only file and as an MTP-only file."""
    return tuple(model_file(f"split-{kind}.gguf",
                         lambda p, kw=kw: write_tiny_qwen35(p, seed=5, **kw))
                 for kind, kw in [("full", {}), ("trunk", {"mtp": False}),
                                  ("head", {"mtp_only": True})])


class Counting(MtpDrafter):
    """The MTP drafter, counting rounds by how many of its drafts were accepted."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.counts = {}

    def accept(self, seq, n_accepted):
        self.counts[n_accepted] = self.counts.get(n_accepted, 0) + 1


def _run(path, n_max, n_tokens, *, prompt=PROMPT, drafter=None, **kw):
    d = drafter if drafter is not None else Counting()
    dec = Decoder(path, drafter=d, n_max=n_max, n_ctx=max(256, 2 * (len(prompt) + n_tokens)),
                  load_mtp=True, **kw)
    return dec, d, dec.generate(prompt, max_tokens=n_tokens)


# --------------------------------------------------------------------------------------
# greedy output equals plain output
# --------------------------------------------------------------------------------------

def test_registered_and_target_is_dense(bigram):
    assert "mtp" in available()
    assert MtpDrafter().needs_mtp_hidden and not MtpDrafter().rollback_depth
    dec = Decoder(bigram(), drafter="mtp", n_max=3, n_ctx=256)
    assert isinstance(dec.drafters[0], MtpDrafter)
    assert dec.ctx.mtp_hidden == "dense" and dec.model.supports_mtp
    assert dec.drafters[0].mtp_ctx.is_mtp and dec.drafters[0].mtp_ctx.mtp_hidden == "dense"


def test_equals_plain_decoder(bigram):
    path = bigram("qwen35", 0.2)
    plain = Decoder(path, n_ctx=512).generate(PROMPT, max_tokens=160)
    assert plain.tokens == greedy_cycle(path, PROMPT, 160)
    for n_max in (1, 3):
        _, _, res = _run(path, n_max, 160)
        assert res.tokens == plain.tokens


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n_max", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("noise", [0.0, 0.2])
def test_greedy_equals_plain_short(bigram, arch, n_max, noise):
    path = bigram(arch, noise)
    dec, d, res = _run(path, n_max, 96)
    assert res.tokens == greedy_cycle(path, PROMPT, 96)
    st = res.stats
    if noise == 0.0:
        assert st.acceptance_rate == 1.0
        assert set(d.counts) == {n_max}
    else:
        assert 0.1 < st.acceptance_rate < 0.95
    # one MTP decode per draft token: a round's catch-up never costs a decode of its own; only
    # the prompt's (more rows than a round leaves) is decoded apart, so the draft steps' time
    # stays a measure of drafting for the adaptive policy
    c = d.counters()
    assert c["flushes"] == 1 and c["decodes"] == st.drafted + 1


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n_max", [1, 2, 3, 4, 5])
def test_greedy_equals_plain_long(bigram, arch, n_max):
    """600 tokens (past one full successor cycle of 512) at four acceptance levels."""
    seen = set()
    rates = []
    for noise in (0.0, 0.15, 0.2, 0.3):
        path = bigram(arch, noise)
        _, d, res = _run(path, n_max, 600)
        assert res.tokens == greedy_cycle(path, PROMPT, 600), f"noise {noise}"
        seen |= set(d.counts)
        rates.append(res.stats.acceptance_rate)
        if noise == 0.2:   # the middle level alone shows every acceptance count
            assert set(d.counts) == set(range(n_max + 1)), d.counts
    assert seen == set(range(n_max + 1))
    assert rates[0] == 1.0 and rates == sorted(rates, reverse=True)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_greedy_equals_plain_mid(model_file, dtype):
    """The mid-sized bigram (vocab 32k, n_embd 1024, ~190M params), head at ~70% first-draft
    accuracy: 512 tokens for n_max 1..5, every acceptance count seen, output the cycle."""
    path = model_file(f"bigram-mid-{dtype}-n0.147.gguf",
                      lambda p: write_bigram_mtp_model(p, size="mid", noise=0.147, dtype=dtype))
    for n_max in range(1, 6):
        _, d, res = _run(path, n_max, 512, n_threads=2)
        assert res.tokens == greedy_cycle(path, PROMPT, 512), f"n_max {n_max}"
        assert set(d.counts) == set(range(n_max + 1)), (n_max, d.counts)


def test_high_acceptance_at_noise_zero(bigram):
    _, _, res = _run(bigram("qwen35", 0.0), 4, 200)
    st = res.stats
    assert st.acceptance_rate == 1.0
    assert st.rounds <= 200 // 5 + 2          # five tokens a round


def test_stops_at_end_of_generation(bigram_eos_path):
    """A draft that reaches the end-of-generation token stops there; so does the output."""
    plain = Decoder(bigram_eos_path, n_ctx=1024).generate(PROMPT, max_tokens=600)
    assert plain.finish_reason == "eos" and len(plain.tokens) < 512
    for n_max in (1, 4):
        _, _, res = _run(bigram_eos_path, n_max, 600)
        assert res.tokens == plain.tokens and res.finish_reason == "eos"
        assert res.stats.acceptance_rate == 1.0


def test_exact_mode(bigram):
    path = bigram("qwen35", 0.2)
    dec = Decoder(path, drafter="mtp", n_max=3, n_ctx=512, exact=True)
    assert not dec.model.use_extra_bufts
    res = dec.generate(PROMPT, max_tokens=100)
    assert res.tokens == greedy_cycle(path, PROMPT, 100) and res.stats.accepted > 0


def test_p_min_stops_unsure_drafts(bigram):
    path = bigram("qwen35", 0.2)
    _, _, loose = _run(path, 4, 160)
    _, _, strict = _run(path, 4, 160, p_min=0.9)
    assert strict.tokens == loose.tokens == greedy_cycle(path, PROMPT, 160)
    assert strict.stats.drafted < loose.stats.drafted
    assert strict.stats.acceptance_rate > loose.stats.acceptance_rate
    assert MtpDrafter(p_min=0.5).p_min == 0.5
    with pytest.raises(ValueError, match="p_min"):
        MtpDrafter(p_min=2)


# --------------------------------------------------------------------------------------
# the drafts themselves
# --------------------------------------------------------------------------------------

class BigramHead:
    """numpy MTP head of a bigram model: its attention and FFN add zero (checked by
    _Tensors), so a step is eh_proj(concat(enorm(e), hnorm(h))) -> norm -> output."""

    def __init__(self, path):
        ts = _Tensors(path)
        p = f"blk.{ts.n_layer}.nextn."
        self.embd, self.out = ts["token_embd.weight"], ts["output.weight"]
        self.onorm = ts["output_norm.weight"]
        self.enorm, self.hnorm = ts[p + "enorm.weight"], ts[p + "hnorm.weight"]
        self.eh = ts[p + "eh_proj.weight"]
        self.shn = ts.get(p + "shared_head_norm.weight", "output_norm.weight")

    def draft(self, prev, last, n):
        """Drafts after ``last``, whose target row is h(prev) = output_norm(embd[prev])."""
        h, x, res = _rmsnorm(self.embd[prev], self.onorm), last, []
        for _ in range(n):
            cur = np.concatenate([_rmsnorm(self.embd[x], self.enorm),
                                  _rmsnorm(h, self.hnorm)]) @ self.eh.T
            h = _rmsnorm(cur, self.shn)
            x = int(np.argmax(self.out @ h))
            res.append(x)
        return res


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chain", [0, 3])
def test_drafts_equal_numpy_head(bigram, arch, chain):
    """Noise makes the head depend on h: the first draft checks which target row is paired
    with which token, the later ones that the head is fed its own output row."""
    path = bigram(arch, 0.3)
    head = BigramHead(path)
    mtp = ChainedHeadsMtpDrafter(chain_heads=chain) if chain else MtpDrafter()
    chk = Checking(mtp, lambda seq, hist, last, n: head.draft(hist[-1], last, n))
    dec = Decoder(path, drafter=[chk, mtp], n_max=3, n_ctx=512, load_mtp=True)
    res = dec.generate(PROMPT, max_tokens=200)
    assert res.tokens == greedy_cycle(path, PROMPT, 200)
    assert chk.mtp_rounds > 40 and chk.checked == chk.asked >= 3 * (chk.mtp_rounds - 2)
    assert mtp.n_heads == max(1, chain)


def _scripted_run(model, n_max, *, n_seq=1, script=None, chain=0, mtp_spec=None, tokens=40):
    mtp = ChainedHeadsMtpDrafter(mtp_spec, chain_heads=chain) if chain else MtpDrafter(mtp_spec)
    ref = Scratch(model, None if mtp_spec is None else Model(mtp_spec, load_mtp=True))
    chk = Checking(mtp, ref.draft, script, ref.oracle)
    dec = Decoder(model, drafter=[chk, mtp], n_max=n_max, n_ctx=256 * n_seq, n_seq_max=n_seq)
    prompts = [PROMPT[: 4 + 2 * s] for s in range(n_seq)]
    res = dec.generate_batch(prompts, max_tokens=tokens)
    return dec, chk, mtp, res


@pytest.mark.parametrize("n_max", [1, 3])
def test_drafts_equal_scratch_on_random_model(tiny_qwen35, n_max):
    """Random weights: the MTP attention reads its KV, so a mirroring slip shows up."""
    _, chk, mtp, res = _scripted_run(tiny_qwen35, n_max, tokens=40)
    assert chk.mtp_rounds >= 10 and chk.checked >= chk.asked * 0.9
    assert len(res[0].tokens) == 40


def test_drafts_equal_scratch_with_oracle_rounds(tiny_qwen35):
    """Every third round another drafter proposes the target's own continuation with one
    wrong token (so 0..n_max are accepted in turn): the MTP drafter only observes those
    rounds and must still draft from exactly the right state afterwards."""
    dec, chk, mtp, res = _scripted_run(tiny_qwen35, 3, script=lambda s, r: r % 3 != 0,
                                       tokens=80)
    assert chk.mtp_rounds >= 20 and chk.oracle_accepts == {0, 1, 2, 3}
    assert chk.checked >= chk.asked * 0.9


def test_drafts_equal_scratch_multi_sequence(tiny_qwen35):
    """Three sequences at different lengths share the MTP batch and context."""
    _, chk, mtp, res = _scripted_run(tiny_qwen35, 2, n_seq=3, tokens=30,
                                     script=lambda s, r: (r + s) % 3 != 0)
    assert set(chk.rounds) == {0, 1, 2}
    assert chk.mtp_rounds >= 20 and len(chk.oracle_accepts) >= 2
    plain = Decoder(tiny_qwen35, n_ctx=256)
    for s, r in enumerate(res):
        assert len(r.tokens) == 30
        assert r.tokens[:5] == plain.generate(PROMPT[: 4 + 2 * s], max_tokens=5).tokens


def test_drafts_equal_scratch_chained_heads(tiny_qwen35):
    """The multi-head path (one context per head, the prefix re-run per step) with three
    copies of qwen35's single head drafts exactly what the recurrent single head drafts."""
    _, chk, mtp, _ = _scripted_run(tiny_qwen35, 3, chain=3, script=lambda s, r: r % 3 != 1,
                                   tokens=40)
    assert mtp.n_heads == 3 and chk.mtp_rounds >= 8


# --------------------------------------------------------------------------------------
# sequences, chains, separate head files, sampling
# --------------------------------------------------------------------------------------

def test_multi_sequence(bigram):
    path = bigram("qwen35", 0.15)
    prompts = [PROMPT, [7, 8, 9], [100, 200, 300, 400, 17]]
    d = Counting()
    dec = Decoder(path, drafter=d, n_max=3, n_ctx=1024, n_seq_max=3, load_mtp=True)
    for _ in range(2):   # twice: a new request must not see the last one's state
        res = dec.generate_batch(prompts, max_tokens=120)
        for p, r in zip(prompts, res):
            assert r.tokens == greedy_cycle(path, p, 120)
        assert res[0].stats.acceptance_rate > 0.7
    # and a single request on the same decoder afterwards
    assert dec.generate(prompts[2], max_tokens=50).tokens == greedy_cycle(path, prompts[2], 50)


def test_chained_after_ngram(bigram):
    """The prompt holds a later stretch of the successor cycle, so the n-gram drafter takes
    over when generation reaches it; the MTP drafter, observing those rounds, keeps drafting
    perfectly before and after."""
    path = bigram("qwen35", 0.0)
    cycle = greedy_cycle(path, [0], 512)
    prompt = cycle[150:190] + cycle[0:6]
    d = Counting()
    dec = Decoder(path, drafter=["ngram", d], n_max=4, n_ctx=1024, load_mtp=True)
    res = dec.generate(prompt, max_tokens=300)
    assert res.tokens == greedy_cycle(path, prompt, 300)
    st = res.stats
    mtp_rounds = sum(d.counts.values())
    assert 0 < mtp_rounds < st.draft_rounds        # both drafters proposed
    assert set(d.counts) == {4}                      # every MTP draft fully accepted
    assert st.acceptance_rate > 0.95


def test_mtp_only_head_file(split_qwen35, tiny_qwen35_path):
    """A trunk-only target with the head from a separate MTP-only file drafts exactly what
    the one-file model drafts (same weights), and what the scratch reference drafts."""
    full, trunk, head = split_qwen35
    drafts = []
    for target, spec in ((full, "mtp"), (trunk, f"mtp:{head}")):
        rec = []
        mtp = specdec.drafters.create(spec)

        class Recording(Drafter):
            def propose(self, seq, last, n):
                got = run_propose(mtp, seq, last, n)
                rec.append(got)
                return got

        dec = Decoder(target, drafter=[Recording("rec"), mtp], n_max=3, n_ctx=256, load_mtp=True)
        assert dec.model.n_mtp_layers == (1 if target == full else 0)
        out = dec.generate(PROMPT, max_tokens=40).tokens
        drafts.append((out, rec))
    assert drafts[0] == drafts[1] and len(drafts[0][1]) >= 10
    _, chk, _, _ = _scripted_run(Model(trunk, load_mtp=True), 3, mtp_spec=head, tokens=30)
    assert chk.checked >= 20


def test_mtp_head_file_on_bigram(bigram, tmp_path):
    """An already loaded head Model works too, and a head from another model still only
    changes acceptance, never the output."""
    path = bigram("qwen35", 0.0)
    head = Model(path, load_mtp=True)
    d = MtpDrafter(head)
    _, _, res = _run(path, 3, 100, drafter=d)
    assert d.mtp_model is head and res.stats.acceptance_rate == 1.0
    other = MtpDrafter(bigram("qwen35", 0.3))
    _, _, res2 = _run(path, 3, 100, drafter=other)
    assert res2.tokens == res.tokens and res2.stats.acceptance_rate < 0.8


@pytest.mark.parametrize("head", ["q8_0", "q4_0"])
def test_requantized_own_head(bigram, head, tmp_path, monkeypatch):
    """``mtp:q4_0`` drafts with a Q4_0 copy of the target's own head, written once to the cache."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    path = bigram("qwen35", 0.0)
    dec, _, res = _run(path, 3, 200, drafter=f"mtp:{head}")
    d = dec.drafters[0]
    assert res.tokens == greedy_cycle(path, PROMPT, 200)
    assert res.stats.acceptance_rate > 0.9
    m = d.mtp_model
    assert m.path != dec.model.path and m.path.startswith(str(tmp_path))
    import gguf
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(m.path).tensors}
    assert types["output.weight"] == head.upper()
    assert not any(n.startswith("blk.0.") for n in types)      # trunk layers left out
    again = Decoder(path, drafter=f"mtp:{head.upper()}", n_max=2, n_ctx=256)
    assert again.drafters[0].mtp_model.path == m.path        # derived once, then reused


def test_requantized_head_needs_mtp_layers(tiny_qwen35_nomtp_path):
    with pytest.raises(ValueError, match="no MTP"):
        Decoder(tiny_qwen35_nomtp_path, drafter="mtp:q4_0", n_max=2, n_ctx=256)


def test_sampled_mode_runs(bigram):
    path = bigram("qwen35", 0.0)
    dec = Decoder(path, drafter="mtp", n_max=3, n_ctx=512)
    res = dec.generate(PROMPT, max_tokens=80, sampling=Sampling(temperature=0.8, seed=4))
    assert len(res.tokens) == 80
    assert res.stats.acceptance_rate > 0.9      # the bigram target is nearly deterministic
    hot = dec.generate(PROMPT, max_tokens=80, sampling=Sampling(temperature=8.0, top_k=4, seed=4))
    assert len(hot.tokens) == 80 and 0.2 < hot.stats.acceptance_rate < 0.95
    again = dec.generate(PROMPT, max_tokens=80, sampling=Sampling(temperature=8.0, top_k=4, seed=4))
    assert again.tokens == hot.tokens


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_sampled_distribution_matches_target(bigram, arch):
    """Rejection sampling with MTP drafts (one-hot q): the first three tokens of a hot
    bigram target follow the target's exact joint law (qwen3next: rolled back by
    checkpoints). The bigram's runner-up logits tie
    in steps of 0.3125 (dot products of +-1 rows), so the support is cut with min_p
    halfway between two steps, never through a tie as top-k could."""
    path = bigram(arch, 0.0)
    model = Model(path, load_mtp=True)
    temp, min_p, n_seq, n_samples = 8.0, float(np.exp(-15.47)), 16, 2400
    prompt = [11, 52, 97]
    joint = target_joint(model, prompt, 3, temp, min_p)
    tgt = Context(model, n_ctx=64 * n_seq, n_batch=64, n_seq_max=n_seq,
                  n_rollback=2 if model.supports_partial_rollback else 0)
    counts, st = speculative_counts(tgt, MtpDrafter(), prompt, 3, 2, temp, min_p, n_samples)
    assert st["drafted"] > 0 and 0 < st["accepted"] < st["drafted"]
    assert model.supports_partial_rollback or st["redecodes"] > 0
    assert 8 <= len(joint) <= 200
    p = chi_square_p(counts, joint)
    assert p > 1e-3, f"chi-square p={p:.2e}"


# --------------------------------------------------------------------------------------
# errors before llama.cpp could abort
# --------------------------------------------------------------------------------------

def test_model_without_mtp_layers(tiny_qwen35_nomtp_path):
    with pytest.raises(ValueError, match=r"no MTP \(NextN\) layers.*mtp:PATH"):
        Decoder(tiny_qwen35_nomtp_path, drafter="mtp", n_ctx=64)


def test_mtp_with_load_mtp_off(tiny_qwen35_path):
    with pytest.raises(ValueError, match="load_mtp"):
        Decoder(tiny_qwen35_path, drafter="mtp", load_mtp=False, n_ctx=64)
    with pytest.raises(ValueError, match="load_mtp"):
        Decoder(Model(tiny_qwen35_path), drafter="mtp", n_ctx=64)


def test_arch_without_mtp_graph(tiny_dense_path, tiny_dense):
    with pytest.raises(ValueError, match="no MTP graph"):
        Decoder(tiny_dense_path, drafter="mtp", n_ctx=64)
    with pytest.raises(ValueError, match="no MTP graph"):
        MtpDrafter().bind(Context(tiny_dense, n_ctx=64))


def test_n_rs_seq_too_small(tiny_qwen35):
    ctx = Context(tiny_qwen35, n_ctx=64, n_batch=16, n_rollback=1, mtp_hidden="dense")
    d = MtpDrafter()
    d.configure(SpecConfig(n_max=3))
    with pytest.raises(ValueError, match="n_rollback=1 .* too small"):
        d.bind(ctx)
    d = MtpDrafter()
    d.bind(ctx)
    with pytest.raises(ValueError, match="n_rollback"):
        Controller(ctx, [d], n_max=3)


def test_head_file_checks(tiny_qwen35, tiny_qwen35_nomtp_path, tmp_path):
    ctx = Context(tiny_qwen35, n_ctx=64, n_batch=16, n_rollback=3)
    with pytest.raises(ValueError, match="no MTP"):
        MtpDrafter(tiny_qwen35_nomtp_path).bind(ctx)
    other = write_tiny_qwen35(tmp_path / "v512.gguf", n_vocab=512, mtp_only=True)
    with pytest.raises(ValueError, match="vocabulary"):
        MtpDrafter(other).bind(ctx)
    with pytest.raises(ValueError, match="load_mtp=False"):
        MtpDrafter(Model(str(other))).bind(ctx)
    with pytest.raises(ValueError, match="not to an MTP context"):
        MtpDrafter().bind(Context(tiny_qwen35, n_ctx=64, kind="mtp"))


def test_hooks_need_binding_and_rows(tiny_qwen35):
    d = MtpDrafter()
    with pytest.raises(RuntimeError, match="not bound"):
        run_propose(d, 0, 1, 2)
    ctx = Context(tiny_qwen35, n_ctx=64, n_batch=16, n_rollback=3)
    d.bind(ctx)
    assert ctx.mtp_hidden == "dense"     # bind turns the target's hidden rows on
    with pytest.raises(ValueError, match="row0"):
        run_observe(d, 0, [1, 2])
    with pytest.raises(ValueError, match="sequence"):
        run_propose(d, 3, 1, 2)


def test_nextn_modes_the_drafter_relies_on(split_qwen35):
    full, trunk, _ = split_qwen35
    # a trunk-only target still emits h_nextn (its graph builds it for every qwen35 file)
    t = Context(Model(trunk), n_ctx=64, n_batch=8, mtp_hidden="dense")
    b = Batch(4)
    for i, tok in enumerate([5, 6, 7]):
        b.add(tok, i, 0, i == 2)
    t.decode(b)
    assert np.isfinite(np.array(t.mtp_hidden_rows())).all()
    m = Model(full, load_mtp=True)
    c = Context(m, n_ctx=64, n_batch=8, kind="mtp")
    assert c.mtp_hidden == "masked"        # the default, what llama.cpp's common uses
    c.set_mtp_hidden("dense")
    assert c.mtp_hidden == "dense"
    with pytest.raises(ValueError, match="always outputs"):
        c.set_mtp_hidden(None)


# --------------------------------------------------------------------------------------
# llama.cpp behaviour the design depends on
# --------------------------------------------------------------------------------------

def test_llama_masked_mtp_rows_are_the_first_rows(tiny_qwen35):
    """In masked mode llama.cpp copies the first n_outputs rows of the MTP graph's unpruned
    h_nextn, so an output row behind non-output rows gets the wrong hidden state. The
    drafter queues catch-up rows in front of its draft row, hence mtp_hidden='dense'."""
    m = tiny_qwen35
    E = m.n_embd_out
    H = np.random.default_rng(0).standard_normal((4, E)).astype(np.float32)
    toks = [5, 9, 13, 20]

    def run(outs, mode):
        c = Context(m, n_ctx=64, n_batch=16, kind="mtp", mtp_hidden=mode)
        b = Batch(8, n_embd=E)
        for i, t in enumerate(toks):
            b.add(t, i, 0, outs[i], embd=H[i])
        c.decode(b)
        return c

    every = run([True] * 4, "masked")
    rows = [np.array(every.mtp_hidden_row(i)) for i in range(4)]
    masked = run([False, False, False, True], "masked")
    np.testing.assert_allclose(masked.logits(3), every.logits(3), atol=1e-4)
    np.testing.assert_allclose(masked.mtp_hidden_row(3), rows[0], atol=1e-4)   # not rows[3]
    dense = run([False, False, False, True], "dense")
    for i in range(4):
        np.testing.assert_allclose(dense.mtp_hidden_row(i), rows[i], atol=1e-4)
