"""What the HTTP layer runs requests on: jobs that stream pieces into the event loop.

:class:`DecoderBackend` serves one request at a time on one :class:`~specdec.Decoder`, in a
worker thread (the decodes release the GIL, so the event loop keeps answering); the others
wait in its queue. A job cancelled before it starts never runs; one cancelled while running
stops at its next piece and frees the decoder.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, List, Optional

from ..api import Decoder
from ..config import Sampling
from ..results import GenerationResult, Stats
from .protocol import TokenLP

#: the totals every backend's ``stats()`` reports (as the Engine's do)
TOTALS = ("requests", "n_prompt", "n_generated", "drafted", "accepted")


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
    options: Optional[Dict[str, Any]] = None


_DONE = object()


class Job:
    """One request in flight: ``async for piece in job`` then ``job.result``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue()
        self._cancelled = threading.Event()
        self.result: Optional[GenerationResult] = None
        self.error: Optional[BaseException] = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop at the next piece (or never start); safe from any thread, more than once."""
        self._cancelled.set()

    # worker side
    def put(self, piece: Piece) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, piece)

    def finish(self, result: Optional[GenerationResult], error: Optional[BaseException]) -> None:
        def done() -> None:
            self.result, self.error = result, error
            self._queue.put_nowait(_DONE)
        try:
            self._loop.call_soon_threadsafe(done)
        except RuntimeError:    # the loop is closed: nobody is waiting
            pass

    # event-loop side
    async def __aiter__(self) -> AsyncIterator[Piece]:
        while True:
            item = await self._queue.get()
            if item is _DONE:
                if self.error is not None:
                    raise self.error
                return
            yield item

    async def wait(self) -> GenerationResult:
        async for _ in self:
            pass
        assert self.result is not None
        return self.result


class DecoderBackend:
    """Requests served one at a time, in arrival order, on one Decoder."""

    slots = 1

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.model = decoder.model
        self.n_ctx_seq = decoder.ctx.n_ctx_seq
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-serve")
        self._lock = threading.Lock()
        self.queued = 0
        self.active = 0
        self._totals: Dict[str, Any] = {k: 0 for k in TOTALS}
        self._totals.update(drafted_per_position=[], accepted_per_position=[])

    def stats(self) -> Dict[str, Any]:
        """Totals over the requests that ended (cut short or not), and the live counts."""
        with self._lock:
            t = dict(self._totals)
            for k in ("drafted_per_position", "accepted_per_position"):
                t[k] = list(t[k])
            return dict(t, running=self.active, queued=self.queued, slots=self.slots)

    def _count(self, st: Stats) -> None:
        with self._lock:
            t = self._totals
            t["requests"] += 1
            for k in TOTALS[1:]:
                t[k] += getattr(st, k)
            for key, per in (("drafted_per_position", st.drafted_per_position),
                             ("accepted_per_position", st.accepted_per_position)):
                acc = t[key]
                acc.extend([0] * (len(per) - len(acc)))
                for i, v in enumerate(per):
                    acc[i] += v

    def check_options(self, options: Dict[str, Any]) -> None:
        """Per-request drafting options need the engine; here every request shares the
        decoder's drafters."""
        if options:
            raise ValueError(f"per-request options ({', '.join(sorted(options))}) are not "
                             "available: this server runs every request on one Decoder")

    def submit(self, work: Work) -> Job:
        job = Job(asyncio.get_running_loop())
        with self._lock:
            self.queued += 1
        self._pool.submit(self._run, job, work)
        return job

    def _run(self, job: Job, work: Work) -> None:
        with self._lock:
            self.queued -= 1
            self.active += 1
        result, error = None, None
        try:
            if not job.cancelled:
                st = self.decoder.stream(work.tokens, max_tokens=work.max_tokens,
                                         sampling=work.sampling, stop=work.stop)
                try:
                    for text in st:
                        if job.cancelled:
                            break
                        job.put(Piece(text, st.n_tokens))
                finally:
                    st.close()
                result = st.result
                if result is not None:
                    self._count(result.stats)
        except BaseException as e:   # handed to the request's handler
            error = e
        finally:
            with self._lock:
                self.active -= 1
            job.finish(result, error)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.decoder.close()
