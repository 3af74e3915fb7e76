"""The bigram test models' greedy output, from their weights: what every exact speculative
run on them must reproduce token for token (shared by the MTP and EAGLE-3 tests)."""
from __future__ import annotations

import functools
from typing import List, Sequence

from specdec.testing import bigram_successor


@functools.lru_cache(maxsize=None)
def _successor(path: str):
    return bigram_successor(path)


def greedy_cycle(path: str, prompt: Sequence[int], n: int) -> List[int]:
    """The bigram model's greedy output: the successor cycle from the last prompt token."""
    succ, out, t = _successor(path), [], prompt[-1]
    for _ in range(n):
        t = int(succ[t])
        out.append(t)
    return out
