"""A numpy reference of llama.cpp's sampler chain (top-k, top-p, min-p on the raw logits,
then temperature), independent of specdec's ``Distribution``: a stable sort of the whole
row (ties: lower id first) and float64 sums. The sampling tests check the distribution
against it, and the speculative tests take their exact law from it."""
from __future__ import annotations

from typing import Dict

import numpy as np

CUTOFF = 40.0   # specdec drops tokens this far below the best logit (times max(t, 1))


def reference_distribution(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                           min_p: float = 0.0) -> Dict[int, float]:
    """Token id -> probability under the chain."""
    logits = np.asarray(logits, dtype=np.float32)
    t = temperature if temperature > 0 else 1.0
    order = np.argsort(-logits, kind="stable")
    order = order[np.isfinite(logits[order])]
    cand = order[:top_k] if 0 < top_k < len(logits) else order
    l = logits[cand].astype(np.float64)
    keep = l >= l[0] - CUTOFF * max(t, 1.0)
    cand, l = cand[keep], l[keep]
    p = np.exp(l - l[0])
    p /= p.sum()
    n = len(cand)
    if top_p < 1.0:
        n = min(n, int(np.searchsorted(np.cumsum(p), top_p) + 1))
    if min_p > 0:
        ok = p[:n] >= min_p * p[0]
        n = int(np.argmin(ok)) if not ok.all() else n
    cand, l = cand[:n], l[:n]
    q = np.exp((l - l[0]) / t)
    return dict(zip(cand.tolist(), (q / q.sum()).tolist()))
