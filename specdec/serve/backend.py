"""What the HTTP layer runs requests on: a :class:`~specdec.Engine`.

Requests run together: each takes a slot, joins the verify batch between rounds and leaves
when done; the rest wait in the engine's queue. A request may pick one of the engine's
drafters and a shorter ``n_max`` (``{"specdec": {"drafter": NAME | "plain", "n_max": N}}``)
and ask for logprobs. A job cancelled (its client gone) leaves at the next round and frees
its slot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, List, Optional

from .._request import Request
from ..results import GenerationResult
from .protocol import EXTENSION_OPTIONS, TokenLP, token_logprobs


@dataclass
class Piece:
    """Text accepted in one round; ``n_tokens``: the request's tokens so far."""

    text: str
    n_tokens: int
    logprobs: Optional[List[TokenLP]] = None


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
    OPTIONS = EXTENSION_OPTIONS

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        #: the scheduler core the requests are built for (``protocol.requests``)
        self.core = engine._core
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

    def arriving(self) -> Any:
        """A request on its way (``Engine.arriving``): ``done()`` once submitted."""
        return self.engine.arriving()

    def submit(self, req: Request) -> Job:
        """Queue a request ``protocol.requests`` built (from the event loop)."""
        return Job(self, self.engine._stream(req))

    def logprobs_of(self, tokens: List[int], lps: Any) -> Optional[List[TokenLP]]:
        """The engine's per-token logprobs as (text, logprob, [(alt text, logprob)])."""
        return token_logprobs(self.model, tokens, lps)

    def close(self) -> None:
        self.engine.close()
