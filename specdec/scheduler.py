"""The scheduler core: what happens to a request between its checks and its result, once.

:class:`~specdec.Decoder` drives it inline, on its caller's thread, for one caller at a time;
:class:`~specdec.Engine` drives it from its worker thread for many. Both used to load,
join, stream and count each their own way, so that a change to any of it (the round
included) had to be made twice; here each lives in one place:

- setup: the model, the drafters and the target context sized for the slots
  (:class:`Scheduler`'s constructor over :mod:`specdec._setup`);
- the request: one checked :class:`~specdec._request.Request`, the same record whether it
  came from Python keywords or from the server's wire format (:meth:`Scheduler.request`);
- the draft-length policies kept across requests (:meth:`Scheduler.policy`);
- the prompt cache and prefix reuse, a request joining a slot and leaving it
  (:meth:`join`, :meth:`end`);
- chunked prefill (:meth:`prefill_chunk`), the round and its pieces streamed out
  (:meth:`round`, :meth:`deliver`);
- each request's result and the totals over them (:meth:`stats`).

What differs between the doors is one flag, ``concurrent`` (see :class:`Scheduler`), and
who calls when: the Engine's worker interleaves queue hand-offs, joins, prefill chunks and
rounds; the Decoder joins its own requests with their prompts decoded at once, then runs
rounds until they end.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import replace
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple, Union

from ._controller import Controller, new_policy
from ._core import Context, Model, release_threads
from ._request import (Pieces, Prompt, Request, SamplingSpec, StopSpec, call_options,
                       result as read_result, tokenize)
from ._setup import (PLAIN, DrafterSpec, LazyLogits, PathLike, as_list, exact_slack,
                     load_model, make_context, make_drafters, needs_hidden_rows)
from .config import SpecConfig
from .constraint import Constraint
from .drafters import Drafter
from .handles import _State
from .placement import Placement
from .prompt_cache import PromptCache
from .results import GenerationResult, Stats

#: ``drafter=`` of a request: the front door's default drafters
DEFAULT = "default"


class Scheduler:
    """A target context's slots, the requests on them, and the rounds that run them.

    ``concurrent`` says who the slots serve. False (a Decoder): one caller, whose requests
    all draft with every drafter; the context of ``n_ctx`` tokens is shared by the
    ``n_seq`` sequences; a drafter's error is raised to the caller; a stream closed early
    keeps its KV for the caller's next prompt. True (an Engine): independent requests;
    each slot holds ``n_ctx`` tokens; a drafter's error ends its own request only; a
    request cut short frees its slot's KV, and a joining request takes the free slot that
    keeps most of its prompt.

    One thread drives it at a time (a Decoder under its lock, the Engine's worker); only
    :meth:`request` and :meth:`stats` may be called from other threads meanwhile.
    """

    def __init__(self, model: Union[Model, PathLike], drafters: List[DrafterSpec], *,
                 spec: SpecConfig, exact: bool, concurrent: bool, n_seq: int, n_ctx: int,
                 n_batch: int, n_ubatch: Optional[int], n_threads: Optional[int],
                 lazy_logits: LazyLogits, drafter_timeout: Optional[float],
                 on_drafter_error: str, n_gpu_layers_draft: Optional[int],
                 load_mtp: Optional[bool], model_check: str, placement: Placement,
                 prefix_reuse: bool, prompt_cache_mib: float, check: bool = False) -> None:
        self.spec = spec
        self.exact = exact
        self.concurrent = concurrent
        self.n_seq = n_seq
        self.model = load_model(model, drafters, exact=exact, placement=placement,
                                load_mtp=load_mtp, model_check=model_check)
        self.drafters: List[Drafter] = make_drafters(
            drafters, spec, drafter_timeout=drafter_timeout, on_drafter_error=on_drafter_error,
            n_gpu_layers_draft=n_gpu_layers_draft)
        hidden = needs_hidden_rows(self.drafters)
        # exact mode: room past each sequence's n_ctx for the padding rows of its last rounds
        slack = exact_slack(spec, exact)
        unified: Optional[bool] = None
        if concurrent:
            # One KV cache for all slots, each slot held to n_ctx tokens by the controller,
            # lets llama.cpp decode a verify batch in one ubatch whatever the rows per
            # sequence. Exact mode gives each slot a KV stream of its own instead: a
            # sequence's attention then reads its cells in the same order as when it runs
            # alone (in a shared cache other requests' rollbacks interleave them), and every
            # sequence gets the same rows (the ubatches split per stream), some padding rows
            # past its draft: room for them. An MTP drafter's own context mirrors the
            # target's per-sequence layout: streams too.
            unified = not exact and hidden is None
            total = (n_ctx + slack) * n_seq
        else:
            total = n_ctx + slack * n_seq
        self.ctx: Context = make_context(
            self.model, self.drafters, spec, n_ctx=total, n_batch=n_batch, n_ubatch=n_ubatch,
            n_threads=n_threads, n_seq_max=n_seq, exact=exact, lazy_logits=lazy_logits,
            kv_unified=unified)
        n_ctx_seq = n_ctx if concurrent else self.ctx.n_ctx_seq - slack
        if check:
            from ._checks import CheckedController
            self.ctl: Controller = CheckedController(self.ctx, self.drafters, check=True,
                                                     exact=exact, n_ctx_seq=n_ctx_seq)
        else:
            self.ctl = Controller(self.ctx, self.drafters, exact=exact, n_ctx_seq=n_ctx_seq,
                                  isolate=concurrent)
        #: the tokens one request may hold, prompt and generation
        self.n_ctx_seq: int = self.ctl.n_ctx_seq
        # a Decoder's requests all draft with every drafter: with one that reads the
        # target's hidden states (MTP) none can reuse a prefix, and none keeps its KV; an
        # Engine's slot may go to a request with other drafters, which can
        self.prefix_reuse = bool(prefix_reuse) and (concurrent or hidden is None)
        self.prompt_cache = PromptCache(prompt_cache_mib,
                                        recurrent=self.model.is_recurrent or self.model.is_hybrid)
        #: the drafters a request may name (an Engine's), and the chain of one that names none
        self.named: Dict[str, Drafter] = {}
        self.default: Tuple[Drafter, ...] = tuple(self.drafters)
        self._policies: Dict[Tuple[Tuple[Drafter, ...], int, bool], Any] = {}
        self.running: Dict[int, _State] = {}
        self._prefilling: Deque[int] = collections.deque()   # slots whose prompt is going in
        self._recent: List[int] = list(range(n_seq))   # slots, least recently used first
        self._pieces: Dict[int, Pieces] = {}
        self._lock = threading.Lock()                  # the totals, read by other threads
        self._totals: "collections.Counter[str]" = collections.Counter()
        self._drafted_at: List[int] = []
        self._accepted_at: List[int] = []
        # setup decoded on the caller's thread (warm-up, the LM heads timed); an Engine
        # decodes on its worker from now on: the caller's OpenMP threads given back, which
        # idle would make the worker's team sleep-wait for the Engine's life (``_omp_pool.h``)
        release_threads()

    # --- requests -------------------------------------------------------------------------

    def name_drafters(self, names: Sequence[str],
                      default: Union[str, Sequence[str], None]) -> Dict[str, Drafter]:
        """Give the drafters the names requests pick them by (``""``: the drafter's own
        name); ``default``: the chain of a request that names none (None: the first)."""
        named: Dict[str, Drafter] = {}
        for name, d in zip(names, self.drafters):
            name = name or d.name or type(d).__name__
            if name in named or name in (DEFAULT, PLAIN):
                raise ValueError(f"two drafters named {name!r}: pass a mapping of names")
            named[name] = d
        self.named = named
        self.default = self.chain(next(iter(named), PLAIN) if default is None else default)
        return named

    def chain(self, drafter: Union[str, Sequence[str], None]) -> Tuple[Drafter, ...]:
        """The drafters a request drafts with, from the names it gives (checked)."""
        if drafter is None or drafter == DEFAULT:
            return self.default
        if not isinstance(drafter, (str, list, tuple)):
            raise TypeError("drafter must be the name of one of this engine's drafters, a list "
                            f"of them, 'plain' or None; got {type(drafter).__name__}")
        names = as_list(drafter)        # "plain" (alone, or a list of it): none
        for name in names:
            if not isinstance(name, str) or name not in self.named:
                raise ValueError(f"unknown drafter {name!r}: this engine loaded "
                                 f"{sorted(self.named) or 'none'} (or {PLAIN!r})")
        return tuple(self.named[n] for n in names)

    def tokenize(self, prompt: Prompt) -> List[int]:
        return tokenize(self.model, prompt)

    def request(self, prompt: Prompt, *, max_tokens: Any, sampling: SamplingSpec = None,
                stop: StopSpec = (), logprobs: Any = None, stop_token_ids: Any = (),
                drafter: Union[str, Sequence[str], None] = None, n_max: Any = None,
                timeout: Any = None, **options: Any) -> Request:
        """One request, checked whole before it runs (``options``: sampling and constraint
        keywords): every front door, the server's included, builds its requests here, so
        that they are checked, and refused, alike. ``drafter``, ``n_max`` and ``timeout``
        as ``Engine.submit`` takes them."""
        sampling, constraint = call_options(sampling, options)
        req = Request.make(self.model, self.n_ctx_seq, prompt, max_tokens, sampling, stop,
                           logprobs, stop_token_ids, Constraint.of(constraint))
        chain = self.chain(drafter)
        cap = self.spec.n_max
        if n_max is None:
            n_max = cap
        if isinstance(n_max, bool) or not isinstance(n_max, int) or not 0 <= n_max <= cap:
            raise ValueError(f"n_max must be an int in [0, {cap}] (the engine's n_max), "
                             f"got {n_max!r}")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, (int, float)) or not timeout > 0):
            raise ValueError(f"timeout must be None or > 0 seconds, got {timeout!r}")
        return replace(req, drafters=chain, n_max=n_max if chain else 0,
                       deadline=time.monotonic() + timeout if timeout is not None else None)

    def policy(self, req: Request) -> Any:
        """The draft-length policy ``req`` drafts under: one per drafter chain, draft cap and
        verification kind (greedy and sampled verification accept differently), kept
        across requests so that what one measured serves the next."""
        key = (req.drafters, req.n_max, req.sampling.greedy)
        pol = self._policies.get(key)
        if pol is None:
            pol = self._policies[key] = new_policy(req.n_max, self.spec.adaptive)
        return pol

    # --- joining and leaving --------------------------------------------------------------

    def _pick_slot(self, prompt: List[int], reuse: bool) -> int:
        """The free slot of which a join of ``prompt`` keeps the most (else the least
        recently used one, so the others keep their prefixes for longer)."""
        free = [s for s in self._recent if s not in self.running]
        if not reuse:
            return free[0]
        best, best_n = free[0], 0
        for s in free:
            n = self.ctl.reusable(s, prompt)
            if n > best_n:
                best, best_n = s, n
        return best

    def join(self, state: _State, slot: Optional[int] = None, *, defer: bool = True) -> bool:
        """Start ``state``'s request on ``slot`` (None: the free slot that keeps most of its
        prompt). ``defer``: its prompt goes in by :meth:`prefill_chunk`, a chunk at a time
        between rounds, so that a long prompt does not stall the other streams; else now.
        False when it did not start: cut short before it ran, or failed (``state`` holds
        the outcome; an interrupt is raised too)."""
        req = state.req
        if state.cancelled or (req.deadline is not None and time.monotonic() >= req.deadline):
            # it never ran: an empty result, as for a request cut short before its first token
            reason = "cancelled" if state.cancelled else "timeout"
            res = GenerationResult(text="", tokens=[], finish_reason=reason, stats=Stats(
                n_prompt=len(req.prompt), n_generated=0, tokens_per_s=0.0,
                t_prompt_s=0.0, t_generate_s=0.0, n_prompt_decoded=0))
            self._count(res, state, reason)
            state.finish(res)
            return False
        reuse = self.prefix_reuse and needs_hidden_rows(req.drafters) is None
        if slot is None:
            slot = self._pick_slot(req.prompt, reuse)
        try:
            if reuse:
                self.prompt_cache.prepare(self.ctl, slot, req.prompt)
            state.n_decoded = self.ctl.join(
                slot, req.prompt, drafters=list(req.drafters), n_max=req.n_max,
                n_min=self.spec.n_min, policy=self.policy(req), reuse=reuse, defer=defer,
                **req.join_args())
        except BaseException as e:      # the controller has left the slot
            state.finish(exc=e)
            if not isinstance(e, Exception):
                raise
            return False
        state.slot = slot
        self._recent.remove(slot)
        self._recent.append(slot)
        self.running[slot] = state
        self._pieces[slot] = Pieces()
        if defer:
            self._prefilling.append(slot)
        else:
            self._prefilled(slot, state)
        return True

    def _prefilled(self, slot: int, state: _State) -> None:
        state.t_first = time.monotonic()
        self.deliver(slot, state)

    def prefill_chunk(self) -> None:
        """Up to one chunk (``n_batch`` tokens) of the deferred prompts, oldest first; each
        prompt's first token once it is all in.

        Several short prompts (a prompt cache leaves a few tokens of each) go in between the
        same two rounds, in one decode: requests that arrive together then decode their first
        round together, where one prompt per round ran the first rounds with 1, 2, 3 of 4
        sequences and left the tail as lopsided. A long prompt still takes one chunk at a
        time, so it does not stall the streams already running."""
        budget = self.ctx.n_batch
        while self._prefilling and budget > 0:
            # the prompts that fit in what is left of the chunk go in with one decode (its
            # fixed cost is several rows'); in exact mode one at a time, as each runs alone
            slots: List[int] = []
            left = 0
            for slot in self._prefilling:
                if left >= budget or (self.exact and slots):
                    break
                slots.append(slot)
                left += self.ctl.prompt_left(slot)
            try:
                done = self.ctl.prefill_together(slots, budget)
            except BaseException as e:      # the controller has left their slots
                for slot in slots:
                    self._prefilling.remove(slot)
                    state = self.running.pop(slot)
                    self._add("failed")
                    state.finish(exc=e)
                if not isinstance(e, Exception):
                    raise
                return
            budget -= max(left - sum(self.ctl.prompt_left(slot) for slot in slots), 1)
            for slot, in_ in zip(slots, done):
                if not in_:
                    return
                self._prefilling.popleft()
                self._prefilled(slot, self.running[slot])

    def end(self, slot: int, state: _State, reason: Optional[str]) -> None:
        """The request on ``slot`` leaves: finished (``reason`` None: its KV stays for a later
        prompt that starts with it), or cut short (``"cancelled"``, ``"timeout"``)."""
        if reason is not None and state.streams:
            piece = self._pieces[slot].next(self.ctl, slot, final=True)
            if piece.text or piece.tokens:
                state.put(piece)
        res = read_result(self.ctl, slot, reason)
        self.ctl.leave(slot, keep=self.prefix_reuse and (reason is None or not self.concurrent))
        del self.running[slot]
        if slot in self._prefilling:
            self._prefilling.remove(slot)
        self._count(res, state, reason)
        state.finish(res)

    def end_all(self, reason: str) -> None:
        for slot, state in list(self.running.items()):
            self.end(slot, state, reason)

    def drop_finished(self) -> None:
        """Cancelled, abandoned and timed-out requests leave (between rounds)."""
        now = time.monotonic()
        for slot, state in list(self.running.items()):
            if state.cancelled:
                self.end(slot, state, "cancelled")
            elif state.req.deadline is not None and now >= state.req.deadline:
                self.end(slot, state, "timeout")

    def _fail(self, slot: int, state: _State, exc: BaseException) -> None:
        """The request on ``slot`` failed (its memory may be mid-change: its KV goes); what
        it had is kept as ``state.partial``."""
        cut = None if self.ctl.finish_reason(slot) is not None else "cancelled"
        state.partial = read_result(self.ctl, slot, cut)
        self.ctl.leave(slot)
        del self.running[slot]
        self._add("failed")
        state.finish(exc=exc)

    # --- rounds ---------------------------------------------------------------------------

    def round(self) -> None:
        """One verify round of every running request whose prompt is in, and their pieces.
        A failed round fails its requests (an interrupt is raised as well); the others,
        and the scheduler, go on."""
        decoding = [(slot, state) for slot, state in self.running.items()
                    if slot not in self._prefilling]
        if not decoding:
            return
        try:
            self.ctl.step()
        except BaseException as e:
            for slot, state in decoding:
                self._fail(slot, state, e)
            if not isinstance(e, Exception):
                raise
            return
        for slot, state in decoding:
            self.deliver(slot, state)

    def deliver(self, slot: int, state: _State) -> None:
        """What the last round (or the prompt pass) gave ``slot``'s request, to its reader;
        its end once it finished."""
        err = self.ctl.error(slot)
        if err is not None:     # its drafter failed while drafting: the others go on
            self._fail(slot, state, err)
            return
        done = self.ctl.finish_reason(slot) is not None
        grammar = state.req.grammar
        if done and grammar is not None and grammar.error is not None:
            # llguidance failed mid-output (a lexer or parser limit): the end of text it then
            # allows alone ended the request, and its text does not match the constraint
            self._fail(slot, state, ValueError(
                f"constrained output failed after {len(self.ctl.tokens(slot))} tokens: "
                f"{grammar.error}"))
            return
        if state.streams:
            piece = self._pieces[slot].next(self.ctl, slot, final=done)
            if piece.text or piece.tokens:
                state.put(piece)
        if done:
            self.end(slot, state, None)

    @property
    def n_decoding(self) -> int:
        return len(self.running) - len(self._prefilling)

    # --- totals ---------------------------------------------------------------------------

    def _add(self, name: str) -> None:
        with self._lock:
            self._totals[name] += 1

    def _count(self, res: GenerationResult, state: _State, reason: Optional[str]) -> None:
        st: Stats = res.stats
        with self._lock:
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

    def stats(self, queued: int = 0) -> Dict[str, Any]:
        """Totals over the requests that ended (cut short or not), and the live counts."""
        with self._lock:
            t = dict(self._totals)
            return {"requests": t.get("requests", 0), "cancelled": t.get("cancelled", 0),
                    "timeouts": t.get("timeouts", 0), "failed": t.get("failed", 0),
                    "n_prompt": t.get("n_prompt", 0), "n_prompt_decoded": t.get("n_decoded", 0),
                    "n_generated": t.get("n_generated", 0), "drafted": t.get("drafted", 0),
                    "accepted": t.get("accepted", 0),
                    "drafted_per_position": list(self._drafted_at),
                    "accepted_per_position": list(self._accepted_at),
                    "rounds": self.ctl.stats()["rounds"],
                    "prompt_cache": self.prompt_cache.stats(),
                    "running": len(self.running), "queued": queued,
                    "slots": self.n_seq}

    def close(self) -> None:
        """Free the drafters, the context and the cached prompts (nothing may run)."""
        for d in self.drafters:
            d.close()
        self.drafters = []
        self._policies.clear()
        self.ctx.close()
        self.prompt_cache.clear()


class Driver:
    """What a front door shows of the core it drives: the same read-only attributes on a
    Decoder and an Engine, each read from the core, so that each has one home."""

    _core: Scheduler

    @property
    def model(self) -> Model:
        """The target model."""
        return self._core.model

    @property
    def ctx(self) -> Context:
        """The target's llama.cpp context."""
        return self._core.ctx

    @property
    def spec(self) -> SpecConfig:
        """The draft settings (``n_max``, ``n_min``, ``p_min``, ``adaptive``)."""
        return self._core.spec

    @property
    def exact(self) -> bool:
        return self._core.exact

    @property
    def prefix_reuse(self) -> bool:
        return self._core.prefix_reuse

    @property
    def prompt_cache(self) -> PromptCache:
        return self._core.prompt_cache

    def tokenize(self, prompt: Prompt) -> List[int]:
        return self._core.tokenize(prompt)
