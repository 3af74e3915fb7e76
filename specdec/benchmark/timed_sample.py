"""One timed generation of a specdec method, as the runner takes it: drafters' text memory
emptied first, sampled rows seeded, and the regression gate's injected slowdown.

``SPECDEC_BENCH_INJECT_SLEEP_MS`` makes the specdec side sleep that long per round. It exists
to show that the regression gate fails on a slower build; only the benchmark reads it, never
the library.
"""
from __future__ import annotations

import os
import time

from .. import api
from ..config import Sampling
from .rows import Sample

INJECT_ENV = "SPECDEC_BENCH_INJECT_SLEEP_MS"


def inject_sleep_s() -> float:
    try:
        return max(float(os.environ.get(INJECT_ENV, "0") or 0), 0.0) / 1000.0
    except ValueError:
        raise ValueError(f"{INJECT_ENV} must be a number of milliseconds") from None


def forget_texts(dec: api.Decoder) -> None:
    """Empty what drafters keep of earlier requests' text (the suffix corpus, the dynamic
    n-gram cache). The benchmark repeats each prompt, so a drafter that kept the last
    answer would draft it verbatim and measure its memory, not its method; llama.cpp's
    tools start every prompt from nothing too. What the adaptive policy learnt (costs,
    acceptance rates) is kept: it holds no text."""
    for d in dec.drafters:
        d.forget_text()


def specdec_sample(dec: api.Decoder, prompt, n_gen: int, sleep_s: float,
                    temperature: float = 0.0) -> Sample:
    forget_texts(dec)
    # sampled rows are seeded: every round draws the same tokens, so rounds time the same work
    sampling = Sampling(temperature=temperature, seed=0) if temperature else None
    slept = 0.0
    if sleep_s:
        st = dec.stream(prompt, max_tokens=n_gen, sampling=sampling)
        for _ in st:                 # one piece per round
            time.sleep(sleep_s)
            slept += sleep_s
        res = st.result
        assert res is not None
    else:
        res = dec.generate(prompt, max_tokens=n_gen, sampling=sampling)
    s = res.stats
    # generation time leaves out the caller's time between stream pieces: the injected sleep
    # is added back, as a slower round would be
    tok_s = s.n_generated / (s.t_generate_s + slept) if slept else s.tokens_per_s
    return Sample(tok_s, list(res.tokens), res.text, s.drafted, s.accepted,
                  list(s.drafted_per_position), list(s.accepted_per_position))
