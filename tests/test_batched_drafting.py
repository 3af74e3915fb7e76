"""Batched proposals: one drafter call per round for all the sequences that ask it, and for
the drafters with a model one decode of their context per draft step however many
sequences draft (counted by the drafter context's ``n_decodes``); a Python ``propose_batch``
is honoured, a Python ``propose`` still asked per sequence; exact mode's concurrent requests
still equal their runs alone with batched drafting."""
from __future__ import annotations

import pytest
from bigram_greedy import greedy_cycle

import specdec
from specdec import Decoder, Engine, Sampling
from specdec._controller import Controller
from specdec.drafters import Drafter, DrafterError
from specdec.drafters._run import run_propose_batch
from specdec.drafters.mtp import MtpDrafter
from specdec.testing import write_bigram_mtp_model
from specdec.testing.dflash import write_dflash_draft
from specdec.testing.eagle3 import noise_for_acceptance, write_eagle3_draft

N_SLOTS = 8
N_MAX = 4


@pytest.fixture(scope="module")
def period_target(model_file):
    return model_file("bigram-qwen35-period16.gguf",
                      lambda p: write_bigram_mtp_model(p, period=16))


def _walks(target, n=N_SLOTS, length=12):
    return [[first] + greedy_cycle(target, [first], length - 1)
            for first in range(3, 3 + 9 * n, 9)]


def _draft_ctx(d):
    return d.mtp_ctx if isinstance(d, MtpDrafter) else d.draft_ctx


def _rounds_of_8(target, drafter, prompts, max_tokens=200, bigram=True, rounds=6):
    """Join 8 sequences and run rounds while all 8 draft: the drafter context's decodes (and
    encodes) of each such round (and on a bigram target, the greedy text checked)."""
    dec = Decoder(target, drafter=drafter, n_max=N_MAX, n_seq_max=N_SLOTS, n_ctx=4096)
    d = dec.drafters[0]
    ctl = Controller(dec.ctx, dec.drafters, n_max=N_MAX)
    for i, p in enumerate(prompts):
        ctl.join(i, p, max_tokens=max_tokens, n_max=N_MAX)
    ctl.step()          # the first round also catches up on the prompts
    ctx = _draft_ctx(d)
    per_round = []
    for _ in range(rounds):       # far from max_tokens: every cap is n_max
        dec0, enc0, drafted0 = ctx.n_decodes, ctx.n_encodes, ctl.stats()["drafted"]
        assert ctl.step() == N_SLOTS
        per_round.append((ctx.n_decodes - dec0, ctx.n_encodes - enc0,
                          ctl.stats()["drafted"] - drafted0))
    for i, p in enumerate(prompts):
        assert not bigram or ctl.tokens(i)[:10] == greedy_cycle(target, p, 10)
    return per_round


def _check_one_decode_per_step(per_round, max_decodes=N_MAX):
    assert len(per_round) >= 3
    for n_dec, n_enc, drafted in per_round:
        assert 1 <= n_dec <= max_decodes, per_round
        assert n_enc <= 1, per_round
    # the sequences really drafted (one decode per sequence per step would be 8x these)
    assert sum(r[2] for r in per_round) >= N_SLOTS * len(per_round)


def test_mtp_round_of_8_makes_n_max_decodes(bigram_tiny_path):
    _check_one_decode_per_step(_rounds_of_8(bigram_tiny_path, "mtp", _walks(bigram_tiny_path)))


def test_draft_model_round_of_8_makes_n_max_decodes(tiny_dense_path):
    """The target as its own draft model (every draft accepted)."""
    prompts = [[1 + i, 11, 52 + i, 97] for i in range(N_SLOTS)]
    per_round = _rounds_of_8(tiny_dense_path, f"draft:{tiny_dense_path}", prompts, bigram=False)
    _check_one_decode_per_step(per_round)


def test_eagle3_round_of_8_makes_n_max_decodes(model_file, bigram_tiny_path):
    target = model_file("bigram-qwen35-n0.0.gguf", lambda p: write_bigram_mtp_model(p))
    noise = noise_for_acceptance(target, 0.9)
    draft = model_file("eagle3-0.9.gguf", lambda p: write_eagle3_draft(p, target, noise=noise))
    _check_one_decode_per_step(_rounds_of_8(target, f"eagle3:{draft}", _walks(target)))


def test_dflash_round_of_8_makes_two_decodes(model_file, period_target):
    draft = model_file("dflash-0.9.gguf",
                       lambda p: write_dflash_draft(p, period_target, acceptance=0.9))
    # one feature decode and one block decode for all 8
    _check_one_decode_per_step(_rounds_of_8(period_target, f"dflash:{draft}",
                                            _walks(period_target, length=20)), max_decodes=2)


def test_batched_drafts_equal_drafts_one_at_a_time(bigram_tiny_path):
    """The MTP head's drafts for 8 sequences in one batch equal its drafts for each alone
    (the head is a bigram: its guesses do not depend on the batch)."""
    prompts = _walks(bigram_tiny_path)
    answers = []
    for batched in (True, False):
        dec = Decoder(bigram_tiny_path, drafter="mtp", n_max=N_MAX, n_seq_max=N_SLOTS, n_ctx=2048)
        ctl = Controller(dec.ctx, dec.drafters, n_max=0)
        for i, p in enumerate(prompts):
            ctl.join(i, p, max_tokens=1, n_max=0)
        d = dec.drafters[0]
        lasts = [ctl.tokens(i)[-1] for i in range(N_SLOTS)]
        caps = [N_MAX, 1, 3, 0, N_MAX, 2, N_MAX, 1]
        if batched:
            answers.append(run_propose_batch(d, list(range(N_SLOTS)), lasts, caps))
        else:
            answers.append([run_propose_batch(d, [i], [lasts[i]], [caps[i]])[0]
                            for i in range(N_SLOTS)])
    assert answers[0] == answers[1]
    assert [len(a) for a in answers[0]] == [N_MAX, 1, 3, 0, N_MAX, 2, N_MAX, 1]


def test_chained_mtp_heads_make_one_decode_per_head(bigram_tiny_path):
    """Chained heads (three copies of the bigram's head, each with its own context): a round
    of 8 sequences makes one decode of each head's context, where one sequence at a time made
    one per sequence per head, and each sequence's draft equals its draft alone. The queued
    catch-up (here the prompts) goes into every head's context first: one decode of each
    for the whole round (a flush), one per drafting sequence when asked one at a time."""
    from specdec.drafters._test_hooks import ChainedHeadsMtpDrafter
    prompts = _walks(bigram_tiny_path)
    caps = [3, 1, 3, 0, 2, 3, 1, 3]
    answers, decodes, flushes = [], [], []
    for batched in (True, False):
        d = ChainedHeadsMtpDrafter(chain_heads=3)
        dec = Decoder(bigram_tiny_path, drafter=d, n_max=3, n_seq_max=N_SLOTS, n_ctx=2048)
        ctl = Controller(dec.ctx, dec.drafters, n_max=0)
        for i, p in enumerate(prompts):
            ctl.join(i, p, max_tokens=1, n_max=0)
        lasts = [ctl.tokens(i)[-1] for i in range(N_SLOTS)]
        c0 = d.counters()
        if batched:
            answers.append(run_propose_batch(d, list(range(N_SLOTS)), lasts, caps))
        else:
            answers.append([run_propose_batch(d, [i], [lasts[i]], [caps[i]])[0]
                            for i in range(N_SLOTS)])
        c1 = d.counters()
        flushes.append(c1["flushes"] - c0["flushes"])
        # each flush decodes every head's context once; the rest are the draft steps
        decodes.append(c1["decodes"] - c0["decodes"] - 3 * flushes[-1])
    assert d.n_heads == 3
    assert answers[0] == answers[1]
    assert [len(a) for a in answers[0]] == caps       # the bigram head is always confident
    assert decodes == [3, sum(caps)]
    assert flushes == [1, sum(c > 0 for c in caps)]


class _BatchGuess(Drafter):
    """Drafts the target's successor cycle for all sequences in one call, and counts calls."""

    def __init__(self, succ):
        super().__init__("batchguess")
        self.succ = succ
        self.calls = []

    def propose_batch(self, seqs, last_tokens, n_maxs):
        self.calls.append(list(seqs))
        out = []
        for last, n in zip(last_tokens, n_maxs):
            toks = []
            for _ in range(n):
                last = int(self.succ[last])
                toks.append(last)
            out.append(toks)
        return out


def test_python_propose_batch_is_honoured(bigram_tiny_path):
    from specdec.testing import bigram_successor
    succ = bigram_successor(bigram_tiny_path)
    d = _BatchGuess(succ)
    prompts = _walks(bigram_tiny_path, n=4)
    with Engine(bigram_tiny_path, drafters={"g": d}, n_slots=4, n_ctx=1024, n_max=3) as eng:
        res = [h.result(60) for h in [eng.submit(p, max_tokens=30) for p in prompts]]
    for p, r in zip(prompts, res):
        assert r.tokens == greedy_cycle(bigram_tiny_path, p, 30)
        assert r.stats.accepted > 0
    # one call per round, several sequences in most of them
    assert max(len(c) for c in d.calls) >= 2
    assert all(len(set(c)) == len(c) for c in d.calls)


class _WrongCount(Drafter):
    def propose_batch(self, seqs, last_tokens, n_maxs):
        return [[]]


class _Boom(Drafter):
    def propose_batch(self, seqs, last_tokens, n_maxs):
        raise RuntimeError("boom")


def test_python_propose_batch_answers_are_checked(tiny_dense_path):
    dec = Decoder(tiny_dense_path, drafter=_WrongCount(), n_max=3, n_seq_max=2, n_ctx=512)
    with pytest.raises(DrafterError, match="one answer per sequence"):
        dec.generate_batch([[1, 2, 3], [4, 5, 6]], max_tokens=5)
    # the decoder stays usable (one sequence: one answer is right)
    assert len(dec.generate([1, 2, 3], max_tokens=5).tokens) == 5
    # in an Engine a failed batch hook fails the requests it drafted for, no others
    with Engine(tiny_dense_path, drafters={"boom": _Boom()}, n_slots=3, n_ctx=512, n_max=3) as eng:
        bad = [eng.submit([1, 2, 3], max_tokens=30, drafter="boom"),
               eng.submit([4, 5, 6], max_tokens=30, drafter="boom")]
        good = eng.submit([7, 8, 9], max_tokens=30, drafter="plain")
        for h in bad:
            with pytest.raises(DrafterError, match="boom"):
                h.result(30)
        assert good.result(30).finish_reason == "length"
        assert eng.stats()["failed"] == 2


class _CountingMtp(MtpDrafter):
    """A Python ``propose`` override of a built-in: asked once per sequence, as before."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.asked = 0

    def propose(self, seq, last_token, n_max):
        self.asked += 1
        return super().propose(seq, last_token, n_max)


def test_python_propose_override_is_asked_per_sequence(bigram_tiny_path):
    d = _CountingMtp()
    prompts = _walks(bigram_tiny_path, n=3)
    dec = Decoder(bigram_tiny_path, drafter=d, n_max=3, n_seq_max=3, n_ctx=1024)
    res = dec.generate_batch(prompts, max_tokens=30)
    for p, r in zip(prompts, res):
        assert r.tokens == greedy_cycle(bigram_tiny_path, p, 30)
    assert d.asked >= sum(r.stats.draft_rounds for r in res) > 0


def _bit_for_bit(path, drafters, reqs, n_slots=4, **kw):
    with Engine(path, drafters=drafters, n_slots=n_slots, n_ctx=1024, n_max=N_MAX, exact=True,
                **kw) as eng:
        alone = [eng.submit(**r).result(120) for r in reqs]
        together = [h.result(120) for h in [eng.submit(**r) for r in reqs]]
    for r, a, t in zip(reqs, alone, together):
        assert t.tokens == a.tokens, r
        assert [x.logprob for x in t.logprobs] == [x.logprob for x in a.logprobs], r
    assert sum(t.stats.drafted for t in together) > 0
    return together


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_exact_mtp_batched_equals_alone(model_file, arch):
    """Exact mode with batched MTP drafts on a hybrid target rolled back by snapshots
    (qwen35) and one rolled back by checkpoints (qwen3next): concurrent requests equal their
    runs alone, tokens and logprobs, greedy and seeded sampling."""
    path = model_file(f"bigram-{arch}-n0.3.gguf",
                      lambda p: write_bigram_mtp_model(p, arch=arch, noise=0.3))
    prompts = _walks(path, n=4, length=9)
    reqs = [dict(prompt=p, max_tokens=m, logprobs=0, drafter="mtp",
                 sampling=None if i % 2 == 0 else Sampling(temperature=0.8, seed=i))
            for i, (p, m) in enumerate(zip(prompts, [30, 17, 25, 40]))]
    _bit_for_bit(path, ["mtp"], reqs)


def test_exact_draft_model_batched_equals_alone(tiny_dense_path):
    reqs = [dict(prompt=p, max_tokens=m, logprobs=0)
            for p, m in zip([[1, 11, 52, 97], [5, 6, 7, 8] * 4, list(range(50, 70)), [42] * 9],
                            [30, 21, 40, 26])]
    _bit_for_bit(tiny_dense_path, {"draft": f"draft:{tiny_dense_path}"}, reqs)
