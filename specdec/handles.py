"""What a caller holds of a running request: a handle (threads) or an async stream (asyncio).

The scheduler core and a request's reader share a ``_State`` (an Engine's handle or async
stream, a Decoder's stream or its own call); the Engine's worker never holds the handle
itself, so a handle nobody keeps is garbage-collected and its request cancelled.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import time
import weakref
from typing import Any, Iterator, Optional

from ._request import Request
from .results import GenerationResult, Piece


class _State:
    """What the worker and a request's handle share (the worker never holds the handle,
    so a handle nobody keeps is garbage-collected, and its request cancelled)."""

    def __init__(self, req: Request, loop: Optional[asyncio.AbstractEventLoop] = None, *,
                 streams: bool = True) -> None:
        self.req = req
        # False: nobody reads the pieces (a Decoder's ``generate``), so none is made
        self.streams = streams
        self.future: "concurrent.futures.Future[GenerationResult]" = concurrent.futures.Future()
        self.cancelled = False
        self.loop = loop
        self.pieces: "queue.SimpleQueue[Optional[Piece]]" = queue.SimpleQueue()
        self.apieces: Optional["asyncio.Queue[Optional[Piece]]"] = (
            asyncio.Queue() if loop is not None else None)
        self.slot = -1
        self.n_decoded = 0
        # what a request that failed had generated (the Decoder's stream shows it)
        self.partial: Optional[GenerationResult] = None
        self.t_submit = time.monotonic()
        self.t_first: Optional[float] = None

    def cancel(self) -> None:
        self.cancelled = True

    def put(self, piece: Optional[Piece]) -> None:
        """A piece (None: the end) to whoever reads the request."""
        if self.apieces is not None and self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self.apieces.put_nowait, piece)
            except RuntimeError:      # the loop is closed: nobody reads any more
                self.cancelled = True
        else:
            self.pieces.put(piece)

    def finish(self, res: Optional[GenerationResult] = None,
               exc: Optional[BaseException] = None) -> None:
        if self.future.done():
            return
        self.put(None)
        try:
            if exc is not None:
                self.future.set_exception(exc)
            else:
                self.future.set_result(res)   # type: ignore[arg-type]
        except concurrent.futures.InvalidStateError:
            # the reader cancelled the future between the check above and now (an asyncio
            # reader that went away cancels it from its event loop's thread)
            pass


class RequestHandle:
    """A submitted request: its result, its pieces as they come, and a way to stop it.

    Iterating the handle yields :class:`Piece` objects (text, token ids, logprobs) until
    the request ends; ``result()`` waits for the :class:`GenerationResult`. Dropping the
    last reference to an unfinished handle cancels the request.
    """

    def __init__(self, state: _State) -> None:
        self._s = state
        weakref.finalize(self, state.cancel)

    @property
    def slot(self) -> int:
        """The engine slot the request runs on (-1 while queued)."""
        return self._s.slot

    @property
    def n_prompt_decoded(self) -> int:
        """Prompt tokens decoded for this request (the rest came from a slot's kept KV)."""
        return self._s.n_decoded

    @property
    def time_to_first_token(self) -> Optional[float]:
        """Seconds from ``submit`` to the first token (None before it)."""
        return None if self._s.t_first is None else self._s.t_first - self._s.t_submit

    def done(self) -> bool:
        return self._s.future.done()

    def cancel(self) -> None:
        """Stop the request at the next round (its result ends with ``finish_reason ==
        "cancelled"``); its slot and KV are freed."""
        self._s.cancel()

    def result(self, timeout: Optional[float] = None) -> GenerationResult:
        """Wait for the result; ``TimeoutError`` after ``timeout`` seconds (the request goes
        on: ``cancel()`` stops it). Raises what the request failed with, if it failed."""
        try:
            return self._s.future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the request did not finish within {timeout} s") from None

    def __iter__(self) -> Iterator[Piece]:
        return self.pieces()

    def pieces(self, timeout: Optional[float] = None) -> Iterator[Piece]:
        """Pieces as they come; ``TimeoutError`` when none came for ``timeout`` seconds.
        Each piece is delivered once, to one reader."""
        if self._s.apieces is not None:
            raise RuntimeError("this request streams to asyncio: use `async for`")
        while True:
            try:
                p = self._s.pieces.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no piece within {timeout} s") from None
            if p is None:
                self._s.pieces.put(None)    # the end stays visible to a second loop
                exc = self._s.future.exception() if self._s.future.done() else None
                if exc is not None:
                    raise exc
                return
            yield p


class AsyncStream:
    """``async for piece in engine.stream(...)``: :class:`Piece` objects as they come.

    ``result`` holds the :class:`GenerationResult` once the iteration ended. Leaving
    the loop early (``break``, an exception, a cancelled task) cancels the request.
    """

    def __init__(self, state: _State) -> None:
        self._s = state
        self.result: Optional[GenerationResult] = None
        weakref.finalize(self, state.cancel)

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self) -> Piece:
        assert self._s.apieces is not None
        if asyncio.get_running_loop() is not self._s.loop:
            # the worker hands pieces to the loop that called stream(): read from another,
            # the queue's waiter would never be woken and the read would hang
            raise RuntimeError("this stream delivers its pieces to the event loop that called "
                               "Engine.stream(); iterate it there (Engine.generate() may be "
                               "awaited from any loop)")
        try:
            p = await self._s.apieces.get()
        except BaseException:
            self._s.cancel()
            raise
        if p is None:
            self._s.apieces.put_nowait(None)
            self.result = await asyncio.wrap_future(self._s.future)
            raise StopAsyncIteration
        return p

    async def aclose(self) -> None:
        """Cancel the request (if it still runs)."""
        if not self._s.future.done():
            self._s.cancel()

    def cancel(self) -> None:
        self._s.cancel()

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
