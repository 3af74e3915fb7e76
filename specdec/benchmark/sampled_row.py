"""The bench's sampled plain row: specdec's plain decoding at OpenAI's default temperature,
timed round by round in turn with greedy plain decoding on the same requests.

Why in turn: the row's ratio to greedy is what building the sampling distribution costs
(the ``sampling-cost`` ratio, target 0.95): about 0.1 ms a token on Gemma's 262k-token
rows, ~1% of a decode. Timed as the other rows are, greedy first and the sampled row after
the peers' processes, half a minute later, the ratio moves with the machine: one idle EPYC
run read 0.75 on one prompt (62.8 against 46.9 tok/s) and 0.98 on the others. In turn,
both sides decode the same prompt at the same point of the text, the same number of tokens
(``interleave`` stops the longer one where the shorter ended), so a slow stretch lands on
both.
"""
from __future__ import annotations

import statistics
from typing import Optional

from .. import api
from ..config import Sampling
from .interleave import interleave
from .matrix import SPECDEC, Case, Method
from .prompts import Prompt
from .rows import Row, Sample, prefix_share
from .timed_sample import forget_texts


def is_sampled_plain(m: Method) -> bool:
    """``m`` is specdec's plain decoding that samples (timed by ``sampled_row``)."""
    return m.side == SPECDEC and m.family == "plain" and bool(m.temperature)


def sampled_row(case: Case, p: Prompt, m: Method, dec: api.Decoder, greedy: api.Decoder,
                requests: int, ref: Optional[Sample]) -> Row:
    """``m``'s row on ``p``: ``requests`` requests on ``dec`` (seeded: each draws the same
    tokens) in turn with ``greedy``'s. ``tok_s`` is over its rounds, as every row's (the
    prompt pass left out); ``ref_tok_s`` is greedy's over the same rounds' span; ``match``
    compares its output with the greedy reference ``ref``."""
    r = Row(case.name, p.name, p.category, m.label, m.side, m.family, m.drafter, m.n_max,
            m.adaptive, m.exact, m.temperature)
    try:
        got = interleave(dec, greedy, p.text, case.n_gen, requests, before=forget_texts,
                         sampling=Sampling(temperature=m.temperature, seed=0))
    except Exception as e:  # noqa: BLE001 - the row says why
        r.status, r.note = "error", f"{type(e).__name__}: {str(e)[:300]}"
        return r
    r.tok_s_runs, r.ref_tok_s_runs = got.rounds_tok_s, got.ref_rounds_tok_s
    r.tok_s, r.ref_tok_s = statistics.median(r.tok_s_runs), statistics.median(r.ref_tok_s_runs)
    if ref is not None:
        r.match = prefix_share(got.last_tokens, ref.tokens or [])
    r.note = f"{requests} requests in turn with greedy plain"
    return r


__all__ = ["is_sampled_plain", "sampled_row"]
