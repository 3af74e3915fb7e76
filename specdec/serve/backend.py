"""What the HTTP layer runs requests on: a :class:`~specdec.Engine`.

Requests run together: each takes a slot, joins the verify batch between rounds and leaves
when done; the rest wait in the engine's queue. A request may pick one of the engine's
drafters and a shorter ``n_max`` (``{"specdec": {"drafter": NAME | "plain", "n_max": N}}``)
and ask for logprobs. A job cancelled (its client gone) leaves at the next round and frees
its slot.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Optional

from ..config import Sampling
from ..results import GenerationResult
from .protocol import TokenLP


@dataclass
class Piece:
    """Text accepted in one round; ``n_tokens``: the request's tokens so far."""

    text: str
    n_tokens: int
    logprobs: Optional[List[TokenLP]] = None


@dataclass
class Work:
    """A request ready to run: prompt tokens and per-request options."""

    tokens: List[int]
    max_tokens: int
    sampling: Sampling
    stop: List[str]
    logprobs: int = -1
    stop_token_ids: List[int] = field(default_factory=list)
    options: Optional[Dict[str, Any]] = None


class Job:
    """One request in flight: ``async for piece in job``, then ``job.result``."""

    def __init__(self, backend: "EngineBackend", stream: Any) -> None:
        self._backend = backend
        self._stream = stream

    @property
    def result(self) -> Optional[GenerationResult]:
        res: Optional[GenerationResult] = self._stream.result
        return res

    def cancel(self) -> None:
        """Leave at the next round (or never start); harmless once finished."""
        self._stream.cancel()

    async def __aiter__(self) -> AsyncIterator[Piece]:
        n = 0
        async for p in self._stream:
            n += len(p.tokens)
            yield Piece(p.text, n, self._backend.logprobs_of(p.tokens, p.logprobs))


class EngineBackend:
    """The server's requests on one Engine."""

    #: the per-request options a body's ``specdec`` object may carry
    OPTIONS = ("drafter", "n_max")

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.model = engine.model
        self.n_ctx_seq: int = engine.n_ctx
        self.slots: int = engine.n_slots

    def stats(self) -> Dict[str, Any]:
        """Totals over the requests that ended (cut short or not), and the live counts."""
        st: Dict[str, Any] = self.engine.stats()
        return st

    def check_options(self, options: Dict[str, Any]) -> None:
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise ValueError(f"unknown specdec options {unknown}; known: {list(self.OPTIONS)}")

    def submit(self, work: Work) -> Job:
        """Queue ``work`` (from the event loop); bad options raise ``ValueError`` here."""
        opts = work.options or {}
        logprobs: Any = None if work.logprobs < 0 else (work.logprobs or True)
        return Job(self, self.engine.stream(
            work.tokens, max_tokens=work.max_tokens, sampling=work.sampling, stop=work.stop,
            stop_token_ids=work.stop_token_ids, drafter=opts.get("drafter"),
            n_max=opts.get("n_max"), logprobs=logprobs))

    def _text(self, tok: int) -> str:
        text: str = self.model.token_to_piece(tok).decode("utf-8", "replace")
        return text

    def logprobs_of(self, tokens: List[int], lps: Any) -> Optional[List[TokenLP]]:
        """The engine's per-token logprobs as (text, logprob, [(alt text, logprob)])."""
        if lps is None:
            return None
        return [(self._text(t), lp.logprob, [(self._text(a), alp) for a, alp in lp.top])
                for t, lp in zip(tokens, lps)]

    def close(self) -> None:
        self.engine.close()
