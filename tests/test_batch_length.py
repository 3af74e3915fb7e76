"""The measured draft length of a batch drafted by a model (``specdec._batch_length``).

The rounds' rates are synthetic (a rate per cap, with seeded noise on each round's time):
what is checked is the climb (which cap it settles on, what its choices cost against the
best cap's rate) and the schedules, never a timing. One Engine test checks that an MTP
Engine's adaptive rounds of several sequences take the batch's length, and that the output
is plain greedy decoding's.
"""
import random

import pytest
from bigram_greedy import greedy_cycle

from specdec import Engine
from specdec._batch_length import BatchLength
from specdec._propose import sat_out_share

N = 4


def _run(bl, rates, rounds, n=N, noise=0.2, seed=0, slow=(), capture=(), prompts=None,
         spread=True, sat=0.0, lockstep=None):
    """``rounds`` rounds of ``n`` sequences, each at the cap ``bl`` decides, yielding at
    ``rates[k]`` tokens/s (time times 1 + noise * U(0, 1); rounds in ``slow`` 5x slower;
    ``capture``: the factors on the time of the first rounds after the cap changed, as a
    CUDA graph's uncaptured run and capture; ``prompts``: ``(every, cost)``, new requests
    every ``every`` rounds whose drafter catches up on their prompts at their first drafting
    round, for ``cost`` plain rounds' time, given apart (``spread``) or in the round's time as
    before; ``sat``: a drafting round after plain ones catches up on their rows for this
    share of their time, given apart; ``lockstep``: ``(alpha, expected)``, the sequences
    accept together, each draft position with probability ``alpha`` once the ones before it
    were, one draw per round, and the round is observed with its tokens as drawn or, if
    ``expected``, as expected). Returns the caps and the tokens and seconds of every round."""
    rnd = random.Random(seed)
    caps, toks, secs = [], [], []
    since = 0
    caught = True
    plain_since = 0
    for r in range(rounds):
        k = bl.decide_round(n, len(rates) - 1)
        since = since + 1 if caps and caps[-1] == k else 0
        tok = n * (1.0 + 0.7 * k)
        if lockstep is not None:
            alpha, expected = lockstep
            tok = n * (1.0 + sum(alpha ** i for i in range(1, k + 1)))
        t = tok / rates[k] * (1.0 + noise * rnd.random()) * (5.0 if r in slow else 1.0)
        if lockstep is not None and not expected:
            a = 0
            while a < k and rnd.random() < alpha:
                a += 1
            tok = n * (1.0 + a)
        if since < len(capture):
            t *= capture[since]
        prompt = 0.0
        if prompts is not None:
            caught = caught and r % prompts[0] != 0
            plain_since = plain_since if r % prompts[0] else 0     # a new request's rows
            if k > 0 and not caught:
                prompt, caught = prompts[1] * n / rates[0], True
        t_sat = 0.0
        if k > 0:
            t_sat, plain_since = sat * plain_since * n / rates[0], 0
        else:
            plain_since += 1
        if spread:
            bl.observe_round(n, k, tok, t, prompt, t_sat)
        else:
            bl.observe_round(n, k, tok, t + prompt, 0.0, t_sat)
        caps.append(k)
        toks.append(tok)
        secs.append(t + prompt + t_sat)
    return caps, toks, secs


def _share_of_best(rates, toks, secs, start):
    """The token rate of rounds ``start..`` against the best cap's (noise's mean removed)."""
    return sum(toks[start:]) / sum(secs[start:]) * 1.1 / max(rates)


# the rate over the cap, as measured for an MTP head at 4 slots on a 2-core CPU (90%: best
# fixed length 3; 70%: about plain; 50%: every draft loses; "cpu90dip": 90% as measured on
# 2026-11-27, cap 1 no better than plain: one verify row more costs the most) and on a GPU
# (rows nearly free)
PEAKS = {"cpu90": [1.0, 1.05, 1.10, 1.19, 1.07], "cpu70": [1.0, 0.99, 0.94, 0.90, 0.85],
         "cpu50": [1.0, 0.90, 0.80, 0.75, 0.65], "gpu": [1.0, 1.30, 1.50, 1.65, 1.75],
         "cpu90dip": [1.0, 0.98, 1.08, 1.15, 1.05]}


@pytest.mark.parametrize("name", sorted(PEAKS))
@pytest.mark.parametrize("seed", range(3))
def test_the_climb_settles_on_the_best_cap_and_costs_little(name, seed):
    rates = PEAKS[name]
    bl = BatchLength(8)
    caps, toks, secs = _run(bl, rates, 800, seed=seed)
    # the best cap, or one within the margin of its rate (70%: plain and cap 1 are 1% apart)
    assert rates[bl.state(N)["best"]] >= 0.97 * max(rates), (bl.state(N), caps[-40:])
    # past the first rounds, the batch runs within 3% of its best cap's rate
    assert _share_of_best(rates, toks, secs, 100) >= 0.97
    # never below plain decoding, even with the learning counted
    assert _share_of_best(rates, toks, secs, 0) * max(rates) >= 0.97 * rates[0]


@pytest.mark.parametrize("seed", range(5))
def test_a_new_batch_size_finds_its_best_cap_within_a_short_request(seed):
    """A 48-token request at 4 slots is 15-50 rounds: the climb starts at cap 2, past the dip
    at cap 1 (from cap 1 it saw plain decoding win and stayed there for tens of rounds)."""
    rates = PEAKS["cpu90dip"]
    bl = BatchLength(8)
    caps, toks, secs = _run(bl, rates, 60, seed=seed)
    assert sum(k == 3 for k in caps[10:30]) >= 14, caps
    assert _share_of_best(rates, toks, secs, 0) >= 0.95


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", ["cpu90", "cpu90dip", "cpu50"])
def test_a_prompt_catch_up_is_spread_over_the_rounds_not_charged_to_one(name, seed):
    """New requests every 20 rounds; a drafter's first drafting round of each catches up on
    the prompts for 2.5 plain rounds' time. Spread, the climb settles on the best cap; charged
    to its round, that round's cap lost."""
    rates = PEAKS[name]
    bl = BatchLength(8)
    caps, toks, secs = _run(bl, rates, 400, seed=seed, prompts=(20, 2.5))
    # the best cap counted with the catch-up spread over the 20 rounds (2.5 / 20 per round)
    eff = [rates[0]] + [r / (1 + 0.125 * r / (1 + 0.7 * k)) for k, r in enumerate(rates) if k]
    best = max(range(len(eff)), key=eff.__getitem__)
    assert bl.state(N)["best"] == best, (bl.state(N), caps[-40:])
    assert bl.state(N)["prompt_per_round"] > 0


def test_a_prompt_catch_up_still_counts_against_drafting():
    """Drafting that wins by less than its prompt catch-up per round loses to plain decoding."""
    rates = [1.0, 1.02, 1.04, 1.03]
    bl = BatchLength(8)
    caps, _, _ = _run(bl, rates, 400, noise=0.0, prompts=(10, 3.0))
    assert bl.state(N)["best"] == 0, caps[-40:]


#: a changed cap's first two rounds on an H200 (1.4B bigram, 8 slots): uncaptured, then captured
CAPTURE = (2.0, 1.5)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", ["gpu", "cpu90", "cpu50"])
def test_where_a_new_shape_is_dear_a_changed_cap_is_held_and_measured_warm(name, seed):
    """On a CUDA target a cap tried for one round pays its graph's capture, and lost to the
    cap held (the GPU Engine stayed at plain decoding). ``steady`` holds a changed cap for
    three rounds and measures only the last: the climb settles on the best cap."""
    rates = PEAKS[name]
    bl = BatchLength(8, steady=True)
    caps, toks, secs = _run(bl, rates, 800, seed=seed, capture=CAPTURE)
    assert rates[bl.state(N)["best"]] >= 0.97 * max(rates), (bl.state(N), caps[-40:])
    # a changed cap is held for three rounds
    runs, run = [], 1
    for a, b in zip(caps, caps[1:]):
        if a == b:
            run += 1
        else:
            runs.append(run)
            run = 1
    assert min(runs) >= 3, runs
    # past the climb, within 8% of the best cap's steady rate, captures included
    assert _share_of_best(rates, toks, secs, 200) >= 0.92


def test_without_steady_captures_hold_the_climb_back():
    """The reason for ``steady``: measured cold, the caps tried for a round lose to the one
    held, and each try pays two captures: the batch runs far below its best cap's rate."""
    for name in ("gpu", "cpu90"):
        rates = PEAKS[name]
        bl = BatchLength(8)
        _, toks, secs = _run(bl, rates, 800, seed=0, capture=CAPTURE)
        assert _share_of_best(rates, toks, secs, 200) < 0.8, (name, bl.state(N))


#: the rate over the cap at 8 slots on an H200 (1.4B bigram, MTP 70%): fixed caps 3 and 4
#: ran 1.3-1.4x plain
GPU70 = [1.0, 1.15, 1.28, 1.34, 1.40]


def test_sequences_that_accept_together_are_measured_by_their_expected_tokens():
    """Sequences at the same text accept or reject together: a round's tokens are one draw
    for all of them (on an H200, 8 to 32 tokens at cap 3), and a held cap is measured on one
    round. Measured by their draws, the climb settled below the best cap in most runs
    (there the adaptive Engine ran 1.05x plain where a fixed length ran 1.39x); by their
    expected tokens (the controller's ``settle``), it settles on it."""
    def settled(expected):
        best = []
        for seed in range(8):
            bl = BatchLength(8, steady=True)
            _run(bl, GPU70, 600, n=8, seed=seed, capture=CAPTURE, lockstep=(0.7, expected))
            best.append(bl.state(8)["best"])
        return best
    by_draws, by_expectation = settled(False), settled(True)
    assert all(GPU70[b] >= 0.95 * max(GPU70) for b in by_expectation), by_expectation
    assert sum(GPU70[b] < 0.95 * max(GPU70) for b in by_draws) >= 3, by_draws


def test_plain_best_tries_cap_one_ever_less_often():
    bl = BatchLength(4)
    caps, _, _ = _run(bl, PEAKS["cpu50"], 1000, noise=0.0)
    at = [r for r, k in enumerate(caps) if k > 0 and r > 50]
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert gaps and gaps[-1] == 128, gaps
    assert all(b >= a for a, b in zip(gaps, gaps[1:])), gaps
    assert bl.state(N)["up_gap"] == 128


def test_plain_best_spaces_its_tries_by_what_they_cost():
    """While plain decoding is best, a try of drafting catches the drafter up on the rows it
    sat out and on a new request's prompt (an MTP head at 4 slots on a 2-core CPU: ~300 rows,
    5% of a 48-token pass, every try). Tries doubling up to every 128 rounds cost the floor
    3-7%; spaced by their measured cost, they take about ``TRY_BUDGET`` (2%) of the time."""
    rates = PEAKS["cpu50"]
    bl = BatchLength(4)
    caps, toks, secs = _run(bl, rates, 1200, noise=0.0, prompts=(47, 5.0), sat=0.11)
    tries = [r for r in range(1, len(caps)) if caps[r] > 0 and caps[r - 1] == 0]
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert bl.state(N)["best"] == 0
    assert bl.state(N)["try_cost"] > 0 and bl.state(N)["try_gap"] > 128
    assert len(gaps) >= 3 and min(gaps[2:]) > 128, tries
    assert sum(toks[300:]) / sum(secs[300:]) >= 0.965 * rates[0]
    # tries that cost little (no catch-up) keep the doubling schedule
    bl = BatchLength(4)
    _run(bl, rates, 400, noise=0.0)
    assert bl.state(N)["try_gap"] < 128 and bl.state(N)["up_gap"] == 128


def test_drafting_best_keeps_plain_measured_and_drops_to_it_when_it_wins():
    """While cap 3 is best, a plain round in 32; when drafting stops paying (the text
    changed), the batch is back at plain decoding within a few plain rounds."""
    bl = BatchLength(4)
    caps, _, _ = _run(bl, PEAKS["cpu90"], 400, noise=0.0)
    assert bl.state(N)["best"] == 3
    plain = [r for r, k in enumerate(caps) if k == 0 and r > 100]
    assert 8 <= len(plain) <= 14, plain
    caps, _, _ = _run(bl, [1.0, 0.6, 0.5, 0.45, 0.4], 200, noise=0.0)
    assert bl.state(N)["best"] == 0, caps


def test_a_preempted_round_does_not_switch_the_best():
    bl = BatchLength(4)
    _run(bl, PEAKS["cpu90"], 300, noise=0.0)
    assert bl.state(N)["best"] == 3
    switches = bl.state(N)["switches"]
    _run(bl, PEAKS["cpu90"], 40, noise=0.0, slow={5, 17})
    assert bl.state(N)["best"] == 3
    assert bl.state(N)["switches"] == switches


def test_each_size_is_measured_on_its_own_and_starts_from_its_neighbour():
    bl = BatchLength(8)
    _run(bl, PEAKS["cpu90"], 300, n=4, noise=0.0)
    assert bl.state(4)["best"] == 3
    assert bl.state(8)["best"] == -1              # nothing measured at 8 yet
    assert bl.decide_round(8, 4) == 3             # ... so it starts from 4's best
    _run(bl, PEAKS["cpu50"], 300, n=8, noise=0.0)
    assert bl.state(8)["best"] == 0
    assert bl.state(4)["best"] == 3               # 4 keeps its own


def test_out_of_range_sizes_and_caps():
    bl = BatchLength(4)
    assert bl.decide_round(1, 4) == 4             # one sequence: its own policy decides
    assert bl.decide_round(5, 4) == 4
    assert bl.decide_round(3, 0) == 0
    bl.observe_round(9, 1, 4.0, 0.1)              # ignored
    with pytest.raises(ValueError):
        bl.state(5)


def test_a_rounds_catch_up_leaves_out_the_rows_sat_out_not_the_prompt():
    """Of a drafter call's catch-up, the batch's length leaves out the rows its sequences sat
    out (plain rounds, a cost of the caps before) and keeps their prompts' (a cost of drafting
    that plain decoding never pays), by rows. Each sequence: (n_past, n_asked_at, n_prompt)."""
    t = 0.12
    # a request's first ask right after its prompt: all of the catch-up is the prompt's
    assert sat_out_share(t, [(100, -1, 100)]) == 0.0
    # its first ask after 20 plain rounds: 20 rows of 120 sat out
    assert sat_out_share(t, [(120, -1, 100)]) == pytest.approx(t * 20 / 120)
    # a later ask: every row since the last ask was sat out, the prompt was caught up before
    assert sat_out_share(t, [(160, 130, 100)]) == pytest.approx(t)
    # one call for two sequences: a new one's prompt and an old one's 30 rows sat out
    assert sat_out_share(t, [(100, -1, 100), (160, 130, 90)]) == pytest.approx(t * 30 / 130)
    # no rows behind (a catch-up of its own): nothing to weigh it by, all left out
    assert sat_out_share(t, [(50, 50, 40)]) == pytest.approx(t)
    assert sat_out_share(0.0, [(120, -1, 100)]) == 0.0


def test_an_mtp_engine_batch_takes_the_measured_length(bigram_tiny_path):
    """Adaptive MTP requests sharing rounds: the batch's length decides their caps, every
    draft is verified, and each request's tokens are plain greedy decoding's."""
    prompts = [[first] + greedy_cycle(bigram_tiny_path, [first], 7) for first in (3, 12, 21, 30)]
    with Engine(bigram_tiny_path, drafters=["mtp"], n_slots=4, n_ctx=512, n_max=4,
                adaptive=True) as eng:
        drafted = 0
        for _ in range(2):
            res = [h.result(120) for h in [eng.submit(p, max_tokens=40) for p in prompts]]
            for p, r in zip(prompts, res):
                assert r.tokens == greedy_cycle(bigram_tiny_path, p, 40)
            # (the batch starts at cap 2; where plain decoding wins on this tiny model, its
            # tries are spaced by their cost and the second pass may draft nothing)
            drafted += sum(r.stats.drafted for r in res)
        length = eng._core.ctl.length
        assert length.n_rounds > 0
        assert sum(length.state(n)["rounds"] for n in range(2, 5)) == length.n_rounds
        assert eng._core.ctl.floor.state(4)["rounds"] == 0      # the floor judged none of them
        assert drafted > 0
