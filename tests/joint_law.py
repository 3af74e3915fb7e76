"""The sampled-mode check shared by the drafters' tests: the first tokens of a hot target,
generated speculatively, must follow the target's exact joint law (chi-square)."""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np

from specdec import Batch, Context, Model
from specdec._sampling import Distribution


def target_joint(model: Model, prompt: Sequence[int], n: int, temperature: float,
                 min_p: float) -> Dict[Tuple[int, ...], float]:
    """P(first ``n`` tokens) under the target's sampling distribution, by plain decodes."""
    ctx = Context(model, n_ctx=64, n_batch=64)

    def dist(prefix):
        ctx.clear()
        b = Batch(64)
        for i, t in enumerate(prefix):
            b.add(t, i, 0, i == len(prefix) - 1)
        ctx.decode(b)
        return Distribution().set_logits(np.array(ctx.logits()), temperature=temperature,
                                         min_p=min_p).as_dict()

    def grow(prefix, p):
        if len(prefix) == n:
            return {tuple(prefix): p}
        out = {}
        for t, q in dist(list(prompt) + list(prefix)).items():
            out.update(grow(list(prefix) + [t], p * q))
        return out

    return grow([], 1.0)


def chi_square_p(counts: Dict[Tuple[int, ...], int], joint: Dict[Tuple[int, ...], float]) -> float:
    """p-value of the observed ``counts`` under ``joint`` (cells expecting < 5 pooled)."""
    from scipy import stats as sst

    assert set(counts) <= set(joint), "a sequence the target cannot produce was sampled"
    n = sum(counts.values())
    exp = np.array([joint[k] * n for k in joint])
    obs = np.array([counts.get(k, 0) for k in joint])
    small = exp < 5
    e = np.append(exp[~small], exp[small].sum())
    o = np.append(obs[~small], obs[small].sum())
    if e[-1] == 0:
        e, o = e[:-1], o[:-1]
    return float(sst.chisquare(o, e * (o.sum() / e.sum())).pvalue)


def speculative_counts(tgt: Context, drafter, prompt: Sequence[int], n: int, n_max: int,
                       temperature: float, min_p: float,
                       n_samples: int) -> Tuple[Dict[Tuple[int, ...], int], dict]:
    """How often each first ``n`` tokens came out of ``n_samples`` speculative runs of
    ``drafter`` on ``tgt`` (all its sequences at once), and the controller's stats."""
    from specdec._checks import DrivenController
    from specdec.config import SpecConfig

    n_seq = tgt.n_seq_max
    drafter.configure(SpecConfig(n_max=n_max))
    drafter.bind(tgt, n_seq)
    ctl = DrivenController(tgt, [drafter], n_max=n_max, temperature=temperature, min_p=min_p)
    counts: Dict[Tuple[int, ...], int] = {}
    for r in range(n_samples // n_seq):
        ctl.start([list(prompt)] * n_seq, n, seeds=[1000 * r + i for i in range(n_seq)])
        ctl.run()
        for i in range(n_seq):
            k = tuple(ctl.tokens(i))
            counts[k] = counts.get(k, 0) + 1
    return counts, ctl.stats()
