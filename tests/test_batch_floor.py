"""The batch's floor (``specdec._batch_floor``): rounds in which the adaptive policies drafted
against rounds held plain, measured per batch size; drafting is turned off where it loses
and probed again, and a size where it wins keeps drafting but for the rounds that keep the
plain rate measured."""
import pytest

from specdec._batch_floor import BatchFloor


def _run(floor, n, rounds, plain_rate, draft_rate, tokens=8.0):
    """``rounds`` rounds at ``n`` sequences; returns whether each was allowed to draft."""
    allowed = []
    for _ in range(rounds):
        a = floor.allow_round(n)
        rate = draft_rate if a else plain_rate
        floor.observe_round(n, a, tokens, tokens / rate)
        allowed.append(a)
    return allowed


def test_drafting_that_pays_keeps_drafting_with_a_plain_round_in_sixteen():
    f = BatchFloor(8)
    allowed = _run(f, 8, 160, plain_rate=100.0, draft_rate=130.0)
    late = allowed[40:]
    assert len(late) // 16 <= late.count(False) <= len(late) // 16 + 1
    assert f.n_off == 0
    st = f.state(8)
    assert st["draft_rate"] == pytest.approx(130.0) and st["plain_rate"] == pytest.approx(100.0)


def test_drafting_that_loses_is_held_plain_and_probed_with_growing_pauses():
    f = BatchFloor(8)
    allowed = _run(f, 8, 400, plain_rate=100.0, draft_rate=90.0)
    assert f.n_off >= 3
    # after the first measurements, drafting rounds are only probes of 3 rounds
    runs, cur = [], 0
    for a in allowed[30:]:
        if a:
            cur += 1
        elif cur:
            runs.append(cur)
            cur = 0
    assert runs and max(runs) <= 3
    # the pauses between probes double: 16, 32, 64, ...
    gaps, cur = [], 0
    for a in allowed[30:]:
        if not a:
            cur += 1
        elif cur:
            gaps.append(cur)
            cur = 0
    assert gaps[-1] > gaps[0] >= 15
    assert allowed[30:].count(True) < 0.1 * len(allowed[30:])


def test_a_probe_that_wins_turns_drafting_back_on():
    f = BatchFloor(8)
    _run(f, 8, 60, plain_rate=100.0, draft_rate=80.0)
    assert f.n_off >= 1
    allowed = _run(f, 8, 120, plain_rate=100.0, draft_rate=140.0)
    assert allowed[-40:].count(True) >= 37


def test_each_batch_size_is_judged_on_its_own():
    f = BatchFloor(8)
    _run(f, 8, 80, plain_rate=100.0, draft_rate=80.0)      # loses at 8 sequences
    a4 = _run(f, 4, 80, plain_rate=60.0, draft_rate=90.0)   # pays at 4
    assert a4[-32:].count(True) >= 30
    assert f.state(8)["off_left"] > 0 or f.state(8)["probe_left"] > 0
    assert f.state(4)["off_left"] == 0


def test_one_sequence_and_sizes_out_of_range_are_left_to_the_policy():
    f = BatchFloor(4)
    assert all(_run(f, 1, 50, plain_rate=100.0, draft_rate=10.0))
    assert all(_run(f, 9, 50, plain_rate=100.0, draft_rate=10.0))
    with pytest.raises(ValueError):
        f.state(5)


def test_an_engine_round_of_adaptive_sequences_is_judged_by_the_floor(tiny_dense_path):
    """The round asks the floor once per round of several adaptive sequences, and measures it."""
    from specdec import Engine
    with Engine(tiny_dense_path, drafters=["ngram"], n_slots=4, n_ctx=2048, n_max=4,
                adaptive=True) as eng:
        prompts = [f"{i} one two three four five one two three four five one two" for i in range(4)]
        for h in [eng.submit(p, max_tokens=24) for p in prompts]:
            h.result(120)
        # the Engine's controller (its scheduler core's, where there is one)
        ctl = eng._core.ctl if hasattr(eng, "_core") else eng._ctl
        floor = ctl.floor
        judged = sum(floor.state(n)["rounds"] for n in range(2, 5))
        assert judged > 0
        assert any(floor.state(n)["plain_rate"] > 0 or floor.state(n)["draft_rate"] > 0
                   for n in range(2, 5))
