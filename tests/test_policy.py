"""The adaptive draft-length policy: it weighs what a draft costs to make as well as to verify.

A model drafter (MTP head, draft model) pays a decode per draft token, so the policy
must decide how many tokens to *ask for*, not only how many of the answer to verify.
The drafters here are oracles that know the bigram model's greedy output and sleep a
set time per requested token, so cost and acceptance are both under the test's control.
"""
import time

import pytest

import specdec
from specdec import Decoder
from specdec.drafters import Drafter
from specdec.testing import bigram_successor


class CostlyOracle(Drafter):
    """Drafts the bigram's true continuation (every ``wrong_every``-th token wrong), sleeping
    ``cost`` seconds per requested token, and counts the tokens it was asked for."""

    def __init__(self, succ, cost, wrong_every=0):
        super().__init__("costly-oracle")
        self.succ, self.cost, self.wrong_every = succ, cost, wrong_every
        self.calls, self.asked, self.n = 0, 0, 0

    def propose(self, seq, last_token, n_max):
        self.calls += 1
        self.asked += n_max
        time.sleep(self.cost * n_max)
        out, t = [], last_token
        for _ in range(n_max):
            t = int(self.succ[t])
            self.n += 1
            out.append((t + 1) % len(self.succ) if self.wrong_every and
                       self.n % self.wrong_every == 0 else t)
        return out


@pytest.fixture(scope="module")
def bigram(bigram_tiny_path):
    return specdec.Model(bigram_tiny_path), bigram_successor(bigram_tiny_path)


PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def _plain_tokens(model, n):
    return Decoder(model, n_ctx=1024).generate(PROMPT, max_tokens=n).tokens


def test_a_drafter_costlier_than_its_gain_is_not_asked(bigram):
    """Each requested token costs ~10 plain decodes of the tiny model: no draft pays,
    so the policy stops calling the drafter (probes aside) and plain speed is kept."""
    model, succ = bigram
    t_plain = Decoder(model, n_ctx=1024).generate(PROMPT, max_tokens=200).stats
    cost = 10 * t_plain.t_target_s / t_plain.rounds
    d = CostlyOracle(succ, cost, wrong_every=2)
    r = Decoder(model, drafter=d, n_max=6, adaptive=True, n_ctx=1024, check=True).generate(
        PROMPT, max_tokens=200)
    assert r.tokens == _plain_tokens(model, 200)
    assert d.calls < 0.2 * r.stats.rounds, f"asked {d.calls} times in {r.stats.rounds} rounds"
    assert d.asked / max(d.calls, 1) < 3, "probes should ask for short drafts"


def test_a_costly_drafter_is_asked_for_the_length_that_pays(bigram):
    """Perfect drafts at one plain decode's cost per token: a long draft still pays, but the
    policy must not ask for more than it verifies (the old policy asked n_max every round)."""
    model, succ = bigram
    t_plain = Decoder(model, n_ctx=1024).generate(PROMPT, max_tokens=200).stats
    cost = t_plain.t_target_s / t_plain.rounds
    d = CostlyOracle(succ, cost, wrong_every=3)   # accepted runs of 2 tokens
    dec = Decoder(model, drafter=d, n_max=8, adaptive=True, n_ctx=1024, check=True)
    r = dec.generate(PROMPT, max_tokens=300)
    assert r.tokens == _plain_tokens(model, 300)
    assert r.stats.accepted > 0
    # runs of at most 2 accepted tokens: asking for 8 wastes 5+ paid tokens per round
    assert d.asked / d.calls < 5, f"asked {d.asked / d.calls:.1f} tokens per call"



def test_decoder_keeps_its_policy_across_requests(tiny_dense_path):
    """What the adaptive policy measured in one request is there in the next (a fresh policy
    per request re-learnt, and re-paid for, its probes every time); greedy and sampled
    verification accept differently and keep a policy each."""
    from specdec import Decoder
    dec = Decoder(tiny_dense_path, drafter="ngram", n_max=4, adaptive=True)
    prompt = "one two three four one two three four one two three"
    dec.generate(prompt, max_tokens=24)
    greedy = dec._policies[True]
    learnt = greedy.state()
    assert any(t > 0 for t in learnt["t_verify"])
    dec.generate(prompt, max_tokens=24)
    assert dec._policies[True] is greedy
    dec.generate(prompt, max_tokens=8, sampling={"temperature": 0.7, "seed": 1})
    assert dec._policies[False] is not greedy
    fixed = Decoder(tiny_dense_path, drafter="ngram", n_max=4)
    fixed.generate(prompt, max_tokens=8)
    assert not fixed._policies[True].adaptive
