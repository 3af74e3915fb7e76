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
the running requests between chunks: a long prompt does not stall the other streams.

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
                    Sequence, Tuple, Union, overload)

from ._controller import Controller, new_policy
from ._core import Model
from ._request import Pieces, Prompt, Request, SamplingSpec, StopSpec, result as _result, tokenize
from ._setup import (DrafterSpec, PathLike, as_list, exact_slack, load_model, make_context,
                     make_drafters, needs_hidden_rows)
from .config import Sampling, SpecConfig
from .constraint import Constraint, take_options
from .drafters import Drafter
from .handles import AsyncStream, RequestHandle, _State
from .openai_face import CompletionMethods, engine_acall, engine_call
from .placement import Placement
from .prompt_cache import DEFAULT_MIB, PromptCache
from .results import GenerationResult, Stats

_log = logging.getLogger("specdec")

#: ``drafter=`` of a request: the engine's default drafter
DEFAULT = "default"
#: ``drafter=`` of a request: no drafter (plain decoding)
PLAIN = "plain"


class EngineClosed(RuntimeError):
    """The engine was closed: it takes no more requests."""


#: engines whose worker may still run: closed at exit, before the interpreter tears down what
#: a worker in the middle of a round still uses
_live: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for eng in list(_live):
        eng.close()


class Engine(CompletionMethods):
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
        lazy_logits: Optional[bool] = None,
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
        self.spec = SpecConfig(n_max=n_max, n_min=n_min, p_min=p_min, adaptive=adaptive)
        self.exact = bool(exact)
        if isinstance(drafters, Mapping):
            names = [str(k) for k in drafters]
            specs = list(drafters.values())
        else:
            specs = as_list(drafters)
            names = [s if isinstance(s, str) else "" for s in specs]
        placement = Placement.make(n_gpu_layers, split_mode, main_gpu, tensor_split, rpc_servers)
        self.model = load_model(model, specs, exact=self.exact, placement=placement,
                                load_mtp=load_mtp, model_check=model_check)
        loaded = make_drafters(specs, self.spec, drafter_timeout=drafter_timeout,
                               on_drafter_error=on_drafter_error, n_gpu_layers_draft=None)
        self.drafters: Dict[str, Drafter] = {}
        for name, d in zip(names, loaded):
            name = name or d.name or type(d).__name__
            if name in self.drafters or name in (DEFAULT, PLAIN):
                raise ValueError(f"two drafters named {name!r}: pass a mapping of names")
            self.drafters[name] = d
        self.n_slots = n_slots
        self.n_ctx = n_ctx
        # One KV cache for all slots, each slot held to n_ctx tokens by the controller, lets
        # llama.cpp decode a verify batch in one ubatch whatever the rows per sequence. Exact
        # mode gives each slot a KV stream of its own instead: a sequence's attention then
        # reads its cells in the same order as when it runs alone (in a shared cache other
        # requests' rollbacks interleave them), and every sequence gets the same rows (the
        # ubatches split per stream), some padding rows past its draft: room for them.
        # An MTP drafter's own context mirrors the target's per-sequence layout: streams too.
        unified = not self.exact and needs_hidden_rows(loaded) is None
        slack = exact_slack(self.spec, self.exact)
        self.ctx = make_context(self.model, loaded, self.spec, n_ctx=(n_ctx + slack) * n_slots,
                                n_batch=n_batch, n_ubatch=None, n_threads=n_threads,
                                n_seq_max=n_slots, exact=self.exact, lazy_logits=lazy_logits,
                                kv_unified=unified)
        self._ctl = Controller(self.ctx, loaded, exact=self.exact, n_ctx_seq=n_ctx, isolate=True)
        self.prefix_reuse = bool(prefix_reuse)
        self.prompt_cache = PromptCache(prompt_cache_mib,
                                        recurrent=self.model.is_recurrent or self.model.is_hybrid)
        self._default = self._chain(self._first_default(default_drafter))
        self._policies: Dict[Tuple[Tuple[str, ...], int, bool], Any] = {}
        self._cv = threading.Condition()
        self._queue: Deque[_State] = collections.deque()
        self._running: Dict[int, _State] = {}
        self._prefilling: Deque[int] = collections.deque()   # slots whose prompt is going in
        self._recent: List[int] = list(range(n_slots))   # free slots, least recently used first
        self._pieces: Dict[int, Pieces] = {}
        self._closed = False
        self._totals: "collections.Counter[str]" = collections.Counter()
        self._drafted_at: List[int] = []
        self._accepted_at: List[int] = []
        self._worker = threading.Thread(target=self._loop, name="specdec-engine", daemon=True)
        self._worker.start()
        _live.add(self)

    def _first_default(self, default: Union[str, Sequence[str], None]) -> Union[str, Sequence[str]]:
        if default is not None:
            return default
        return next(iter(self.drafters), PLAIN)

    def _chain(self, drafter: Union[str, Sequence[str], None]) -> Tuple[str, ...]:
        """The drafter names a request drafts with (checked)."""
        if drafter is None or drafter == DEFAULT:
            return self._default
        if drafter == PLAIN:
            return ()
        chain = (drafter,) if isinstance(drafter, str) else tuple(drafter)
        for name in chain:
            if not isinstance(name, str) or name not in self.drafters:
                raise ValueError(f"unknown drafter {name!r}: this engine loaded "
                                 f"{sorted(self.drafters) or 'none'} (or {PLAIN!r})")
        return chain

    # --- submitting ---------------------------------------------------------------------

    def tokenize(self, prompt: Prompt) -> List[int]:
        return tokenize(self.model, prompt)

    def _make(self, prompt: Prompt, max_tokens: int, sampling: SamplingSpec, stop: StopSpec,
              drafter: Union[str, Sequence[str], None], n_max: Optional[int],
              logprobs: Any, timeout: Optional[float], stop_token_ids: Any,
              loop: Optional[asyncio.AbstractEventLoop], constraint: Dict[str, Any]) -> _State:
        req = Request.make(self.model, self.n_ctx, prompt, max_tokens, sampling, stop, logprobs,
                           stop_token_ids, Constraint.of(constraint))
        chain = self._chain(drafter)
        if n_max is None:
            n_max = self.spec.n_max
        if isinstance(n_max, bool) or not isinstance(n_max, int) or not 0 <= n_max <= self.spec.n_max:
            raise ValueError(f"n_max must be an int in [0, {self.spec.n_max}] (the engine's "
                             f"n_max), got {n_max!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be None or > 0 seconds, got {timeout!r}")
        deadline = time.monotonic() + timeout if timeout is not None else None
        return _State(req, chain, n_max if chain else 0, deadline, loop)

    def _enqueue(self, state: _State) -> None:
        with self._cv:
            if self._closed:
                raise EngineClosed("this Engine is closed")
            self._queue.append(state)
            self._cv.notify()

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
        con = take_options(options)
        state = self._make(prompt, max_tokens, Sampling.resolve(sampling, **options),
                           stop, drafter, n_max, logprobs, timeout, stop_token_ids, None, con)
        self._enqueue(state)
        return RequestHandle(state)

    async def generate(self, prompt: Prompt, *, max_tokens: int = 128,
                       sampling: SamplingSpec = None, stop: StopSpec = (),
                       drafter: Union[str, Sequence[str], None] = None,
                       n_max: Optional[int] = None, logprobs: Union[bool, int, None] = None,
                       timeout: Optional[float] = None, stop_token_ids: Sequence[int] = (),
                       **options: Any) -> GenerationResult:
        """``await engine.generate(...)``: the options of :meth:`submit`. Cancelling the
        awaiting task cancels the request."""
        con = take_options(options)
        state = self._make(prompt, max_tokens, Sampling.resolve(sampling, **options),
                           stop, drafter, n_max, logprobs, timeout, stop_token_ids, None, con)
        self._enqueue(state)
        try:
            return await asyncio.wrap_future(state.future)
        except asyncio.CancelledError:
            state.cancel()
            raise

    def stream(self, prompt: Prompt, *, max_tokens: int = 128, sampling: SamplingSpec = None,
               stop: StopSpec = (), drafter: Union[str, Sequence[str], None] = None,
               n_max: Optional[int] = None, logprobs: Union[bool, int, None] = None,
               timeout: Optional[float] = None, stop_token_ids: Sequence[int] = (),
               **options: Any) -> AsyncStream:
        """``async for piece in engine.stream(...)``: the options of :meth:`submit`; call it
        from a running event loop."""
        loop = asyncio.get_running_loop()
        con = take_options(options)
        state = self._make(prompt, max_tokens, Sampling.resolve(sampling, **options),
                           stop, drafter, n_max, logprobs, timeout, stop_token_ids, loop, con)
        self._enqueue(state)
        return AsyncStream(state)

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
        return len(self._running)

    @property
    def n_queued(self) -> int:
        return len(self._queue)

    def stats(self) -> Dict[str, Any]:
        """Totals over the finished requests (for metrics), and the live queue."""
        with self._cv:
            t = dict(self._totals)
            return {"requests": t.get("requests", 0), "cancelled": t.get("cancelled", 0),
                    "timeouts": t.get("timeouts", 0), "failed": t.get("failed", 0),
                    "n_prompt": t.get("n_prompt", 0), "n_prompt_decoded": t.get("n_decoded", 0),
                    "n_generated": t.get("n_generated", 0), "drafted": t.get("drafted", 0),
                    "accepted": t.get("accepted", 0),
                    "drafted_per_position": list(self._drafted_at),
                    "accepted_per_position": list(self._accepted_at),
                    "rounds": self._ctl.stats()["rounds"],
                    "prompt_cache": self.prompt_cache.stats(),
                    "running": len(self._running), "queued": len(self._queue),
                    "slots": self.n_slots}

    def close(self) -> None:
        """Cancel what runs or waits, stop the worker and free the context. Closing twice is
        harmless."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify()
        if threading.current_thread() is not self._worker:
            self._worker.join()
        for d in self.drafters.values():
            d.close()
        self.ctx.close()
        self.prompt_cache.clear()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Engine({self.model!r}, drafters={list(self.drafters) or ['plain']}, "
                f"n_slots={self.n_slots}, n_max={self.spec.n_max})")

    # --- the worker ---------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._closed and not self._queue and not self._running:
                        self._cv.wait()
                    if self._closed:
                        break
                    joining: List[_State] = []
                    while self._queue and len(self._running) + len(joining) < self.n_slots:
                        joining.append(self._queue.popleft())
                self._drop_finished()
                for state in joining:
                    self._join(state)
                self._prefill_chunk()
                if len(self._running) > len(self._prefilling):
                    self._round()
        except BaseException as e:   # a bug in the engine itself: fail every request loudly
            _log.exception("specdec engine worker stopped")
            with self._cv:
                self._closed = True
            for state in list(self._running.values()):
                state.finish(exc=e)
            self._running.clear()
        with self._cv:
            pending = list(self._queue)
            self._queue.clear()
        for slot, state in list(self._running.items()):
            self._end(slot, state, "cancelled")
        for state in pending:
            state.finish(exc=EngineClosed("the Engine was closed before the request finished"))

    def _drop_finished(self) -> None:
        """Cancelled, abandoned and timed-out requests leave (between rounds)."""
        now = time.monotonic()
        for slot, state in list(self._running.items()):
            if state.cancelled:
                self._end(slot, state, "cancelled")
            elif state.deadline is not None and now >= state.deadline:
                self._end(slot, state, "timeout")

    def _pick_slot(self, prompt: List[int], reuse: bool) -> int:
        """The free slot of which a join of ``prompt`` keeps the most (else the least
        recently used one, so the others keep their prefixes for longer)."""
        free = [s for s in self._recent if s not in self._running]
        if not reuse:
            return free[0]
        best, best_n = free[0], 0
        for s in free:
            n = self._ctl.reusable(s, prompt)
            if n > best_n:
                best, best_n = s, n
        return best

    def _policy(self, state: _State) -> Any:
        key = (state.chain, state.n_max, state.req.sampling.greedy)
        pol = self._policies.get(key)
        if pol is None:
            pol = self._policies[key] = new_policy(state.n_max, self.spec.adaptive)
        return pol

    def _join(self, state: _State) -> None:
        if state.cancelled or (state.deadline is not None and time.monotonic() >= state.deadline):
            # it never ran: an empty result, as for a request cut short before its first token
            reason = "cancelled" if state.cancelled else "timeout"
            res = GenerationResult(text="", tokens=[], finish_reason=reason, stats=Stats(
                n_prompt=len(state.req.prompt), n_generated=0, tokens_per_s=0.0,
                t_prompt_s=0.0, t_generate_s=0.0, n_prompt_decoded=0))
            self._count(res, state, reason)
            state.finish(res)
            return
        drafters = [self.drafters[n] for n in state.chain]
        reuse = self.prefix_reuse and needs_hidden_rows(drafters) is None
        slot = self._pick_slot(state.req.prompt, reuse)
        try:
            if reuse:
                self.prompt_cache.prepare(self._ctl, slot, state.req.prompt)
            state.n_decoded = self._ctl.join(
                slot, state.req.prompt, drafters=drafters, n_max=state.n_max,
                n_min=self.spec.n_min, policy=self._policy(state), reuse=reuse,
                defer=True, **state.req.join_args())
        except Exception as e:
            state.finish(exc=e)
            return
        state.slot = slot
        self._recent.remove(slot)
        self._recent.append(slot)
        self._running[slot] = state
        self._pieces[slot] = Pieces()
        self._prefilling.append(slot)

    def _prefill_chunk(self) -> None:
        """The next chunk of the first joining prompt; its first token once it is all in."""
        if not self._prefilling:
            return
        slot = self._prefilling[0]
        state = self._running[slot]
        try:
            done = self._ctl.prefill(slot)
        except Exception as e:      # the controller has left the slot
            self._prefilling.popleft()
            del self._running[slot]
            with self._cv:
                self._totals["failed"] += 1
            state.finish(exc=e)
            return
        if done:
            self._prefilling.popleft()
            state.t_first = time.monotonic()
            self._deliver(slot, state)

    def _round(self) -> None:
        decoding = [(slot, state) for slot, state in self._running.items()
                    if slot not in self._prefilling]
        try:
            self._ctl.step()
        except Exception as e:
            # a decode failed, or a drafter after it: the round's requests fail (their memory
            # may be mid-change), the engine goes on
            for slot, state in decoding:
                self._fail(slot, state, e)
            return
        for slot, state in decoding:
            self._deliver(slot, state)

    def _fail(self, slot: int, state: _State, exc: BaseException) -> None:
        self._ctl.leave(slot)
        del self._running[slot]
        with self._cv:
            self._totals["failed"] += 1
        state.finish(exc=exc)

    def _deliver(self, slot: int, state: _State) -> None:
        err = self._ctl.error(slot)
        if err is not None:     # its drafter failed while drafting: the others go on
            self._fail(slot, state, err)
            return
        done = self._ctl.finish_reason(slot) is not None
        piece = self._pieces[slot].next(self._ctl, slot, final=done)
        if piece.text or piece.tokens:
            state.put(piece)
        if done:
            self._end(slot, state, None)

    def _end(self, slot: int, state: _State, reason: Optional[str]) -> None:
        """The request on ``slot`` leaves: finished (``reason`` None: keep its KV for reuse),
        cancelled or timed out (its KV is freed)."""
        if reason is not None:
            piece = self._pieces[slot].next(self._ctl, slot, final=True)
            if piece.text or piece.tokens:
                state.put(piece)
        res = _result(self._ctl, slot, reason)
        self._ctl.leave(slot, keep=reason is None and self.prefix_reuse)
        del self._running[slot]
        if slot in self._prefilling:
            self._prefilling.remove(slot)
        self._count(res, state, reason)
        state.finish(res)

    def _count(self, res: GenerationResult, state: _State, reason: Optional[str]) -> None:
        st: Stats = res.stats
        with self._cv:
            t = self._totals
            t["requests"] += 1
            t["cancelled"] += reason == "cancelled"
            t["timeouts"] += reason == "timeout"
            t["n_prompt"] += st.n_prompt
            t["n_decoded"] += state.n_decoded
            t["n_generated"] += st.n_generated
            t["drafted"] += st.drafted
            t["accepted"] += st.accepted
            for acc, per in ((self._drafted_at, st.drafted_per_position),
                             (self._accepted_at, st.accepted_per_position)):
                if len(acc) < len(per):
                    acc.extend([0] * (len(per) - len(acc)))
                for i, v in enumerate(per):
                    acc[i] += v
