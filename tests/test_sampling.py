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
