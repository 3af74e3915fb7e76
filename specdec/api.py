"""The Python API: a reusable decoder, and ``generate`` / ``stream`` shortcuts."""
from __future__ import annotations

import logging
import threading
import weakref
from typing import (Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import numpy as np

from ._core import ContextBusyError, Model, release_threads
from ._request import (Prompt, Request, SamplingSpec, StopSpec, call_options,
                       split_chat_options, stop_list)
from ._setup import DrafterSpec, LazyLogits, PathLike, as_list
from .chat import ChatPrompt, chat_prompt
from .config import SAMPLING_OPTIONS, Sampling, SpecConfig
from .constraint import take_options
from .drafters import Drafter
from .handles import _State
from .openai_face import CompletionMethods, decoder_call
from .placement import Placement
from .results import GenerationResult, Piece, Stats
from .scheduler import Driver, Scheduler

_log = logging.getLogger("specdec")
#: drafting rounds a fixed-length drafter gets before it is judged (see ``Decoder._judge``)
JUDGE_ROUNDS = 16


class Decoder(Driver, CompletionMethods):
    """A model, its context and its drafters, kept across calls.

    Parameters
    ----------
    model
        A GGUF path (``specdec.default_model_path()`` gives the default model) or a
        loaded :class:`Model`.
    drafter
        A name (``"ngram"``, ``"ngram:4"``, ``"draft:PATH"``; ``specdec drafters`` lists
        them with their arguments), a :class:`Drafter` instance or subclass, an object
        with ``propose``, or a list of them tried in order (a chain). None or ``"plain"``: plain decoding.
    n_max
        The longest draft verified in one round (the verify batch holds ``n_max + 1`` rows
        per sequence). With ``adaptive=True`` it is the upper bound of the chosen length.
    n_min
        Drafts shorter than this are dropped (the round decodes plainly).
    p_min
        Probabilistic drafters (draft models, layer-skip, MTP, suffix) stop a draft where
        their own probability falls below it; a drafter given its own ``p_min`` keeps it
        (``Drafter.configure``).
    adaptive
        Choose each round's draft length from measured acceptance per position and
        measured verify and drafting costs; stop asking a drafter that does not pay.
    exact
        Greedy speculative output equal to exact plain output token for token: the
        target is loaded without repacked weight layouts, its context computes every row
        with batch-invariant CPU kernels (``Context(batch_invariant=True)``) and no decode
        is ever a single row, so a row's logits do not depend on the draft length.
    n_ctx
        Context size in tokens (prompt plus generation, shared by the ``n_seq_max``
        sequences); a sequence that fills it stops with ``finish_reason="context"``.
    n_batch, n_ubatch, n_threads
        llama.cpp's logical and physical batch sizes and its thread count.
    n_seq_max
        Sequences ``generate_batch`` can verify together in one batch per round.
    load_mtp
        Load the target's MTP layers (default: when an ``mtp`` drafter asks for them).
    check
        Re-check every emitted greedy token against an independent argmax of its verify
        row, raising ``AssertionError`` on a mismatch (slow; for tests and debugging).
    drafter_timeout, on_drafter_error
        Python drafters are plugins and may misbehave: ``drafter_timeout`` (seconds) runs
        each of their hooks with a deadline, and ``on_drafter_error="disable"`` turns a
        raised error or a garbage draft into plain rounds instead of a ``DrafterError``;
        either fault switches that drafter off for the rest of the request, with a
        ``DrafterFaultWarning`` (see ``specdec.drafters.guard``).
    lazy_logits
        The lazy LM head: each decode stops at the final norm and a row's logits are
        computed only when verification reaches it, all rows of a pass sharing one read of
        the LM head, so a rejected draft no longer pays for the vocabulary projection of
        the rows after it. Each row's logits are bit-identical to a one-row LM head's for
        the same hidden state (``specdec/_lm_head.h``). It can run on every target, except
        one that feeds MTP hidden states on an arch outside ``LAZY_MTP_ARCHS``; batches of
        one sequence, or of several in one KV stream of an attention-only target, as the
        Engine's. ``"auto"`` (the default; None says the same): where it can run, the
        lazy head or llama.cpp's own, whichever measures faster for this model on this
        CPU with these threads (timed at the first load, then read from the cache dir:
        :mod:`specdec.head_choice`). True or False: on or off, unmeasured.
    model_check
        ``"fast"`` (default) or ``"isolated"``: when ``model`` is a path, ``"isolated"``
        tries the file in a child process before loading it here (``specdec.check_model``),
        for files from untrusted sources.

    n_gpu_layers, split_mode, main_gpu, tensor_split, rpc_servers, n_gpu_layers_draft
        Placement, with llama.cpp's names, when the Decoder loads the model:
        ``n_gpu_layers`` (-1: all), ``rpc_servers`` (``"host:port,..."`` of
        ``specdec rpc-server`` machines); ``n_gpu_layers_draft`` places a drafter's own model (draft model, MTP head), which
        otherwise follows the target. With layers offloaded ``lazy_logits`` defaults to off:
        the output layer goes to the device first, and the lazy head reads host memory.

    prefix_reuse
        A prompt that starts with tokens of the previous request on the same sequence
        (the previous turn of a chat, a shared system prompt) keeps their KV and decodes
        only the rest (recurrent/hybrid targets: only when it extends the whole previous
        sequence). Off for drafters that read the target's hidden states (MTP).
    prompt_cache_mib
        Host memory (MiB) for the KV of earlier prompts (0, the default: none): a prompt
        that comes back after others restores it instead of decoding it again (see
        :mod:`specdec.prompt_cache`; the Engine has one by default).

    ``close()`` frees the llama.cpp context now rather than at garbage collection, and
    ``with Decoder(...) as dec:`` closes it at the end of the block.
    """

    def __init__(
        self,
        model: Union[Model, PathLike],
        *,
        drafter: Union[DrafterSpec, Sequence[DrafterSpec], None] = None,
        n_max: int = 4,
        n_min: int = 0,
        p_min: float = 0.0,
        adaptive: bool = False,
        exact: bool = False,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_ubatch: Optional[int] = None,
        n_threads: Optional[int] = None,
        n_seq_max: int = 1,
        load_mtp: Optional[bool] = None,
        check: bool = False,
        drafter_timeout: Optional[float] = None,
        on_drafter_error: str = "raise",
        lazy_logits: LazyLogits = "auto",
        n_gpu_layers: int = 0,
        split_mode: Union[str, int] = "layer",
        main_gpu: int = 0,
        tensor_split: Optional[Sequence[float]] = None,
        rpc_servers: Union[str, Sequence[str], None] = None,
        n_gpu_layers_draft: Optional[int] = None,
        model_check: str = "fast",
        prefix_reuse: bool = True,
        prompt_cache_mib: float = 0,
    ) -> None:
        self.check = bool(check)
        self._core = Scheduler(
            model, as_list(drafter),
            spec=SpecConfig(n_max=n_max, n_min=n_min, p_min=p_min, adaptive=adaptive),
            exact=bool(exact), concurrent=False, n_seq=n_seq_max, n_ctx=n_ctx, n_batch=n_batch,
            n_ubatch=n_ubatch, n_threads=n_threads, lazy_logits=lazy_logits,
            drafter_timeout=drafter_timeout, on_drafter_error=on_drafter_error,
            n_gpu_layers_draft=n_gpu_layers_draft, load_mtp=load_mtp, model_check=model_check,
            placement=Placement.make(n_gpu_layers, split_mode, main_gpu, tensor_split,
                                     rpc_servers),
            prefix_reuse=prefix_reuse, prompt_cache_mib=prompt_cache_mib, check=self.check)
        self._lock = threading.Lock()
        self._stream: Optional["weakref.ref[Stream]"] = None
        self._closed = False
        self._judged = self.spec.adaptive or not self.drafters

    @property
    def drafters(self) -> List[Drafter]:
        """The drafters, tried in order each round (none once closed)."""
        return self._core.drafters

    def _judge(self, st: Stats) -> None:
        """Warn once when fixed-length drafting has cost more than it gained.

        Judged on the first request with ``JUDGE_ROUNDS`` drafting rounds: its gain is the
        accepted tokens, each worth a round of the target (decode and LM head), its cost the
        time spent drafting and verifying. The extra verify rows are left out of the cost,
        so a drafter warned about loses for sure.
        """
        if self._judged or st.draft_rounds < JUDGE_ROUNDS or not st.rounds:
            return
        self._judged = True
        gain = st.accepted * (st.t_target_s + st.t_lm_head_s) / st.rounds
        cost = st.t_draft_s + st.t_verify_s
        if cost > gain:
            names = "+".join(d.name or type(d).__name__ for d in self.drafters)
            _log.warning("drafter %s cost more than it gained over %d rounds (%.0f ms drafting and "
                         "verifying for %d accepted tokens, worth ~%.0f ms of the target): "
                         "Decoder(..., adaptive=True) drafts only when it pays",
                         names, st.draft_rounds, cost * 1e3, st.accepted, gain * 1e3)

    def close(self) -> None:
        """Free the target's llama.cpp context and the drafters' now; the decoder cannot
        generate afterwards. Closing twice is harmless."""
        if self._closed:
            return
        self._acquire()
        try:
            self._core.close()
            self._closed = True
        finally:
            self._lock.release()

    def __enter__(self) -> "Decoder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        names = [d.name for d in self.drafters] or ["plain"]
        return f"Decoder({self.model!r}, drafters={names}, n_max={self.spec.n_max})"

    # --- driving the core, one caller at a time -------------------------------------------

    def _acquire(self) -> None:
        if self._closed:
            raise RuntimeError("this Decoder is closed")
        if self._lock.acquire(blocking=False):
            return
        # a stream this thread left unfinished (abandoned, or cut by Ctrl-C between pieces)
        # is closed by the thread's next call; another thread's stream, or one in the middle
        # of a piece (the call comes from a drafter within its round), is never touched
        st = self._stream() if self._stream is not None else None
        if st is not None and st._owner == threading.get_ident() and st._close_idle():
            if self._lock.acquire(blocking=False):
                return
        raise ContextBusyError("this Decoder is in use by another thread; use one Decoder per "
                               "thread")

    def _release(self) -> None:
        """A call is over: the decoder is free again, and the calling thread, done decoding
        for now, gives back its OpenMP workers (``release_threads``: an idle thread's pool
        makes the decodes of the process's other threads, an Engine's, sleep-wait)."""
        self._lock.release()
        release_threads()

    def _start(self, reqs: List[Request], streams: bool) -> List[_State]:
        """Join ``reqs`` on sequences 0..n-1 with their prompts decoded now (the caller
        waits for them anyway); a failed join ends the others and raises."""
        core = self._core
        core.end_all("cancelled")     # what an interrupted call left joined
        states = [_State(r, streams=streams) for r in reqs]
        for i, st in enumerate(states):
            if not core.join(st, i, defer=False):
                core.end_all("cancelled")
                self._outcome(st)
        return states

    def _outcome(self, st: _State) -> GenerationResult:
        """The result of a request that ended, or what it failed with raised."""
        exc = st.future.exception()
        if exc is not None:
            raise exc
        res = st.future.result()
        if st.slot == 0:
            self._judge(res.stats)
        return res

    def _run(self, reqs: List[Request]) -> List[GenerationResult]:
        """Run ``reqs`` together to their ends, a round at a time from Python: the
        interpreter checks for Ctrl-C between rounds (a loop inside compiled code would
        not see the signal until the requests end)."""
        self._acquire()
        try:
            states = self._start(reqs, streams=False)
            while self._core.running:
                self._core.round()
            return [self._outcome(st) for st in states]
        finally:
            self._release()

    def _open(self, req: Request) -> "Stream":
        """``req`` streamed: the decoder stays taken until the stream ends or is closed."""
        self._acquire()
        try:
            st = Stream(self, self._start([req], streams=True)[0])
        except BaseException:
            self._release()
            raise
        self._stream = weakref.ref(st)
        return st

    # --- public ------------------------------------------------------------------------

    def generate(self, prompt: Prompt, *, max_tokens: int = 128, sampling: SamplingSpec = None,
                 stop: StopSpec = (), logprobs: Union[bool, int, None] = None,
                 stop_token_ids: Sequence[int] = (), **options: Any
                 ) -> GenerationResult:
        """Generate up to ``max_tokens`` tokens after ``prompt`` (text or token ids).

        ``stop``: strings that end the text (left out of it); ``stop_token_ids``: tokens
        that end it as the model's end-of-generation tokens do (a control token such as a
        chat turn's end, whose text is empty). Either finishes with ``"stop"``.
        ``logprobs``: True for each token's log-probability, an int k for the k best
        alternatives too (``GenerationResult.logprobs``).

        ``sampling``: a :class:`Sampling` (or a dict of its fields); or, instead, its fields
        as keywords (``config.SAMPLING_OPTIONS``: ``temperature``, ``top_k``, ``top_p``,
        ``min_p``, ``seed``, the penalties, ``logit_bias``). Giving both is a ``ValueError``.
        The constraint keywords say what the text must match, one of ``grammar=`` (GBNF),
        ``json_schema=`` (a dict or a pydantic model class), ``regex=``, ``choices=[...]``,
        ``lark=`` (:class:`specdec.Constraint`)."""
        return self._run([self._core.request(
            prompt, max_tokens=max_tokens, sampling=sampling, stop=stop, logprobs=logprobs,
            stop_token_ids=stop_token_ids, **options)])[0]

    def generate_batch(self, prompts: Sequence[Prompt], *, max_tokens: int = 128,
                       sampling: SamplingSpec = None, stop: StopSpec = (),
                       logprobs: Union[bool, int, None] = None,
                       stop_token_ids: Sequence[int] = (), **options: Any
                       ) -> List[GenerationResult]:
        """Several prompts at once, verified together in one batch per round (a seeded
        ``sampling`` gives prompt i the seed ``seed + i``); options as for :meth:`generate`."""
        s, constraint = call_options(sampling, options)
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Iterable):
            # a text is not a list of one-character prompts
            raise TypeError("generate_batch takes a list of prompts (texts or lists of token "
                            f"ids), got {type(prompts).__name__}; for one prompt use generate()")
        prompts = list(prompts)
        if not prompts:
            raise ValueError("no prompts")
        if any(isinstance(p, (int, np.integer)) for p in prompts):
            raise TypeError("generate_batch takes a list of prompts: one list of token ids is "
                            "one prompt, so pass [ids] (or use generate())")
        if len(prompts) > self._core.n_seq:
            raise ValueError(f"{len(prompts)} prompts but the context has n_seq_max="
                             f"{self._core.n_seq}")
        return self._run([self._core.request(
            p, max_tokens=max_tokens, sampling=s.for_choice(i), stop=stop, logprobs=logprobs,
            stop_token_ids=stop_token_ids, **constraint) for i, p in enumerate(prompts)])

    def stream(self, prompt: Prompt, *, max_tokens: int = 128, sampling: SamplingSpec = None,
               stop: StopSpec = (), logprobs: Union[bool, int, None] = None,
               stop_token_ids: Sequence[int] = (), **options: Any) -> "Stream":
        """Text pieces as they are accepted; ``.result`` holds the full result at the end
        (``Stream.pieces()`` gives :class:`Piece` objects with token ids instead). Options
        as for :meth:`generate`."""
        return self._open(self._core.request(
            prompt, max_tokens=max_tokens, sampling=sampling, stop=stop, logprobs=logprobs,
            stop_token_ids=stop_token_ids, **options))

    def chat(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int = 128,
             sampling: SamplingSpec = None,
             stop: Union[str, Iterable[str]] = (), chat_template: Optional[str] = None,
             logprobs: Union[bool, int, None] = None, **options: Any) -> GenerationResult:
        """The assistant's reply to OpenAI-style ``messages``, rendered by the model's chat
        template (or ``chat_template``: Jinja source or a llama.cpp built-in name); it ends
        at the template's end of turn. Other keywords: the sampling and constraint keywords
        of :meth:`generate`, else variables for Jinja templates; a generation option specdec
        does not honour (``response_format``, ``tools``, ...: see :mod:`specdec.refused`) is
        refused, not handed to the template."""
        con = take_options(options)
        p, sampling, stops = self._chat_prompt(messages, sampling, stop, chat_template, options)
        return self.generate(p.tokens, max_tokens=max_tokens, sampling=sampling, stop=stops,
                             logprobs=logprobs, stop_token_ids=p.stop_token_ids, **con)

    def stream_chat(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int = 128,
                    sampling: SamplingSpec = None,
                    stop: Union[str, Iterable[str]] = (), chat_template: Optional[str] = None,
                    logprobs: Union[bool, int, None] = None, **options: Any) -> "Stream":
        """:meth:`chat`, streamed: text pieces as they are accepted."""
        con = take_options(options)
        p, sampling, stops = self._chat_prompt(messages, sampling, stop, chat_template, options)
        return self.stream(p.tokens, max_tokens=max_tokens, sampling=sampling, stop=stops,
                           logprobs=logprobs, stop_token_ids=p.stop_token_ids, **con)

    def _openai_call(self, kind: str, body: Dict[str, Any], chat_template: Optional[str]
                     ) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """``create_completion`` / ``create_chat_completion`` (:class:`CompletionMethods`):
        the choices one after the other on this Decoder."""
        return decoder_call(self, kind, body, chat_template)

    def _chat_prompt(self, messages: Sequence[Mapping[str, Any]], sampling: SamplingSpec,
                     stop: Union[str, Iterable[str]], chat_template: Optional[str],
                     options: Dict[str, Any]) -> Tuple[ChatPrompt, Sampling, List[str]]:
        sampling, template_vars = split_chat_options(sampling, options)
        p = chat_prompt(self.model, messages, chat_template=chat_template, **template_vars)
        return p, sampling, stop_list(stop) + p.stop


class Stream:
    """Iterator over text pieces of one generation (one piece per round)."""

    def __init__(self, decoder: Decoder, state: _State) -> None:
        self._decoder = decoder
        self._core = decoder._core
        self._s = state
        # the thread that last read it (whose next call on the decoder closes it if left)
        self._owner = threading.get_ident()
        # held while a piece is read: the round runs in it, so nothing may end the request then
        self._reading = threading.Lock()
        self.result: Optional[GenerationResult] = None

    def __iter__(self) -> "Stream":
        return self

    @property
    def n_tokens(self) -> int:
        """Tokens generated so far (the first comes from the prompt pass)."""
        return len(self._core.ctl.tokens(self._s.slot))

    def _release(self) -> None:
        """The end: the request leaves (closed before its end: ``"cancelled"``, as an Engine
        request cut short), its result is read and the decoder is free again."""
        if self.result is None:
            try:
                if self._s.slot in self._core.running:
                    self._core.end(self._s.slot, self._s, "cancelled")
                self.result = (self._decoder._outcome(self._s)
                               if self._s.future.exception() is None else self._s.partial)
            finally:
                self._decoder._release()

    def _close_idle(self) -> bool:
        """Close the stream unless a piece is being read (False then); True once it is over."""
        if not self._reading.acquire(blocking=False):
            return False
        try:
            self._release()
        finally:
            self._reading.release()
        return True

    def next_piece(self) -> Piece:
        """The next :class:`Piece` (text with its token ids and logprobs); StopIteration at
        the end. One thread reads a stream at a time: a second one gets ContextBusyError."""
        if not self._reading.acquire(blocking=False):
            raise ContextBusyError("this stream is being read by another thread (or by a "
                                   "drafter within its own round)")
        try:
            self._owner = threading.get_ident()
            return self._next_piece()
        finally:
            self._reading.release()

    def _next_piece(self) -> Piece:
        if self.result is not None:
            raise StopIteration
        pieces = self._s.pieces
        try:
            while pieces.empty():
                if self._s.cancelled:     # closed while a piece was being read
                    self._release()
                    raise StopIteration
                self._core.round()
        except BaseException:
            self._release()
            raise
        piece = pieces.get_nowait()
        if piece is None:       # the end, or what the request failed with
            self._release()
            exc = self._s.future.exception()
            if exc is not None:
                raise exc
            raise StopIteration
        if self._s.future.done() and pieces.qsize() == 1:   # the last piece: free already
            self._release()
        return piece

    def pieces(self) -> Iterator[Piece]:
        """Iterate :class:`Piece` objects instead of text."""
        while True:
            try:
                yield self.next_piece()
            except StopIteration:
                return

    def __next__(self) -> str:
        while True:
            piece = self.next_piece()
            if piece.text:
                return piece.text

    def close(self) -> None:
        """Stop early (``result.finish_reason`` is then ``"cancelled"``); the decoder is free
        again. A new call on the decoder from this thread closes an unfinished stream too
        (after a Ctrl-C, say). Closed while another thread (or a drafter in its round) reads
        a piece, it ends after that round."""
        if not self._close_idle():
            self._s.cancel()

    def __del__(self) -> None:
        if self.result is None and self._decoder._lock.locked():
            try:
                self._release()
            except Exception:
                pass


def _split(options: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The one-shot functions' keywords: (sampling keywords, Decoder options)."""
    return ({k: v for k, v in options.items() if k in SAMPLING_OPTIONS},
            {k: v for k, v in options.items() if k not in SAMPLING_OPTIONS})


def generate(model: Union[Model, PathLike], prompt: Prompt, *, max_tokens: int = 128,
             sampling: SamplingSpec = None, stop: StopSpec = (), drafter: Any = None,
             **options: Any) -> GenerationResult:
    """One-shot generation (``options``: sampling keywords, else :class:`Decoder` options).
    For repeated calls keep a :class:`Decoder` instead."""
    sampling_kw, decoder_options = _split(options)
    dec = Decoder(model, drafter=drafter, **decoder_options)
    return dec.generate(prompt, max_tokens=max_tokens, sampling=sampling, stop=stop,
                        **sampling_kw)


def stream(model: Union[Model, PathLike], prompt: Prompt, *, max_tokens: int = 128,
           sampling: SamplingSpec = None, stop: StopSpec = (), drafter: Any = None,
           **options: Any) -> Iterator[str]:
    """One-shot streaming generation: yields text pieces (options as for :func:`generate`)."""
    sampling_kw, decoder_options = _split(options)
    dec = Decoder(model, drafter=drafter, **decoder_options)
    return dec.stream(prompt, max_tokens=max_tokens, sampling=sampling, stop=stop, **sampling_kw)
