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
    def policies(d, greedy):      # the scheduler's, by verification kind
        return [p for key, p in d._core._policies.items() if key[2] is greedy]

    dec = Decoder(tiny_dense_path, drafter="ngram", n_max=4, adaptive=True)
    prompt = "one two three four one two three four one two three"
    dec.generate(prompt, max_tokens=24)
    [greedy] = policies(dec, True)
    learnt = greedy.state()
    assert any(t > 0 for t in learnt["t_verify"])
    dec.generate(prompt, max_tokens=24)
    [again] = policies(dec, True)
    assert again is greedy
    dec.generate(prompt, max_tokens=8, sampling={"temperature": 0.7, "seed": 1})
    [sampled] = policies(dec, False)
    assert sampled is not greedy
    fixed = Decoder(tiny_dense_path, drafter="ngram", n_max=4)
    fixed.generate(prompt, max_tokens=8)
    assert not policies(fixed, True)[0].adaptive


# --- the policy driven by hand: deterministic times, no model -------------------------------

from specdec._checks import DrivenPolicy as DraftPolicy   # the policy with its steps callable from Python


def _round(pol, t_verify, accept, t_call):
    """One round: cap, a draft of that length, choose, and the outcome. ``accept(k)`` is how
    many of k drafts are accepted; ``t_verify(k)`` and ``t_call(c)`` the times."""
    c = pol._py_cap()
    k = pol._py_choose(c, t_call(c)) if c else 0
    pol._py_observe(k, accept(k), t_verify(k), t_call(c) if c else 0.0)
    return c, k


def test_policy_probes_with_the_length_that_would_pay():
    """A call costs 1.5 plain decodes: one drafted token never pays, six perfect ones do.
    Early drafts miss at their second token, until no length pays; probes of one token would
    refresh only the first position and leave the policy plain for good, so the probe asks
    for the length that would pay if deeper tokens were as good as the first."""
    pol = DraftPolicy(6, True)
    tv = lambda k: 0.010 + 0.001 * k
    call = lambda c: 0.015 if c else 0.0
    for _ in range(12):                              # early: a miss at position 2
        _round(pol, tv, lambda k: min(k, 1), call)
    caps = [_round(pol, tv, lambda k: k, call)[0] for _ in range(200)]   # then perfect
    assert max(caps[:40]) >= 3, f"probes asked for {sorted(set(caps[:40]))}"
    assert sum(c > 0 for c in caps[-50:]) > 40, "drafting did not resume"


def test_policy_needs_a_margin_over_plain_to_draft():
    """Drafting that would beat plain by 1% is not worth its noise: the policy stays plain
    (probes aside); by 20% it drafts."""
    for gain, drafts in ((1.01, False), (1.20, True)):
        pol = DraftPolicy(1, True)
        t1 = 2 * 0.010 / gain            # two tokens per round at one draft, always accepted
        caps = [_round(pol, lambda k: 0.010 if k == 0 else t1, lambda k: k, lambda c: 0.0)[0]
                for _ in range(300)]
        assert (sum(caps[-100:]) > 80) == drafts, (gain, sum(caps[-100:]))


def test_policy_time_estimates_resist_an_outlier():
    """One preempted decode (10x) moves an established estimate by at most 2x its weight."""
    pol = DraftPolicy(2, False)
    for _ in range(5):
        pol._py_observe(0, 0, 0.010)
    pol._py_observe(0, 0, 0.100)
    assert pol.state()["t_verify"][0] < 0.0125


def test_policy_calibration_is_measured_over_predicted_rate():
    """Measured over predicted token rate of drafting rounds, shrunk towards 1 by the
    (decayed) rounds seen, and capped above at 1.1."""
    def expected(raw, k):
        n = (1 - 0.98 ** k) / (1 - 0.98)
        return 1 + (raw - 1) * n / (n + 16)

    pol = DraftPolicy(4, True)
    for _ in range(7):
        pol._py_observe_round(3.0, 0.030, 3, 0.060)      # half the predicted rate
    assert pol.state()["calibration"] == 1.0             # fewer than 8 rounds: no verdict
    pol._py_observe_round(3.0, 0.030, 3, 0.060)
    assert abs(pol.state()["calibration"] - expected(0.5, 8)) < 1e-9
    assert pol.state()["cal_time"] == 2.0 and pol.state()["cal_tokens"] == 1.0
    pol = DraftPolicy(4, True)
    for _ in range(400):
        pol._py_observe_round(3.0, 0.030, 3, 0.040)      # 0.75 of the prediction
    assert abs(pol.state()["calibration"] - expected(0.75, 400)) < 1e-9
    for _ in range(400):
        pol._py_observe_round(3.0, 0.030, 6, 0.030)      # twice the prediction: capped
    assert pol.state()["calibration"] == 1.1


def test_policy_times_follow_the_load_of_plain_rounds():
    """A draft length measured when plain rounds took 10 ms is scaled up once they take
    20 ms: on a shared machine, a cost measured long ago must not look cheap next to a
    plain round measured now."""
    pol = DraftPolicy(2, False)
    for _ in range(5):
        pol._py_observe(0, 0, 0.010)
    for _ in range(5):
        pol._py_observe(2, 2, 0.015)
    assert abs(pol.state()["t_verify"][2] - 0.015) < 1e-9
    for _ in range(60):
        pol._py_observe(0, 0, 0.020)
    tv = pol.state()["t_verify"]
    assert abs(tv[0] - 0.020) < 1e-4 and abs(tv[2] - 0.030) < 2e-4



def _rpc_like_text(pol, rounds, p_match, p_accept, seen, rng, owed=False):
    """``rounds`` rounds of a free n-gram-like drafter: it finds a match (a draft of the whole
    cap) in a ``p_match`` share of the rounds, each of its tokens right with ``p_accept``.
    A decode of R rows costs t(R) = 25 ms + 6 ms R (over llama.cpp's RPC backend: round trips
    make a large fixed part) plus 60 ms the first time R is decoded (the backend's one-off
    set-up of a new batch shape). ``owed``: the rounds are a new request's, owed a probe of
    its own as the controller gives it (``_round_budget.wanted``: while the policy's cap is 0,
    the whole ``n_max`` asked and verified; again after a probe all accepted). Returns the
    tokens per second of the rounds."""
    tokens = t = 0.0
    for _ in range(rounds):
        c = pol._py_cap()
        probe = owed and c == 0
        if probe:
            c = pol.n_max
        proposed = c if c and rng.random() < p_match else 0
        k = (proposed if probe else pol._py_choose(proposed, 0.0)) if c else 0
        a = 0
        while a < k and rng.random() < p_accept:
            a += 1
        tv = 0.025 + 0.006 * (k + 1) + (0.060 if k + 1 not in seen else 0.0)
        seen.add(k + 1)
        pol._py_observe(k, a, tv, 0.0)
        if k > 0:
            owed = probe and a == k
        tokens += a + 1
        t += tv
    return tokens / t


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("p_match,p_accept", [(0.4, 0.5), (0.3, 0.3), (0.5, 0.6)])
def test_policy_drafts_again_when_the_text_turns_to_one_the_drafter_knows(p_match, p_accept, seed):
    """A policy kept across requests (a Decoder's) learnt on code that its n-gram drafter does
    not pay (few matches, half of them wrong); the next request repeats a passage, where 8
    drafts a round, all accepted, pay 2.6x plain. Probes must find that within the request:
    a request of a drafter that was right before begins with a probe of its own, a probe that
    found no match is no probe, one whose every draft was accepted is followed by another, and
    the first decode of each length (a one-off set-up) is no cost sample."""
    import random
    rng, seen = random.Random(seed), set()
    pol = DraftPolicy(8, True)
    _rpc_like_text(pol, 256, p_match, p_accept, seen, rng)
    assert pol.probes_new_requests()
    rate = _rpc_like_text(pol, 128, 1.0, 1.0, seen, rng, owed=True)
    best = 9 / (0.025 + 0.006 * 9)
    assert rate > 0.85 * best, (rate, best, pol.state())


def test_policy_does_not_probe_each_request_for_a_drafter_never_right():
    """A free drafter none of whose drafts were accepted gets no probe of its own for each
    new request, and keeps the probe gap it grew over earlier requests: probing it afresh each
    request (at 16, 32, 64, 128 rounds) would cost five failed verifies a request of 256
    tokens (5% of plain decoding on mamba2, whose rollback decodes again). A drafter that was
    right keeps its fresh start (the test above)."""
    import random
    rng, seen = random.Random(0), set()
    pol = DraftPolicy(4, True)
    _rpc_like_text(pol, 512, 1.0, 0.0, seen, rng)
    probes = []
    for _ in range(3):
        assert not pol.probes_new_requests()
        drafted = 0
        for _ in range(256):
            c = pol._py_cap()
            k = pol._py_choose(c, 0.0) if c else 0
            drafted += k > 0
            pol._py_observe(k, 0, 0.025 + 0.006 * (k + 1), 0.0)
        probes.append(drafted)
    assert max(probes) <= 2, probes


def test_policy_first_decode_of_a_length_is_no_cost_sample():
    """The first decode of a row count pays a one-off set-up (graph allocation; an RPC
    backend's round trip per new tensor shape, ~60 ms at 2 ms latency): taken for its cost it
    would make that length look 2-3x dearer than it is, for dozens of rounds."""
    pol = DraftPolicy(4, False)
    pol._py_observe(0, 0, 0.090)
    assert pol.state()["t_verify"][0] == 0.0
    for _ in range(3):
        pol._py_observe(0, 0, 0.030)
    pol._py_observe(3, 3, 0.130)
    pol._py_observe(3, 3, 0.050)
    tv = pol.state()["t_verify"]
    assert abs(tv[0] - 0.030) < 1e-12 and abs(tv[3] - 0.050) < 1e-12, tv


def _iid_text(pol, rounds, p_accept, seed):
    """``rounds`` rounds of a free drafter that always proposes its whole cap, each token
    right with ``p_accept``; a verify of R rows costs 7 ms + 1.5 ms R (gemma3-270m-like: 9
    rows ~2.4x a single decode, 49 rows ~9.5x). Returns (tokens per second, lengths verified)."""
    import random
    rng = random.Random(seed)
    tokens = t = 0.0
    ks = []
    for _ in range(rounds):
        c = pol._py_cap()
        k = pol._py_choose(c, 0.0) if c else 0
        a = 0
        while a < k and rng.random() < p_accept:
            a += 1
        tv = 0.007 + 0.0015 * (k + 1)
        pol._py_observe(k, a, tv, 0.0)
        tokens += a + 1
        t += tv
        ks.append(k)
    return tokens / t, ks


@pytest.mark.parametrize("seed", range(3))
def test_policy_drafts_long_verbatim_repeats_past_16(seed):
    """Every draft accepted (a long verbatim repeat): with n_max 64 the policy verifies drafts
    of 40+ tokens (priced by the cost line, not by +30% a row from the last measured length),
    and beats the best it could do with n_max 16."""
    rate64, ks = _iid_text(DraftPolicy(64, True), 400, 1.0, seed)
    rate16, _ = _iid_text(DraftPolicy(16, True), 400, 1.0, seed)
    assert sum(ks[-100:]) / 100 > 40, ks[-30:]
    assert rate64 > 1.1 * rate16, (rate64, rate16)


@pytest.mark.parametrize("p_accept", [0.95, 0.8, 0.5])
def test_policy_with_a_long_cap_loses_nothing_where_drafts_are_short(p_accept):
    """Where drafts are accepted token by token with 50-95% (runs of a few tokens), n_max 64
    must cost nothing against n_max 16: exploration measures the long lengths as one (the
    cost line), not each of 64 lengths 8 times, each time cutting a good draft short."""
    r64 = sum(_iid_text(DraftPolicy(64, True), 500, p_accept, s)[0] for s in range(3))
    r16 = sum(_iid_text(DraftPolicy(16, True), 500, p_accept, s)[0] for s in range(3))
    assert r64 > 0.96 * r16, (r64, r16)


def _mtp_like_text(pol, rounds, p_accept, spikes, seed):
    """A costly drafter (an MTP head: 0.3 of a plain decode per drafted token) right with
    ``p_accept`` per token, verify of k drafts 10 ms (1 + 0.12 k), every time scaled by
    lognormal noise and, in a ``spikes`` share of the rounds, by 5 (a shared machine's
    preempted rounds). Returns the share of rounds that verified a draft."""
    import random
    rng = random.Random(seed)
    noise = lambda: rng.lognormvariate(0, 0.1) * (5.0 if rng.random() < spikes else 1.0)
    drafted = 0
    for _ in range(rounds):
        c = pol._py_cap()
        td = c * 0.003 * noise() if c else 0.0
        k = pol._py_choose(c, td) if c else 0
        a = 0
        while a < k and rng.random() < p_accept:
            a += 1
        pol._py_observe(k, a, 0.010 * (1 + 0.12 * k) * noise(), td)
        drafted += k > 0
    return drafted / rounds


@pytest.mark.parametrize("spikes", [0.0, 0.05])
def test_policy_keeps_a_paying_costly_drafter_on(spikes):
    """An MTP head right 70% of the time pays 1.2x plain at one or two drafts (the Q8_0 mid
    bench case, where adaptive switched drafting off while fixed n_max 2 gave 1.21x): the
    policy keeps drafting, on a quiet machine and with one round in 20 preempted. It switched
    off for good after a few early misses or one preempted early sample (a length that looks
    as if it does not pay is not measured again; probes backed off to 256 rounds)."""
    shares = [_mtp_like_text(DraftPolicy(4, True), 600, 0.7, spikes, s) for s in range(6)]
    assert min(shares) > 0.6 and sum(shares) / 6 > 0.85, shares
