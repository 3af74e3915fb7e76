"""Sampled verification: the speculative output distribution is the target's.

On the tiny synthetic model with top-k 4, the first three generated tokens have
at most 64 outcomes. Their exact probabilities come from the target's own
logits through a numpy reference of the sampler chain (``sampler_chain``);
thousands of fixed-seed speculative samples must fit them (chi-square), for a
drafter with its own distribution q and for a one-hot drafter. The same test must
fail when the acceptance rule is deliberately broken. top-k, top-p and min-p
together are checked the same way.
"""
import numpy as np
import pytest
from scipy import stats

from specdec import Batch, Context
from specdec._checks import CheckedController, DrivenController
from specdec._controller import new_policy
from sampler_chain import reference_distribution
from specdec.drafters import Drafter

PROMPT = [11, 52, 97, 140]
TOP_K, TEMP = 4, 1.0
TOPK4 = dict(temperature=TEMP, top_k=TOP_K)
# the chain's cuts together, on a prompt where the tiny model's rows are flat enough
# that each cuts (top-k 8 -> top-p: 512 -> 75 outcomes of three tokens -> min-p: 64);
# and top-p with min-p over the whole row (107 -> 75)
CHAIN_PROMPT = [67, 158, 196, 99]
CHAINS = {"top_k+top_p+min_p": dict(temperature=0.9, top_k=8, top_p=0.9, min_p=0.1),
          "top_p+min_p": dict(temperature=1.1, top_p=0.9, min_p=0.1)}
N_SAMPLES = 4000
N_SEQ = 16


def _target_dist(ctx, prefix, sampling):
    ctx.clear()
    b = Batch(64)
    for i, t in enumerate(prefix):
        b.add(t, i, 0, i == len(prefix) - 1)
    ctx.decode(b)
    return reference_distribution(np.array(ctx.logits()), **sampling)


def _exact_joint(model, sampling=TOPK4, prompt=PROMPT):
    ctx = Context(model, n_ctx=64, n_batch=64)
    joint = {}
    p1 = _target_dist(ctx, prompt, sampling)
    for a, pa in p1.items():
        p2 = _target_dist(ctx, prompt + [a], sampling)
        for b, pb in p2.items():
            p3 = _target_dist(ctx, prompt + [a, b], sampling)
            for c, pc in p3.items():
                joint[(a, b, c)] = pa * pb * pc
    return joint


class Proposer(Drafter):
    """Draws 2 tokens from its own fixed distribution q (some mass outside the target's top-k)."""

    def __init__(self, support, with_probs, seed):
        super().__init__("proposer")
        self.support = list(support)
        self.q = np.linspace(2.0, 1.0, len(self.support))
        self.q /= self.q.sum()
        self.with_probs = with_probs
        self.rng = np.random.default_rng(seed)

    def propose(self, seq, last_token, n_max):
        toks = [int(self.rng.choice(self.support, p=self.q)) for _ in range(min(2, n_max))]
        if not self.with_probs:
            return toks
        q = dict(zip(self.support, self.q.tolist()))
        return toks, [q] * len(toks)


def _sample(model, drafter, broken=False, n_samples=N_SAMPLES, sampling=TOPK4, prompt=PROMPT):
    ctx = Context(model, n_ctx=64 * N_SEQ, n_batch=64, n_seq_max=N_SEQ)
    if drafter is not None:
        drafter.bind(ctx, N_SEQ)
    ctl = CheckedController(ctx, [drafter] if drafter is not None else [],
                            n_max=2 if drafter is not None else 0, unsafe_accept_all=broken,
                            **sampling)
    counts = {}
    totals = dict.fromkeys(("drafted", "accepted", "redecodes"), 0)   # over every request
    for r in range(n_samples // N_SEQ):
        ctl.start([prompt] * N_SEQ, 3, seeds=[1000 * r + i for i in range(N_SEQ)])
        ctl.run()
        for i in range(N_SEQ):
            key = tuple(ctl.tokens(i))
            counts[key] = counts.get(key, 0) + 1
        st = ctl.stats()
        for k in totals:
            totals[k] += st[k]
    return counts, totals


def _chi2_pvalue(counts, joint):
    assert set(counts) <= set(joint), "sampled a sequence the target cannot produce"
    n = sum(counts.values())
    exp = np.array([joint[k] * n for k in joint])
    obs = np.array([counts.get(k, 0) for k in joint])
    small = exp < 5          # pool sparse cells
    e = np.append(exp[~small], exp[small].sum())
    o = np.append(obs[~small], obs[small].sum())
    if e[-1] == 0:
        e, o = e[:-1], o[:-1]
    e = e * (o.sum() / e.sum())
    return stats.chisquare(o, e).pvalue


@pytest.fixture(scope="module")
def joint(tiny_dense):
    j = _exact_joint(tiny_dense)
    assert abs(sum(j.values()) - 1) < 1e-5
    return j


@pytest.fixture(scope="module")
def support(joint):
    toks = sorted({t for k in joint for t in k})
    return toks[:6] + [0, 1]   # mostly in the target's support, some mass outside


@pytest.mark.parametrize("with_probs", [True, False])
def test_speculative_distribution_matches_target(tiny_dense, joint, support, with_probs):
    counts, st = _sample(tiny_dense, Proposer(support, with_probs, seed=7))
    assert st["drafted"] > 0 and 0 < st["accepted"] < st["drafted"]
    p = _chi2_pvalue(counts, joint)
    assert p > 1e-3, f"chi-square p={p:.2e}: speculative output does not follow the target"


@pytest.mark.parametrize("chain,with_probs", [
    ("top_k+top_p+min_p", True), ("top_p+min_p", True),
    pytest.param("top_k+top_p+min_p", False, marks=pytest.mark.slow),
    pytest.param("top_k+top_p+min_p", None, marks=pytest.mark.slow),
    pytest.param("top_p+min_p", False, marks=pytest.mark.slow),
    pytest.param("top_p+min_p", None, marks=pytest.mark.slow)])
def test_the_chain_matches_target(tiny_dense, chain, with_probs):
    """top-k, top-p and min-p together, and top-p with min-p: with drafts from a drafter
    with its own q, a one-hot drafter, and plainly (None), the first three tokens follow
    the reference chain's exact law."""
    sampling = CHAINS[chain]
    joint = _exact_joint(tiny_dense, sampling, CHAIN_PROMPT)
    assert abs(sum(joint.values()) - 1) < 1e-5 and len(joint) > 50
    toks = sorted({t for k in joint for t in k})
    drafter = Proposer(toks[:6] + [0, 1], with_probs, seed=5) if with_probs is not None else None
    counts, st = _sample(tiny_dense, drafter, sampling=sampling, prompt=CHAIN_PROMPT)
    if drafter is not None:
        assert 0 < st["accepted"] < st["drafted"]
    p = _chi2_pvalue(counts, joint)
    assert p > 1e-3, f"chi-square p={p:.2e}: the output does not follow the target's chain"


def test_broken_rule_is_detected(tiny_dense, joint, support):
    counts, _ = _sample(tiny_dense, Proposer(support, True, seed=7), broken=True)
    outside = sum(v for k, v in counts.items() if k not in joint)
    p = _chi2_pvalue({k: v for k, v in counts.items() if k in joint}, joint) if not outside else 0.0
    assert outside > 0 or p < 1e-6


def test_distribution_with_requests_joining_and_leaving(tiny_dense, joint, support):
    """Continuous batching: sampled requests join and leave slots between rounds while
    longer requests with other prompts run beside them; the distribution stays the target's."""
    ctx = Context(tiny_dense, n_ctx=64 * N_SEQ, n_batch=64, n_seq_max=N_SEQ)
    drafter = Proposer(support, True, seed=11)
    drafter.bind(ctx, N_SEQ)
    ctl = DrivenController(ctx, [drafter])
    policy = new_policy(2)
    args = dict(temperature=TEMP, top_k=TOP_K, n_max=2, policy=policy)
    n_long = 4
    seed = 0

    def join(slot):
        nonlocal seed
        seed += 1
        if slot < n_long:   # a longer request on another prompt, with its own length
            ctl.join(slot, [slot + 20, 52 + seed % 7, 97], max_tokens=5 + seed % 30,
                     seed=seed, **args)
        else:
            ctl.join(slot, PROMPT, max_tokens=3, seed=10**6 + seed, **args)

    for slot in range(N_SEQ):
        join(slot)
    counts, n, drafted = {}, 0, 0
    while n < N_SAMPLES:
        ctl.step()
        for slot in range(N_SEQ):
            if ctl.finish_reason(slot) is None:
                continue
            if slot >= n_long:
                key = tuple(ctl.tokens(slot))
                counts[key] = counts.get(key, 0) + 1
                n += 1
                drafted += ctl.stats(slot)["drafted"]
            ctl.leave(slot)
            join(slot)
    assert drafted > 0
    p = _chi2_pvalue(counts, joint)
    assert p > 1e-3, f"chi-square p={p:.2e}: speculative output does not follow the target"


def test_plain_sampling_matches_target(tiny_dense, joint):
    ctx = Context(tiny_dense, n_ctx=64 * N_SEQ, n_batch=64, n_seq_max=N_SEQ)
    ctl = DrivenController(ctx, [], temperature=TEMP, top_k=TOP_K)
    counts = {}
    for r in range(N_SAMPLES // N_SEQ):
        ctl.start([PROMPT] * N_SEQ, 3, seeds=[7000 + 1000 * r + i for i in range(N_SEQ)])
        ctl.run()
        for i in range(N_SEQ):
            k = tuple(ctl.tokens(i))
            counts[k] = counts.get(k, 0) + 1
    assert _chi2_pvalue(counts, joint) > 1e-3


@pytest.fixture(scope="module")
def tiny_mamba2(tiny_mamba2_path):
    from specdec import Model
    return Model(tiny_mamba2_path)


def test_checkpoint_rollback_distribution_matches_target(tiny_mamba2):
    """A recurrent target rolled back by checkpoints (restore, decode again) samples the
    target's distribution too: the rejected rounds' restored states and the token drawn
    from the decode again are the target's own."""
    j = _exact_joint(tiny_mamba2)
    assert abs(sum(j.values()) - 1) < 1e-5
    marginal = {}
    for k, v in j.items():
        for t in k:
            marginal[t] = marginal.get(t, 0.0) + v
    # the likeliest tokens, so that drafts are accepted as well as rejected
    sup = sorted(marginal, key=lambda t: -marginal[t])[:6] + [0, 1]
    counts, st = _sample(tiny_mamba2, Proposer(sup, True, seed=7), n_samples=1600)
    assert st["drafted"] > 0 and 0 < st["accepted"] < st["drafted"] and st["redecodes"] > 0
    p = _chi2_pvalue(counts, j)
    print(f"checkpoint rollback chi-square p={p:.3f}")
    assert p > 1e-3, f"chi-square p={p:.2e}: checkpoint rollback does not follow the target"
