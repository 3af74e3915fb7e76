"""Two decoders timed round by round, taking turns: a ratio that load drift cannot tilt.

Request-level alternation (A B A B) leaves each request exposed to whatever the machine
did during its second or two; on these shared 2-core VMs plain decoding's speed moves
+-5% between consecutive requests and 30% within an hour, which swamps a question like
"is the adaptive policy ever 3% slower than plain decoding?". Here both decoders run the
same request at once, one round each in turn (always advancing the one with fewer tokens,
so both stay at the same point of the text), and each side's time is only its own rounds.
A slow stretch of the machine then lands on both sides alike.

Both sides time the same work: when one ends first (at its end of text, say, as a sampled
side may), the other is stopped once it has as many tokens. A sampled side (``sampling``)
is compared with greedy decoding this way: its rounds and the greedy ones at the same
point of the same request, not two requests half a minute apart.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from .. import api
from ..config import Sampling


@dataclass
class Interleaved:
    """Per request: tokens and seconds of each side, and each side's own rate over its
    rounds (``Stats.tokens_per_s``: the prompt pass left out); the draft counts and the last
    output of ``dec``."""

    tokens: List[int] = field(default_factory=list)
    seconds: List[float] = field(default_factory=list)
    ref_seconds: List[float] = field(default_factory=list)
    rounds_tok_s: List[float] = field(default_factory=list)
    ref_rounds_tok_s: List[float] = field(default_factory=list)
    last_tokens: List[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    same_tokens: bool = True

    @property
    def tok_s(self) -> float:
        return sum(self.tokens) / sum(self.seconds) if self.seconds else 0.0

    @property
    def ref_tok_s(self) -> float:
        return sum(self.tokens) / sum(self.ref_seconds) if self.ref_seconds else 0.0

    def per_request(self) -> List[float]:
        """``dec`` over ``ref`` in each request."""
        return [r / s for s, r in zip(self.seconds, self.ref_seconds)]


def interleave(dec: api.Decoder, ref: api.Decoder, prompt: Any, n_gen: int, requests: int,
               before: Optional[Callable[[api.Decoder], None]] = None,
               sampling: Optional[Sampling] = None) -> Interleaved:
    """Run ``requests`` requests of ``n_gen`` tokens on both decoders, round by round in
    turn; ``before`` runs on each decoder before each request (untimed). The prompt pass
    counts too. Who goes first alternates between requests. ``sampling``: how ``dec``
    samples (``ref`` decodes greedily)."""
    out = Interleaved()
    decs = (dec, ref)
    for r in range(requests):
        if before is not None:
            before(dec)
            before(ref)
        t = [0.0, 0.0]
        order = (0, 1) if r % 2 == 0 else (1, 0)
        streams: List[Any] = [None, None]
        for i in order:
            t0 = time.perf_counter()
            streams[i] = decs[i].stream(prompt, max_tokens=n_gen,
                                        sampling=sampling if i == 0 else None)
            t[i] += time.perf_counter() - t0
        live = [True, True]
        n = [0, 0]
        while live[0] or live[1]:
            for j in (0, 1):   # the side that ended first set the work: the other stops there
                if live[j] and not live[1 - j] and n[j] >= n[1 - j]:
                    streams[j].close()
                    live[j] = False
            if not (live[0] or live[1]):
                break
            i = order[0] if live[order[0]] and (not live[order[1]] or n[order[0]] <= n[order[1]]) \
                else order[1]
            t0 = time.perf_counter()
            try:
                next(streams[i])
            except StopIteration:
                live[i] = False
            t[i] += time.perf_counter() - t0
            n[i] = streams[i].n_tokens
        a, b = streams[0].result, streams[1].result
        out.tokens.append(len(a.tokens))
        out.seconds.append(t[0])
        out.ref_seconds.append(t[1] * len(a.tokens) / max(len(b.tokens), 1))
        out.rounds_tok_s.append(a.stats.tokens_per_s)
        out.ref_rounds_tok_s.append(b.stats.tokens_per_s)
        out.last_tokens = list(a.tokens)
        out.drafted += a.stats.drafted
        out.accepted += a.stats.accepted
        out.same_tokens &= list(a.tokens) == list(b.tokens)
    return out


__all__ = ["Interleaved", "interleave"]
