"""The adaptive policy shared by the sequences of a round, and what its probes may cost.

An Engine's requests of one configuration share one policy; the controller asks it once per
sequence per round. Its schedules (a plain round in 64, a probe of a drafter that does not
pay after 16, 32, ... rounds) are in rounds, so the round must count once however many
sequences ask: counted per sequence, they ran 4-8x faster than designed at 4-8 slots, and
the probes that turned drafting back on were the adaptive Engine's loss below plain.

A drafter with a context of its own catches up, at its first draft after a pause, on every
row it sat out; a probe pays that catch-up, which the policy's model of a round leaves out.
The probe gap is held where the measured catch-up costs at most 1% of the time.

Every test drives the policy by hand (``_checks.DrivenPolicy``) with set costs and
acceptance: the counts and choices are deterministic, nothing is timed.
"""
from specdec._checks import DrivenPolicy as DraftPolicy

TV0 = 0.010


def _tv(k):
    return TV0 * (1 + 0.3 * k)


def _rounds(pol, n_rounds, n_seqs, accept, t_call, t_caught=lambda idle: 0.0, first_id=0):
    """``n_rounds`` rounds of ``n_seqs`` sequences sharing ``pol``: each round asks every
    sequence's cap (one round id), then drafts, chooses and observes each. ``accept(k)``: the
    drafts of k accepted; ``t_call(c)``: a drafter call asked for c; ``t_caught(idle)``: the
    catch-up of a draft after ``idle`` rounds without one. Returns each round's caps."""
    caps, idle = [], 0
    for r in range(n_rounds):
        cs = [pol._py_cap(first_id + r) for _ in range(n_seqs)]
        caps.append(cs)
        for c in cs:
            k = pol._py_choose(c, t_call(c)) if c else 0
            pol._py_observe(k, accept(k), _tv(k), t_call(c) if c else 0.0,
                            t_caught(idle) if c else 0.0)
        idle = 0 if cs[0] else idle + 1
    return caps


def _probes(caps, after):
    """Rounds past ``after`` that asked for a draft."""
    return sum(1 for cs in caps[after:] if cs[0] > 0)


def test_a_round_shared_by_sequences_counts_once_and_decides_once():
    pol = DraftPolicy(4, True)
    caps = _rounds(pol, 200, 4, lambda k: k, lambda c: 0.001 * c)
    assert pol.state()["rounds"] == 200
    assert all(len(set(cs)) == 1 for cs in caps), "sequences of one round got different caps"
    # a drafter that pays: drafting but for the plain rounds, one in 64 once measured
    plain = [r for r, cs in enumerate(caps) if cs[0] == 0]
    assert len([r for r in plain if r >= 64]) <= 3, plain


def test_probes_of_a_shared_policy_follow_the_rounds_not_the_sequences():
    """A costly drafter that never pays: with 8 sequences sharing the policy, its probes come
    no more often, in rounds, than with one sequence alone."""
    never = lambda k: 0
    call = lambda c: 0.6 * TV0 * c
    alone = _probes(_rounds(DraftPolicy(4, True), 1000, 1, never, call), 100)
    shared = _probes(_rounds(DraftPolicy(4, True), 1000, 8, never, call), 100)
    assert shared <= alone + 1, (shared, alone)
    assert alone <= 6, alone        # gaps of 16, 32, ... 256 rounds


def test_the_same_round_id_again_repeats_the_decision_without_counting():
    pol = DraftPolicy(4, True)
    first = pol._py_cap(7)
    assert [pol._py_cap(7) for _ in range(5)] == [first] * 5
    assert pol.state()["rounds"] == 1
    pol._py_cap(8)
    pol._py_cap(-1)                 # -1: a round of its own, always counted
    pol._py_cap(-1)
    assert pol.state()["rounds"] == 4


def _costly_never_paying(t_caught_per_row, n_rounds=3000):
    pol = DraftPolicy(4, True)
    caps = _rounds(pol, n_rounds, 1, lambda k: 0, lambda c: 0.6 * TV0 * c,
                   lambda idle: t_caught_per_row * (idle + 1))
    return pol, caps


def test_probes_whose_catch_up_is_dear_are_spaced_to_cost_one_percent():
    """A row's catch-up at 5% of a plain round: a probe after G rounds costs 5% of them
    whatever G, so the gap grows past the 256 rounds the doubling stops at, probe after probe."""
    pol, caps = _costly_never_paying(0.05 * TV0)
    st = pol.state()
    assert st["probe_loss"] > 5.0, st
    assert st["probe_gap"] > 1000, st
    at = [r for r, cs in enumerate(caps) if cs[0] > 0]
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert gaps[-1] > 500 and gaps[-1] > gaps[-2] > 256, gaps


def test_probes_whose_catch_up_is_cheap_keep_their_schedule():
    """A row's catch-up at 0.1% of a plain round (or none): probes go on every 256 rounds."""
    for per_row in (0.0, 0.001 * TV0):
        pol, caps = _costly_never_paying(per_row)
        assert pol.state()["probe_gap"] == 256, pol.state()
        assert 4 <= _probes(caps, 1000) <= 10, _probes(caps, 1000)
