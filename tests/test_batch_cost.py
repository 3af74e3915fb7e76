"""A verify batch's time shared among its sequences for their draft-length policies."""
import pytest

from specdec import Decoder
from specdec._checks import DrivenController
from specdec._policy import BatchCost


def _fed(line, rows_seen, times=20):
    bc = BatchCost()
    for _ in range(times):
        for r in rows_seen:
            bc.observe(r, line(r))
    return bc


def test_each_sequence_pays_the_fixed_part_equally_and_its_rows():
    a, b = 0.010, 0.002
    bc = _fed(lambda r: a + b * r, range(4, 37, 4))
    rows = [8, 4, 4, 4]
    t = a + b * sum(rows)
    shares = [bc.share(t, sum(rows), 4, r) for r in rows]
    assert sum(shares) == pytest.approx(t)
    assert shares[1] == pytest.approx(a / 4 + b * 4, rel=1e-3)
    assert shares[0] - shares[1] == pytest.approx(4 * b, rel=1e-3)
    # one sequence alone pays it all
    assert bc.share(t, 8, 1, 8) == t


def test_rows_that_never_vary_split_half_and_half():
    bc = _fed(lambda r: 0.04, [16])
    assert bc.share(0.04, 16, 4, 4) == pytest.approx(0.04 * (0.5 / 4 + 0.5 * 4 / 16))
    assert BatchCost().share(0.04, 16, 4, 4) == pytest.approx(0.04 * (0.5 / 4 + 0.5 * 4 / 16))


def _plain_round_cost(model_path, n_seqs):
    """The adaptive policy's verify time of a plain round, ``n_seqs`` sequences in a batch,
    and the mean time of the rounds' decode and verify as a whole (measured in the same run,
    so that a loaded machine slows both alike)."""
    from specdec.drafters import create
    # one head for both (the automatic choice may differ between the two contexts' shapes,
    # and a disturbed measurement is not kept: the comparison is of shares, not of heads)
    ctx = Decoder(model_path, n_ctx=2048, n_seq_max=n_seqs, lazy_logits=True).ctx
    d = create("ngram")
    d.bind(ctx, n_seqs)
    ctl = DrivenController(ctx, [d], n_max=4, adaptive=True)
    prompts = [[(7 * i + j) % 50 + 1 for j in range(12)] * 6 for i in range(n_seqs)]
    ctl.start(prompts, 120)
    ctl.run()
    # each sequence of a round is charged the whole round's time in its own counters
    st = ctl.stats(0)
    whole = (st["t_target_s"] + st["t_lm_head_s"] + st["t_verify_s"]) / st["rounds"]
    return ctl.policy_state["t_verify"][0], whole


def test_a_batched_policy_is_charged_a_share_not_the_batch(tiny_dense_path):
    # one of four sequences pays about a quarter of the round it shares (the fixed part split
    # four ways, its own rows), not the whole round. Both numbers come from one run: a share
    # against a sequence decoded alone in another run compared two timings a loaded machine
    # can reorder
    share, whole = _plain_round_cost(tiny_dense_path, 4)
    assert 0 < share < 0.65 * whole     # measured 0.04-0.47; charged the whole round: ~0.85
