"""The draft budget of a round (``specdec._batch_budget``): the verify rows of the whole
batch go where each request's own acceptance says they pay, by the measured cost line of a
verify of R rows; none under load where none pays. Synthetic costs and acceptances."""
from __future__ import annotations

import itertools
import random

import pytest

from specdec._batch_budget import Acceptance, allocate_rows
from specdec._policy import BatchCost, DraftPolicy
from specdec._round_budget import row_floor_of


def _gains(alpha, k):
    """Worth of the rows at depth 1..k of a request whose every draft is right w.p. alpha."""
    return [alpha ** i for i in range(1, k + 1)]


def _rate(gains, costs, ks, tokens, time):
    return ((tokens + sum(sum(g[:k]) for g, k in zip(gains, ks)))
            / (time + sum(c * k for c, k in zip(costs, ks))))


def test_rows_nearly_free_draft_everything():
    """A GPU: a verify row costs 1% of a plain round of 8 sequences; drafts at 90% pay."""
    a, b, n = 0.010, 0.0001, 8
    ks = allocate_rows([_gains(0.9, 4)] * n, [b] * n, n, a + b * n)
    assert ks == [4] * n


def test_under_load_nothing_is_drafted():
    """A CPU at 8 slots: a row costs what a plain round's token does; drafts right half the
    time never pay, so the round is a plain one."""
    a, b, n = 0.004, 0.010, 8
    assert allocate_rows([_gains(0.5, 4)] * n, [b] * n, n, a + b * n) == [0] * n
    # a head right 99% of the time still pays a row or two
    ks = allocate_rows([_gains(0.99, 4)] * n, [b] * n, n, a + b * n)
    assert all(1 <= k <= 2 for k in ks)


def test_rows_go_to_the_requests_whose_own_drafts_pay():
    """A batch mixing repeat prompts (drafts nearly always right) with code (40%): the rows
    go to the first, none to the second; drafting on their average would give both."""
    a, b = 0.020, 0.003
    gains = [_gains(0.98, 6)] * 4 + [_gains(0.4, 6)] * 4
    ks = allocate_rows(gains, [b] * 8, 8, a + b * 8)
    assert all(k >= 4 for k in ks[:4])
    assert ks[4:] == [0] * 4
    avg = allocate_rows([_gains(0.69, 6)] * 8, [b] * 8, 8, a + b * 8)
    assert all(k > 0 for k in avg)


def test_draft_cost_counts_before_drafting():
    """Before drafting a row also costs its draft step: a dear drafter gets fewer rows."""
    a, b, n = 0.010, 0.001, 4
    cheap = allocate_rows([_gains(0.8, 6)] * n, [b] * n, n, a + b * n)
    dear = allocate_rows([_gains(0.8, 6)] * n, [b + 0.004] * n, n, a + b * n)
    assert sum(dear) < sum(cheap)


@pytest.mark.parametrize("seed", range(6))
def test_allocation_is_the_best_and_never_below_plain(seed):
    """Against every allocation of up to 3 drafts for 3 requests (margin 0): none has a better
    token rate, and the chosen one is never below the plain round's."""
    rnd = random.Random(seed)
    n, k = 3, 3
    gains = [sorted((rnd.random() for _ in range(k)), reverse=True) for _ in range(n)]
    costs = [rnd.uniform(0.001, 0.02) for _ in range(n)]
    tokens, time = float(n), rnd.uniform(0.005, 0.05)
    ks = allocate_rows(gains, costs, tokens, time, margin=0.0)
    best = max(_rate(gains, costs, c, tokens, time)
               for c in itertools.product(range(k + 1), repeat=n))
    assert _rate(gains, costs, ks, tokens, time) == pytest.approx(best, rel=1e-12)
    assert _rate(gains, costs, ks, tokens, time) >= tokens / time
    # with the margin, every row taken raised the rate by it
    ks = allocate_rows(gains, costs, tokens, time)
    assert _rate(gains, costs, ks, tokens, time) >= tokens / time


def test_each_request_keeps_its_own_acceptance():
    shared = DraftPolicy(4, adaptive=True)
    right, wrong = Acceptance(4), Acceptance(4)
    for _ in range(20):
        right.observe_round(4, 4)
        wrong.observe_round(4, 0)
    assert min(right.estimate()) > 0.9
    assert wrong.estimate()[0] < 0.2
    # a fresh request starts from the shared estimate (the prior), not from the others'
    assert Acceptance(4).estimate()[0] == pytest.approx(0.85)
    assert shared.state()["alpha"][0] == pytest.approx(0.85)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one row cost per sequence"):
        allocate_rows([[0.9]], [], 1.0, 0.01)


def test_a_rows_price_as_a_confidence_floor_is_the_budgets_break_even():
    """The floor a drafter that knows its draft's probability is told in a batch is the
    probability at which the budget would give one row: above it the row is given, below it
    not. None for a lone sequence or before a batch was measured; at most 0.9."""
    cost = BatchCost()
    assert row_floor_of(cost, 4) == 0.0
    a, b = 0.009, 0.004        # 4 sequences: a plain step of 25 ms, a row 4 ms (a 2-core CPU)
    for rows in (4, 8, 5, 12, 4, 6):
        cost.observe(rows, a + b * rows)
    assert row_floor_of(cost, 1) == 0.0
    for n in (2, 4, 8):
        p = row_floor_of(cost, n)
        assert 0.0 < p < 0.9
        for g, given in ((p * 1.01, [1]), (p * 0.99, [0])):
            assert allocate_rows([[g]] + [[]] * (n - 1), [b] * n, n, a + b * n)[:1] == given
    assert row_floor_of(cost, 2) < row_floor_of(cost, 4) < row_floor_of(cost, 8)
    dear = BatchCost()
    for rows in (4, 8, 5, 12, 4, 6):
        dear.observe(rows, 0.0001 + 0.01 * rows)    # a row costs a plain token's share
    assert row_floor_of(dear, 4) == 0.9
