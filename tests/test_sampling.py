"""The sampling distribution against a numpy reference of llama.cpp's chain."""
import numpy as np
import pytest

from sampler_chain import reference_distribution
from specdec._sampling import Distribution, Rng


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 40, 1.0, 0.0), (1.3, 0, 0.9, 0.0), (0.8, 0, 1.0, 0.1),
    (1.0, 20, 0.8, 0.05)])
def test_distribution_matches_reference(temperature, top_k, top_p, min_p):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(500) * 3).astype(np.float32)
    d = Distribution().set_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                  min_p=min_p).as_dict()
    _assert_same(d, reference_distribution(logits, temperature, top_k, top_p, min_p))


def _assert_same(d, ref):
    assert set(d) == set(ref)
    for k in ref:
        assert d[k] == pytest.approx(ref[k], rel=1e-4, abs=1e-7)


def _vocab_row(seed, n=262144):
    """A row shaped like a language model's: a long tail and a few tokens near the top
    (Gumbel-distributed logits, scaled), as wide as Gemma's vocabulary."""
    rng = np.random.default_rng(seed)
    return (rng.gumbel(size=n) * (1.0 + seed % 4)).astype(np.float32)


SETTINGS = [
    dict(temperature=0.8, top_p=0.95), dict(temperature=1.0, top_p=0.5),
    dict(temperature=1.0, top_p=0.999), dict(temperature=0.7, top_k=40),
    dict(temperature=1.3, top_k=5000), dict(temperature=0.8, min_p=0.05),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=1.0, top_k=3000, top_p=0.9, min_p=0.001),
    dict(temperature=2.0, top_p=0.9, min_p=0.01)]


@pytest.mark.parametrize("settings", SETTINGS)
def test_distribution_matches_reference_on_a_wide_row(settings):
    """The candidate set is cut by partial selections, never a sort of the row: on rows
    as wide as Gemma's (262k) with a model-like tail, every setting and combination keeps
    the reference's tokens with its probabilities; one Distribution reused across rows of
    different shapes (top-p guesses its cut from the last row's)."""
    d = Distribution()
    for seed in range(4):
        row = _vocab_row(seed)
        _assert_same(d.set_logits(row, **settings).as_dict(),
                     reference_distribution(row, **settings))


@pytest.mark.parametrize("settings", [dict(top_k=5), dict(top_k=700), dict(top_p=0.3),
                                      dict(top_p=0.3, min_p=0.2), dict(top_k=9, top_p=0.5)])
def test_ties_at_the_cut_keep_the_lower_ids(settings):
    """Equal logits at a cut are ordered as a stable sort orders them: lower id first
    (top-k's k-th place, and the token where top-p's mass is reached)."""
    rng = np.random.default_rng(5)
    row = np.full(3000, -5.0, np.float32)
    row[rng.choice(3000, 40, replace=False)] = 2.0       # 40 tied at the top
    row[rng.choice(3000, 200, replace=False)] = 1.0      # then 200 tied
    row[17] = 3.0
    d = Distribution().set_logits(row, temperature=0.9, **settings).as_dict()
    _assert_same(d, reference_distribution(row, temperature=0.9, **settings))
    ref_order = np.argsort(-row, kind="stable")
    assert set(d) == set(ref_order[:len(d)].tolist())


def test_non_finite_logits():
    """-inf (a grammar's mask) never enters a candidate set, NaN never wins, and a row
    with nothing finite gives its argmax (the first maximum)."""
    row = np.full(4096, -np.inf, np.float32)
    row[[5, 900, 4000]] = [1.0, 2.0, 0.5]
    row[77] = np.nan
    for settings in SETTINGS:
        d = Distribution().set_logits(row, **settings).as_dict()
        assert set(d) <= {5, 900, 4000} and 900 in d
        _assert_same(d, reference_distribution(row, **settings))
    assert Distribution().set_logits(np.full(64, -np.inf, np.float32), top_k=3).as_dict() == {0: 1.0}


@pytest.mark.parametrize("bad", [{"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}, {"min_p": -0.1},
                                 {"temperature": -1.0}, {"temperature": float("nan")}])
def test_distribution_settings_follow_sampling_rules(bad):
    """set_logits checks its settings by specdec.Sampling's rules (one rule, one place)."""
    with pytest.raises(ValueError, match=next(iter(bad))):
        Distribution().set_logits(np.zeros(8, np.float32), **bad)


def test_rng_uniform_and_reproducible():
    a = [Rng(5).random() for _ in range(3)]
    r1, r2 = Rng(5), Rng(5)
    xs = [r1.random() for _ in range(20000)]
    assert xs[:5] == [r2.random() for _ in range(5)]
    assert 0 <= min(xs) and max(xs) < 1
    assert abs(np.mean(xs) - 0.5) < 0.01
    assert a[0] == a[1]


def test_argmax_first_maximum():
    from specdec._sampling import argmax_py
    rng = np.random.default_rng(1)
    for n in (1, 7, 8, 9, 100, 262144):
        x = rng.standard_normal(n).astype(np.float32)
        assert argmax_py(x) == int(np.argmax(x))
    x = np.zeros(50, np.float32)
    x[[13, 40]] = 5.0
    assert argmax_py(x) == 13          # ties: the first, like llama.cpp's greedy sampler
    x[3] = np.nan
    assert argmax_py(x) == 13          # NaN never wins
    assert argmax_py(np.full(20, -np.inf, np.float32)) == 0


def _chi2_ok(draws, expected):
    """Chi-square fit of integer draws to ``expected`` (id -> probability); bins of small
    expected counts pooled."""
    from scipy import stats
    n = len(draws)
    counts = {}
    for d in draws:
        counts[d] = counts.get(d, 0) + 1
    assert set(counts) <= set(expected), "a draw outside the support"
    obs, exp_, pool_o, pool_e = [], [], 0, 0.0
    for k, p in expected.items():
        if p * n < 5:
            pool_o, pool_e = pool_o + counts.get(k, 0), pool_e + p * n
        else:
            obs.append(counts.get(k, 0))
            exp_.append(p * n)
    if pool_e > 0:
        obs.append(pool_o)
        exp_.append(pool_e)
    return stats.chisquare(obs, np.array(exp_) * (sum(obs) / sum(exp_))).pvalue > 1e-3


@pytest.mark.parametrize("settings", [{"temperature": 0.9}, {"temperature": 1.2, "top_p": 0.9},
                                      {"temperature": 0.8, "top_k": 6},
                                      {"temperature": 0.7, "min_p": 0.01},
                                      {"temperature": 1.1, "top_k": 7, "top_p": 0.95, "min_p": 0.02}])
def test_draws_and_residuals_follow_the_distribution(settings):
    """Draws fit p (the numpy reference's), and draws after a rejection fit
    norm(max(0, p - q)), on a wide row (several of the dense form's blocks; temperature
    alone is dense, the rest sparse)."""
    rng = np.random.default_rng(3)
    logits = np.full(5000, -30.0, np.float32)
    hot = [7, 1500, 1501, 2048, 3333, 4999, 4000, 12]
    logits[hot] = rng.standard_normal(len(hot)).astype(np.float32) * 1.5
    d = Distribution().set_logits(logits, **settings)
    p = reference_distribution(logits, **settings)
    assert len(p) >= 2
    r = Rng(11)
    assert _chi2_ok([d.draw(r) for _ in range(20000)], p)
    q = {hot[0]: 0.5, hot[1]: 0.3, 99: 0.2}
    res = {k: max(0.0, v - q.get(k, 0.0)) for k, v in p.items()}
    z = sum(res.values())
    res = {k: v / z for k, v in res.items() if v > 0}
    assert _chi2_ok([d.draw(r, q) for _ in range(20000)], res)


def test_draw_before_logits_is_an_error():
    with pytest.raises(ValueError, match="set_logits"):
        Distribution().draw(Rng(0))
