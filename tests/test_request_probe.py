"""A new request's probe is its own: where the shared adaptive policy drafts nothing and its
nearly free drafter was right before, a request begins with a probe of its own sequence (its
whole cap drafted and verified), and probes again while such probes are all accepted; the
other sequences sharing the policy are not probed because one request joined. Before, each
new request restarted the policy's probe schedule, and at 4 slots the round it joined in
verified the whole cap of all four (``_checks.shared_request_probe``: that behaviour, for
comparison). Counts only: the policy's decisions depend on no time (``UnpaidPolicy``)."""
from __future__ import annotations

import pytest
from bigram_greedy import greedy_cycle

from specdec import Decoder
from specdec._checks import UnpaidPolicy, shared_request_probe
from specdec._controller import Controller
from specdec.drafters import Drafter
from specdec.testing import bigram_successor

N_MAX = 4
RIGHT = 3       # the joining request's slot: its drafts are the greedy text, the others' never


class _Keyed(Drafter):
    """The greedy continuation on slot ``RIGHT``; elsewhere a first token that is never it."""

    def __init__(self, succ):
        super().__init__("keyed")
        self.succ = succ

    def propose(self, seq, last_token, n_max):
        out, t = [], last_token
        for _ in range(n_max):
            t = int(self.succ[t])
            out.append(t)
        if seq != RIGHT and out:
            out[0] = (out[0] + 1) % len(self.succ)
        return out


def _drafted(ctl):
    return [ctl.stats(i)["drafted"] for i in range(4)]


def _join_round(path, shared):
    """Three requests run 20 rounds, a fourth joins: the drafts of each slot in the three
    requests' first round, by the 20th, in the fourth's first round and in its second."""
    old = shared_request_probe(shared)
    try:
        succ = bigram_successor(path)
        dec = Decoder(path, drafter=_Keyed(succ), n_max=N_MAX, n_seq_max=4, n_ctx=4096)
        ctl = Controller(dec.ctx, dec.drafters, n_max=N_MAX)
        pol = UnpaidPolicy(N_MAX)
        walks = [[f] + greedy_cycle(path, [f], 11) for f in (3, 12, 21, 30)]
        for i in range(3):
            ctl.join(i, walks[i], max_tokens=400, n_max=N_MAX, policy=pol)
        ctl.step()
        seen = [_drafted(ctl)]
        for _ in range(19):
            ctl.step()
        seen.append(_drafted(ctl))
        ctl.join(RIGHT, walks[RIGHT], max_tokens=400, n_max=N_MAX, policy=pol)
        for _ in range(2):
            ctl.step()
            seen.append(_drafted(ctl))
        for i in range(4):
            toks = ctl.tokens(i)
            assert toks == greedy_cycle(path, walks[i], len(toks))
        return seen
    finally:
        shared_request_probe(old)


def test_a_joining_request_probes_its_own_sequence_alone(bigram_tiny_path):
    first, before, joined, again = _join_round(bigram_tiny_path, shared=False)
    # each request's first round is its probe, the whole cap, missed: none owed after it
    assert first == [N_MAX] * 3 + [0]
    assert before == first
    # the fourth request probes alone; its probe was all accepted, so it probes again
    assert joined == first[:3] + [N_MAX]
    assert again == first[:3] + [2 * N_MAX]


def test_restarting_the_shared_schedule_probed_every_sequence(bigram_tiny_path):
    """The old behaviour: a round right after the fourth request joined drafted for all four
    (the second: the first round's shared decision was made before its request began)."""
    _, before, joined, again = _join_round(bigram_tiny_path, shared=True)
    assert all(again[i] > before[i] for i in range(4)), (before, joined, again)
