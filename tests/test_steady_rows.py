"""A lone request's verify batches held to one shape (``_steady_rows``): on a CUDA device a
new decode shape runs uncaptured and is captured again, so a draft length that changes from
round to round must not change the batch. Checked on the CPU with the mode forced on: the
target's decode shapes (``Context.n_shape_changes``) stop changing, the greedy output is
the target's own, and the drafts are verified as before."""
from __future__ import annotations

import pytest

from specdec import Decoder, Engine
from specdec import _checks
from specdec.drafters import Drafter
from specdec.testing import bigram_successor, write_bigram_mtp_model
from bigram_greedy import greedy_cycle

N_MAX = 4


@pytest.fixture(scope="module")
def hybrid_target(model_file):
    return model_file("bigram-qwen35-ubatch.gguf", lambda p: write_bigram_mtp_model(p))


@pytest.fixture
def steady():
    """Controllers built in the test hold a lone sequence's rows to one shape."""
    old = _checks.steady_rows(1)
    yield
    _checks.steady_rows(old)


class Varying(Drafter):
    """The target's own continuation (a bigram's successor cycle), 0, 1, ... N_MAX tokens in
    turn: an adaptive policy's changing draft lengths, and rounds held plain, made certain."""

    def __init__(self, succ):
        super().__init__("varying")
        self.succ, self.i = succ, 0

    def propose(self, seq, last_token, n_max):
        self.i += 1
        out, t = [], last_token
        for _ in range(min(self.i % (N_MAX + 1), n_max)):
            t = int(self.succ[t])
            out.append(t)
        return out


def _run(target, n_gen=60):
    prompt = [3, 11, 52, 97]
    with Decoder(target, drafter=Varying(bigram_successor(target)), n_max=N_MAX,
                 n_ctx=512) as dec:
        before = dec.ctx.n_shape_changes
        res = dec.generate(prompt, max_tokens=n_gen)
        return res, dec.ctx.n_shape_changes - before, dec._core.ctl.steady, prompt


def test_varying_drafts_keep_one_shape(hybrid_target, steady):
    res, changes, on, prompt = _run(hybrid_target)
    assert on
    assert res.tokens == greedy_cycle(hybrid_target, prompt, 60)
    # the prompt pass, then the first verify: every later verify has N_MAX + 1 rows
    assert changes <= 2, changes
    assert res.stats.drafted > 0 and res.stats.accepted == res.stats.drafted


def test_without_it_the_shape_follows_the_drafts(hybrid_target):
    """The same request as decoded where steady rows are off (the CPU's default): the
    verify's rows follow the draft length, a new shape nearly every round."""
    old = _checks.steady_rows(-1)
    try:
        res, changes, on, prompt = _run(hybrid_target)
    finally:
        _checks.steady_rows(old)
    assert not on                    # no CUDA device here: off by default
    assert res.tokens == greedy_cycle(hybrid_target, prompt, 60)
    assert changes >= res.stats.rounds // 2, (changes, res.stats.rounds)


def test_an_adaptive_mtp_request_keeps_its_output(hybrid_target, steady):
    """The adaptive policy with the model's own MTP head, rounds held plain included: the
    padded rows are dropped with the rejected drafts, the greedy output is the target's."""
    prompt = [5, 17, 40, 2]
    with Decoder(hybrid_target, drafter="mtp", n_max=N_MAX, adaptive=True, n_ctx=512) as dec:
        res = dec.generate(prompt, max_tokens=80)
    assert res.tokens == greedy_cycle(hybrid_target, prompt, 80)


def test_several_sequences_are_left_as_they_are(hybrid_target, steady):
    """Several sequences in a round are not padded to their longest (their rows would cost):
    their output is still the target's own."""
    prompts = [[3 + 9 * i, 11, 52 + i, 97] for i in range(3)]
    with Engine(hybrid_target, drafters=["mtp"], n_slots=3, n_max=N_MAX, adaptive=True,
                n_ctx=512) as eng:
        res = [h.result(120) for h in [eng.submit(p, max_tokens=40) for p in prompts]]
    for p, r in zip(prompts, res):
        assert r.tokens == greedy_cycle(hybrid_target, p, 40)


def test_mode_checked():
    with pytest.raises(ValueError):
        _checks.steady_rows(2)
