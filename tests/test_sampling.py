"""The sampling distribution against a numpy reference of llama.cpp's chain."""
import numpy as np
import pytest

from specdec._sampling import Distribution, Rng


def _reference(logits, temperature, top_k, top_p, min_p):
    order = np.argsort(-logits, kind="stable")
    cand = order[:top_k] if top_k else order
    l = logits[cand].astype(np.float64)
    p = np.exp(l - l.max())
    p /= p.sum()
    keep = len(cand)
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
    if min_p > 0:
        ok = p[:keep] >= min_p * p[0]
        keep = int(np.argmin(ok)) if not ok.all() else keep
    cand, l = cand[:keep], l[:keep]
    q = np.exp((l - l.max()) / temperature)
    return dict(zip(cand.tolist(), (q / q.sum()).tolist()))


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 40, 1.0, 0.0), (1.3, 0, 0.9, 0.0), (0.8, 0, 1.0, 0.1),
    (1.0, 20, 0.8, 0.05)])
def test_distribution_matches_reference(temperature, top_k, top_p, min_p):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(500) * 3).astype(np.float32)
    d = Distribution().set_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                  min_p=min_p).as_dict()
    ref = _reference(logits, temperature, top_k, top_p, min_p)
    assert set(d) == set(ref)
    for k in ref:
        assert d[k] == pytest.approx(ref[k], rel=1e-4, abs=1e-7)


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
                                      {"temperature": 0.8, "top_k": 6}])
def test_draws_and_residuals_follow_the_distribution(settings):
    """Draws fit p, and draws after a rejection fit norm(max(0, p - q)), on a wide row
    (several of the dense form's blocks; temperature alone is dense, the rest sparse)."""
    rng = np.random.default_rng(3)
    logits = np.full(5000, -30.0, np.float32)
    hot = [7, 1500, 1501, 2048, 3333, 4999, 4000, 12]
    logits[hot] = rng.standard_normal(len(hot)).astype(np.float32) * 1.5
    d = Distribution().set_logits(logits, **settings)
    p = d.as_dict()
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
