"""An engine for concurrent requests: one model, one target context with a slot per request.

Requests join and leave between verify rounds (continuous batching), and every round
verifies all running requests in one batched decode. The rounds run on one worker
thread (llama.cpp's decode releases the GIL); callers submit from any thread
(:meth:`Engine.submit`, which returns a :class:`RequestHandle`) or from asyncio
(:meth:`Engine.generate`, :meth:`Engine.stream`).

Each request has its own sampling, ``max_tokens``, stop strings, logprobs, drafter (one
of those the engine loaded, or none) and draft length. The engine's drafters are shared
objects: per-request state is kept per slot, and what a drafter learns across requests
is shared by every request that uses it: a finished request's text joins the suffix
drafter's corpus and the n-gram cache's dynamic cache (when its slot begins its next
request), and helps every later request, whichever slot it runs on.

A joining request's prompt is decoded a chunk (``n_batch`` tokens) at a time, with a round of
the running requests between chunks: a long prompt does not stall the other streams. Short
prompts share a chunk, so requests that arrive together begin with one shared round.

A finished request's slot keeps its KV: a later request whose prompt starts with the
same tokens (the previous turn of a chat, a shared system prompt) takes that slot and
decodes only the new suffix. A cancelled, timed-out or abandoned request (its handle
garbage-collected) leaves at the next round and frees its slot and its KV. Before a slot
is taken, the KV it holds is saved to a prompt cache in host memory (``prompt_cache_mib``),
from which a later request whose prompt comes back is restored (see :mod:`.prompt_cache`).
"""
from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import threading
import time
import weakref
from typing import (Any, AsyncIterator, Deque, Dict, Iterator, List, Literal, Mapping, Optional,
                    Sequence, Union, overload)

from ._core import Model, release_threads
from ._request import Prompt, Request, SamplingSpec, StopSpec
from ._setup import DrafterSpec, LazyLogits, PathLike, as_list
from .config import SpecConfig
from .drafters import Drafter
from .handles import AsyncStream, RequestHandle, _State
from .openai_face import CompletionMethods, engine_acall, engine_call
from .placement import Placement
from .prompt_cache import DEFAULT_MIB
from .results import GenerationResult
from .scheduler import Driver, Scheduler

_log = logging.getLogger("specdec")


class EngineClosed(RuntimeError):
    """The engine was closed: it takes no more requests."""


#: how long an idle engine waits for the requests announced as on their way
#: (``Engine.arriving``) before it starts the first round of those already queued (seconds)
ARRIVAL_WAIT_S = 0.05


class Arrival:
    """A request on its way to an engine (``Engine.arriving``): its body is being read and
    checked. ``done()`` (or leaving the ``with`` block) once it was submitted, or refused."""

    def __init__(self, engine: "Engine") -> None:
        self._engine: Optional[Engine] = engine

    def done(self) -> None:
        """It was submitted (or will not be); harmless twice."""
        eng, self._engine = self._engine, None
        if eng is not None:
            with eng._cv:
                eng._arriving -= 1
                eng._cv.notify()

    def __enter__(self) -> "Arrival":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done()


#: engines whose worker may still run: closed at exit, before the interpreter tears down what
#: a worker in the middle of a round still uses
_live: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for eng in list(_live):
        eng.close()


class Engine(Driver, CompletionMethods):
    """One model serving concurrent requests, with speculative decoding.

    Parameters
    ----------
    model
        A GGUF path or a loaded :class:`Model`.
    drafters
        The drafters the engine loads: names or instances as :class:`Decoder` takes them
        (a mapping gives them names of your choosing). A request picks one by name, or a
        list of names as a chain, with ``drafter=``; the engine's default is
        ``default_drafter`` (the first loaded drafter unless given; ``"plain"``: none).
    n_slots
        Requests that run at once; more wait in a queue. Each slot holds ``n_ctx`` tokens
        (prompt plus generation).
    n_max, n_min, adaptive
        Draft length settings; a request may ask a shorter ``n_max``.
    exact
        Greedy output equal to plain decoding token for token, whatever else runs: the
        context computes every row with batch-invariant kernels, and every sequence of a
        verify batch gets the same number of rows (see ``Controller._pad``).
    prefix_reuse
        A request whose prompt starts with tokens a free slot still holds reuses that KV
        (off for drafters that read the target's hidden states, MTP).
    prompt_cache_mib
        Host memory (MiB) for the KV of prompts whose slot was taken since: a request whose
        prompt comes back restores it instead of decoding it again (0: none). Used with
        ``prefix_reuse``.
    n_batch, n_threads, lazy_logits, drafter_timeout, on_drafter_error, load_mtp,
    model_check, n_gpu_layers, split_mode, main_gpu, tensor_split, rpc_servers
        As for :class:`Decoder`.

    ``close()`` (or ``with Engine(...) as engine:``) stops the worker, cancels what is
    still running and frees the context.
    """

    def __init__(
        self,
        model: Union[Model, PathLike],
        *,
        drafters: Union[Mapping[str, DrafterSpec], Sequence[DrafterSpec], DrafterSpec, None] = None,
        default_drafter: Union[str, Sequence[str], None] = None,
        n_slots: int = 4,
        n_ctx: int = 4096,
        n_max: int = 4,
        n_min: int = 0,
        p_min: float = 0.0,
        adaptive: bool = False,
        exact: bool = False,
        prefix_reuse: bool = True,
        prompt_cache_mib: float = DEFAULT_MIB,
        n_batch: int = 512,
        n_threads: Optional[int] = None,
        lazy_logits: LazyLogits = "auto",
        drafter_timeout: Optional[float] = None,
        on_drafter_error: str = "raise",
        load_mtp: Optional[bool] = None,
        model_check: str = "fast",
        n_gpu_layers: int = 0,
        split_mode: Union[str, int] = "layer",
        main_gpu: int = 0,
        tensor_split: Optional[Sequence[float]] = None,
        rpc_servers: Union[str, Sequence[str], None] = None,
    ) -> None:
        if isinstance(n_slots, bool) or not isinstance(n_slots, int) or not 1 <= n_slots <= 256:
            raise ValueError(f"n_slots must be an int in [1, 256], got {n_slots!r}")
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 2:
            raise ValueError(f"n_ctx (tokens per slot) must be an int >= 2, got {n_ctx!r}")
        if isinstance(drafters, Mapping):
            names = [str(k) for k in drafters]
            specs = list(drafters.values())
        else:
            specs = as_list(drafters)
            names = [s if isinstance(s, str) else "" for s in specs]
        if specs and isinstance(n_max, int) and 0 < n_max and n_ctx < n_max + 2:
            # said per slot: the context's own check would name n_ctx * n_slots
            raise ValueError(f"n_ctx={n_ctx} (tokens per slot) is too small for drafts of "
                             f"n_max={n_max}: a slot needs a prompt token and a verify batch of "
                             f"n_max + 1 tokens (n_ctx >= {n_max + 2})")
        self._core = Scheduler(
            model, specs, spec=SpecConfig(n_max=n_max, n_min=n_min, p_min=p_min, adaptive=adaptive),
            exact=bool(exact), concurrent=True, n_seq=n_slots, n_ctx=n_ctx, n_batch=n_batch,
            n_ubatch=None, n_threads=n_threads, lazy_logits=lazy_logits,
            drafter_timeout=drafter_timeout, on_drafter_error=on_drafter_error,
            n_gpu_layers_draft=None, load_mtp=load_mtp, model_check=model_check,
            placement=Placement.make(n_gpu_layers, split_mode, main_gpu, tensor_split,
                                     rpc_servers),
            prefix_reuse=prefix_reuse, prompt_cache_mib=prompt_cache_mib)
        self.drafters: Dict[str, Drafter] = self._core.name_drafters(names, default_drafter)
        self.n_slots = n_slots
        self.n_ctx = n_ctx
        self._cv = threading.Condition()
        self._queue: Deque[_State] = collections.deque()
        self._arriving = 0            # requests announced (``arriving``), not submitted yet
        self._closed = False
        self._free_in_loop = False    # close() was called on the worker (see close)
        self._worker = threading.Thread(target=self._loop, name="specdec-engine", daemon=True)
        self._worker.start()
        _live.add(self)

    # --- submitting ---------------------------------------------------------------------

    def _enqueue(self, req: Request, loop: Optional[asyncio.AbstractEventLoop] = None
                 ) -> _State:
        """Queue a checked request (``loop``: its pieces go to that event loop)."""
        state = _State(req, loop)
        with self._cv:
            if self._closed:
                raise EngineClosed("this Engine is closed")
            self._queue.append(state)
            self._cv.notify()
        return state

    async def _wait(self, state: _State) -> GenerationResult:
        """The result of a queued request; cancelling the awaiting task cancels it."""
        try:
            return await asyncio.wrap_future(state.future)
        except asyncio.CancelledError:
            state.cancel()
            raise

    def _stream(self, req: Request) -> AsyncStream:
        """A checked request streamed to the running event loop."""
        return AsyncStream(self._enqueue(req, asyncio.get_running_loop()))

    def submit(self, prompt: Prompt, *, max_tokens: int = 128, sampling: SamplingSpec = None,
               stop: StopSpec = (), drafter: Union[str, Sequence[str], None] = None,
               n_max: Optional[int] = None, logprobs: Union[bool, int, None] = None,
               timeout: Optional[float] = None, stop_token_ids: Sequence[int] = (),
               **options: Any) -> RequestHandle:
        """Queue a request; thread-safe. Returns at once with its :class:`RequestHandle`.

        ``drafter``: a loaded drafter's name, a list of names (a chain), ``"plain"`` for
        none, or None for the engine's default. ``n_max``: a shorter draft cap than the
        engine's. ``logprobs``: True, or the number of top alternatives per token.
        ``timeout``: seconds from now; a request still running then ends with
        ``finish_reason == "timeout"`` and the text it had. ``stop`` and
        ``stop_token_ids`` as for :meth:`Decoder.generate`, and so are ``sampling`` and
        its keyword shortcuts (``temperature=``, ``seed=``, ...) and the constraint options
        (``grammar=``, ``json_schema=``, ``regex=``, ``choices=``, ``lark=``: see
        :class:`specdec.Constraint`). Bad options raise here.
        """
        return RequestHandle(self._enqueue(self._core.request(
            prompt, max_tokens=max_tokens, sampling=sampling, stop=stop, drafter=drafter,
            n_max=n_max, logprobs=logprobs, timeout=timeout, stop_token_ids=stop_token_ids,
            **options)))

    async def generate(self, prompt: Prompt, *, max_tokens: int = 128,
                       sampling: SamplingSpec = None, stop: StopSpec = (),
                       drafter: Union[str, Sequence[str], None] = None,
                       n_max: Optional[int] = None, logprobs: Union[bool, int, None] = None,
                       timeout: Optional[float] = None, stop_token_ids: Sequence[int] = (),
                       **options: Any) -> GenerationResult:
        """``await engine.generate(...)``: the options of :meth:`submit`. Cancelling the
        awaiting task cancels the request."""
        return await self._wait(self._enqueue(self._core.request(
            prompt, max_tokens=max_tokens, sampling=sampling, stop=stop, drafter=drafter,
            n_max=n_max, logprobs=logprobs, timeout=timeout, stop_token_ids=stop_token_ids,
            **options)))

    def stream(self, prompt: Prompt, *, max_tokens: int = 128, sampling: SamplingSpec = None,
               stop: StopSpec = (), drafter: Union[str, Sequence[str], None] = None,
               n_max: Optional[int] = None, logprobs: Union[bool, int, None] = None,
               timeout: Optional[float] = None, stop_token_ids: Sequence[int] = (),
               **options: Any) -> AsyncStream:
        """``async for piece in engine.stream(...)``: the options of :meth:`submit`; call it
        from a running event loop."""
        asyncio.get_running_loop()      # outside one: its RuntimeError, before any check
        return self._stream(self._core.request(
            prompt, max_tokens=max_tokens, sampling=sampling, stop=stop, drafter=drafter,
            n_max=n_max, logprobs=logprobs, timeout=timeout, stop_token_ids=stop_token_ids,
            **options))

    def arriving(self) -> Arrival:
        """Announce a request that is on its way (a server reading and checking its body,
        compiling its schema): until its ``done()``, an idle engine holds the first round of
        the requests already queued for it, up to ``ARRIVAL_WAIT_S``. Requests that arrive
        together then start together: one after another, the first decoded its prompt and a
        round alone and the others joined a round behind, so the wave ended with a round
        of fewer sequences (an extra decode, a large part of a short speculative answer).
        An engine with requests running never waits: they are not held up."""
        with self._cv:
            self._arriving += 1
        return Arrival(self)

    # --- OpenAI-shaped (llama-cpp-python's names) ----------------------------------------

    def _openai_call(self, kind: str, body: Dict[str, Any], chat_template: Optional[str]
                     ) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """``create_completion`` / ``create_chat_completion`` (:class:`CompletionMethods`),
        waited for in this thread; the ``n`` choices run together, and the body's
        ``specdec`` object picks a drafter and ``n_max``."""
        return engine_call(self, kind, body, chat_template)

    @overload
    async def acreate_completion(self, prompt: Union[str, Sequence[int]], *,
                                 stream: Literal[False] = False,
                                 **request: Any) -> Dict[str, Any]: ...

    @overload
    async def acreate_completion(self, prompt: Union[str, Sequence[int]], *,
                                 stream: Literal[True],
                                 **request: Any) -> AsyncIterator[Dict[str, Any]]: ...

    async def acreate_completion(self, prompt: Union[str, Sequence[int]], *,
                                 stream: bool = False, **request: Any
                                 ) -> Union[Dict[str, Any], AsyncIterator[Dict[str, Any]]]:
        """:meth:`create_completion` from asyncio (``stream=True``: an async iterator)."""
        return await engine_acall(self, "completion",
                                  dict(request, prompt=prompt, stream=stream), None)

    @overload
    async def acreate_chat_completion(self, messages: Sequence[Mapping[str, Any]], *,
                                      chat_template: Optional[str] = None,
                                      stream: Literal[False] = False,
                                      **request: Any) -> Dict[str, Any]: ...

    @overload
    async def acreate_chat_completion(self, messages: Sequence[Mapping[str, Any]], *,
                                      chat_template: Optional[str] = None,
                                      stream: Literal[True],
                                      **request: Any) -> AsyncIterator[Dict[str, Any]]: ...

    async def acreate_chat_completion(self, messages: Sequence[Mapping[str, Any]], *,
                                      chat_template: Optional[str] = None, stream: bool = False,
                                      **request: Any
                                      ) -> Union[Dict[str, Any], AsyncIterator[Dict[str, Any]]]:
        """:meth:`create_chat_completion` from asyncio."""
        return await engine_acall(self, "chat",
                                  dict(request, messages=list(messages), stream=stream),
                                  chat_template)

    # --- state --------------------------------------------------------------------------

    @property
    def n_running(self) -> int:
        return len(self._core.running)

    @property
    def n_queued(self) -> int:
        return len(self._queue)

    def stats(self) -> Dict[str, Any]:
        """Totals over the finished requests (for metrics), and the live queue."""
        return self._core.stats(queued=len(self._queue))

    def close(self) -> None:
        """Cancel what runs or waits, stop the worker and free the context. Closing twice is
        harmless."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify()
        if threading.current_thread() is self._worker:
            # called from a round (a Python drafter): the round still holds the context,
            # so the worker frees it when the round is over and its loop ends
            self._free_in_loop = True
            return
        self._worker.join()
        self._core.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Engine({self.model!r}, drafters={list(self.drafters) or ['plain']}, "
                f"n_slots={self.n_slots}, n_max={self.spec.n_max})")

    # --- the worker ---------------------------------------------------------------------

    def _loop(self) -> None:
        """Between rounds: hand the queue's requests to free slots, let cut-short ones go,
        put a chunk of a joining prompt in; then a round of the others."""
        core = self._core
        try:
            while True:
                with self._cv:
                    if not self._closed and not self._queue and not core.running:
                        # idle: the worker's OpenMP threads given back (``release_threads``)
                        # until the next request, so that they slow no other thread's decodes
                        release_threads()
                    while not self._closed and not self._queue and not core.running:
                        self._cv.wait()
                    if self._closed:
                        break
                    if not core.running and self._arriving:
                        # idle: the requests on their way start with these
                        until = time.monotonic() + ARRIVAL_WAIT_S
                        while (self._arriving and not self._closed
                               and len(self._queue) < self.n_slots):
                            left = until - time.monotonic()
                            if left <= 0:
                                break
                            self._cv.wait(left)
                        if self._closed:
                            break
                    joining: List[_State] = []
                    while self._queue and len(core.running) + len(joining) < self.n_slots:
                        joining.append(self._queue.popleft())
                core.drop_finished()
                for state in joining:
                    core.join(state)
                core.prefill_chunk()
                core.round()
        except BaseException as e:   # a bug in the engine itself: fail every request loudly
            _log.exception("specdec engine worker stopped")
            with self._cv:
                self._closed = True
            for state in list(core.running.values()):
                state.finish(exc=e)
            core.running.clear()
        with self._cv:
            pending = list(self._queue)
            self._queue.clear()
        core.end_all("cancelled")
        for state in pending:
            state.finish(exc=EngineClosed("the Engine was closed before the request finished"))
        if self._free_in_loop:
            core.close()
