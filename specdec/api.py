"""The Python API: a reusable decoder, and ``generate`` / ``stream`` shortcuts."""
from __future__ import annotations

import codecs
import logging
import os
import threading
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from ._controller import Controller
from ._core import LAZY_NEXTN_ARCHS, ContextBusyError, Context, Model, TargetView
from .chat import chat_prompt
from .config import Sampling, SpecConfig
from .drafters import Drafter, create as create_drafter
from .drafters.guard import guard
from .placement import Placement
from .results import GenerationResult, Stats

_log = logging.getLogger("specdec")
#: drafting rounds a fixed-length drafter gets before it is judged (see ``Decoder._judge``)
JUDGE_ROUNDS = 16

PathLike = Union[str, "os.PathLike[str]"]
Prompt = Union[str, bytes, Sequence[int]]
DrafterSpec = Union[str, Drafter, Any]


def _as_list(drafter: Union[DrafterSpec, Sequence[DrafterSpec], None]) -> List[DrafterSpec]:
    if drafter is None:
        return []
    if isinstance(drafter, (list, tuple)):
        return list(drafter)
    return [drafter]


def _stop_list(stop: Union[str, bytes, Iterable[Union[str, bytes]], None]) -> List[str]:
    """Stop strings as text, checked up front (a bad one must not fail half-way into a request)."""
    if stop is None:
        return []
    if isinstance(stop, (str, bytes)):
        stop = [stop]
    elif not isinstance(stop, Iterable):
        raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    out = []
    for s in stop:
        if isinstance(s, bytes):
            try:
                s = s.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"stop string {s!r} is not valid UTF-8") from None
        if not isinstance(s, str):
            raise TypeError(f"stop strings must be str or bytes, got {type(s).__name__}")
        if not s:
            raise ValueError("stop strings must not be empty")
        out.append(s)
    return out


def _check_room(n_ctx: Any, n_seq_max: Any, n_max: int) -> None:
    """A context too small to verify a draft is refused by name (llama.cpp would cap n_batch
    at n_ctx and the controller would then speak of n_batch)."""
    if n_max and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                     for v in (n_ctx, n_seq_max)) and n_ctx // n_seq_max < n_max + 2:
        raise ValueError(f"n_ctx={n_ctx} is too small for drafts of n_max={n_max}: each of the "
                         f"{n_seq_max} sequence(s) needs a prompt token and a verify batch of "
                         f"n_max + 1 tokens (n_ctx >= {(n_max + 2) * n_seq_max})")


def _run(ctl: Controller) -> None:
    """Rounds to the end, from Python: the interpreter checks for Ctrl-C between rounds
    (a loop inside compiled code would not see the signal until the request ends)."""
    while ctl.step() > 0:
        pass


class Decoder:
    """A model, its context and its drafters, kept across calls.

    Parameters
    ----------
    model
        A GGUF path (``specdec.default_model_path()`` gives the default model) or a
        loaded :class:`Model`.
    drafter
        A name (``"ngram"``, ``"ngram:4"``, ``"draft:PATH"``; ``specdec drafters`` lists
        them with their arguments), a :class:`Drafter` instance or subclass, an object
        with ``propose``, or a list of them tried in order (a chain). None: plain decoding.
    n_max
        The longest draft verified in one round (the verify batch holds ``n_max + 1`` rows
        per sequence). With ``adaptive=True`` it is the upper bound of the chosen length.
    n_min
        Drafts shorter than this are dropped (the round decodes plainly).
    p_min
        Probabilistic drafters (draft models, MTP) stop a draft where their own
        probability falls below it.
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
        Default: on wherever it can run (every target, except one that feeds MTP hidden
        states on an arch outside ``LAZY_NEXTN_ARCHS``; one-sequence batches only). Each
        decode stops at the final norm and a row's logits are computed only when
        verification reaches it, all rows of a pass sharing one read of the LM head: a
        rejected draft no longer pays for the vocabulary projection of the rows after
        it. Each row's logits are bit-identical to a one-row LM head's for the same
        hidden state (``specdec/_lm_head.h``).
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
        lazy_logits: Optional[bool] = None,
        n_gpu_layers: int = 0,
        split_mode: Union[str, int] = "layer",
        main_gpu: int = 0,
        tensor_split: Optional[Sequence[float]] = None,
        rpc_servers: Union[str, Sequence[str], None] = None,
        n_gpu_layers_draft: Optional[int] = None,
        model_check: str = "fast",
    ) -> None:
        self.spec = SpecConfig(n_max=n_max, n_min=n_min, p_min=p_min, adaptive=adaptive)
        self.exact = bool(exact)
        specs = _as_list(drafter)
        placement = Placement.make(n_gpu_layers, split_mode, main_gpu, tensor_split, rpc_servers)
        if isinstance(model, Model):
            self.model = model
            if self.exact and model.use_extra_bufts:
                raise ValueError("exact=True needs the model loaded with use_extra_bufts=False "
                                 "(or pass a path and let the Decoder load it)")
            if placement != Placement():
                raise ValueError("placement options (n_gpu_layers, rpc_servers, ...) apply when "
                                 "the Decoder loads the model: pass them to Model(...) instead")
        else:
            wants_mtp = any(isinstance(s, str) and s.split(":", 1)[0] == "mtp" for s in specs)
            self.model = Model(model, load_mtp=wants_mtp if load_mtp is None else load_mtp,
                               use_extra_bufts=not self.exact, check=model_check,
                               **placement.options())
        created = [create_drafter(s) for s in specs]
        if n_gpu_layers_draft is not None:
            placed = [d for d in created if hasattr(d, "n_gpu_layers")]
            if not placed:
                raise ValueError("n_gpu_layers_draft applies to drafters with a model of their "
                                 "own (draft:PATH, layerskip:N, mtp); none is in use")
            for d in placed:
                d.n_gpu_layers = n_gpu_layers_draft
        self.drafters: List[Drafter] = [guard(d, drafter_timeout, on_drafter_error)
                                        for d in created]
        for d in self.drafters:
            configure = getattr(d, "configure", None)
            if configure is not None:
                configure(self.spec)
        n_max_eff = self.spec.n_max if self.drafters else 0
        # recurrent state rolled back by n_rs_seq snapshots (the others use checkpoints)
        recurrent = (self.model.is_recurrent or self.model.is_hybrid) and self.model.supports_partial_rollback
        nextn = None
        for d in self.drafters:
            nextn = getattr(d, "target_nextn", None) or nextn
        if lazy_logits is None:
            # off the host (any offloaded layer takes the output layer with it) the head
            # cannot be read, and a device's LM head is cheap anyway
            lazy_logits = ((nextn is None or self.model.arch in LAZY_NEXTN_ARCHS)
                           and self.model.placement.n_gpu_layers == 0)
        _check_room(n_ctx, n_seq_max, n_max_eff)
        verify_rows = n_seq_max * (n_max_eff + 1)
        if self.exact and n_ubatch is not None and n_ubatch < max(verify_rows, 2):
            # a verify split into ubatches could leave a single row, which other kernels compute
            raise ValueError(f"exact=True needs n_ubatch >= {max(verify_rows, 2)} (n_seq_max * "
                             f"(n_max + 1)) so that no verify batch is split; got {n_ubatch}")
        self.ctx = Context(
            self.model, n_ctx=n_ctx, n_batch=max(n_batch, verify_rows),
            n_ubatch=n_ubatch, n_threads=n_threads, n_seq_max=n_seq_max,
            n_rs_seq=max(n_max_eff, int(self.exact)) if recurrent and (n_max_eff or self.exact) else 0,
            nextn=nextn, lazy_logits=bool(lazy_logits), batch_invariant=self.exact)
        target = TargetView(self.ctx)   # drafters read the target; only the controller writes
        for d in self.drafters:
            d.bind(target, n_seq_max)
        self.check = bool(check)
        self._lock = threading.Lock()
        self._controller: Optional[Controller] = None
        self._policies: Dict[bool, Any] = {}
        self._stream: Optional["weakref.ref[Stream]"] = None
        self._closed = False
        self._judged = self.spec.adaptive or not self.drafters

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
            for d in self.drafters:
                close = getattr(d, "close", None)
                if close is not None:
                    close()
            self.drafters = []
            self._policies.clear()
            self.ctx.close()
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

    # --- setup per request -------------------------------------------------------------

    def tokenize(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, (str, bytes)):
            return self.model.tokenize(prompt, add_special=True, parse_special=True)
        return list(prompt)

    def _controller_for(self, sampling: Sampling, stops: List[str]) -> Controller:
        # the adaptive policy learns over this decoder's requests (greedy and sampled
        # verification accept differently, so each keeps its own)
        greedy = sampling.temperature <= 0.0
        ctl = Controller(
            self.ctx, self.drafters, n_max=self.spec.n_max if self.drafters else 0,
            n_min=self.spec.n_min, adaptive=self.spec.adaptive,
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
            min_p=sampling.min_p, stop=stops, check=self.check, exact=self.exact,
            policy=self._policies.get(greedy))
        self._policies[greedy] = ctl.policy
        return ctl

    def _begin(self, prompts: List[Prompt], max_tokens: int, sampling, stop) -> Controller:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 0 < max_tokens < 2**31:
            raise ValueError(f"max_tokens must be an int in [1, 2**31), got {max_tokens!r}")
        s = Sampling.resolve(sampling)
        ctl = self._controller_for(s, _stop_list(stop))
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little")
        ctl.start([self.tokenize(p) for p in prompts], max_tokens,
                  [seed + i for i in range(len(prompts))])
        return ctl

    def _acquire(self) -> None:
        if self._closed:
            raise RuntimeError("this Decoder is closed")
        if self._lock.acquire(blocking=False):
            return
        # a stream this thread left unfinished (abandoned, or cut by Ctrl-C between pieces)
        # is closed by the thread's next call; another thread's stream is never touched
        st = self._stream() if self._stream is not None else None
        if st is not None and st._owner == threading.get_ident() and st.result is None:
            st.close()
            if self._lock.acquire(blocking=False):
                return
        raise ContextBusyError("this Decoder is in use by another thread; use one Decoder per "
                               "thread")

    def _result(self, ctl: Controller, seq: int = 0) -> GenerationResult:
        st = ctl.stats()
        if ctl.n_sequences > 1:
            st = dict(st, n_prompt=ctl.n_prompt(seq), n_generated=len(ctl.tokens(seq)))
        res = GenerationResult(
            text=ctl.text(seq).decode("utf-8", "replace"), tokens=ctl.tokens(seq),
            finish_reason=ctl.finish_reason(seq), stats=Stats(**st))
        if seq == 0:
            self._judge(Stats(**ctl.stats()))
        return res

    # --- public ------------------------------------------------------------------------

    def generate(self, prompt: Prompt, *, max_tokens: int = 128,
                 sampling: Union[Sampling, dict, str, None] = None,
                 stop: Union[str, Iterable[str]] = ()) -> GenerationResult:
        """Generate up to ``max_tokens`` tokens after ``prompt`` (text or token ids)."""
        self._acquire()
        try:
            ctl = self._begin([prompt], max_tokens, sampling, stop)
            _run(ctl)
            return self._result(ctl)
        finally:
            self._lock.release()

    def generate_batch(self, prompts: Sequence[Prompt], *, max_tokens: int = 128,
                       sampling: Union[Sampling, dict, str, None] = None,
                       stop: Union[str, Iterable[str]] = ()) -> List[GenerationResult]:
        """Several prompts at once, verified together in one batch per round."""
        self._acquire()
        try:
            ctl = self._begin(list(prompts), max_tokens, sampling, stop)
            _run(ctl)
            return [self._result(ctl, i) for i in range(len(prompts))]
        finally:
            self._lock.release()

    def stream(self, prompt: Prompt, *, max_tokens: int = 128,
               sampling: Union[Sampling, dict, str, None] = None,
               stop: Union[str, Iterable[str]] = ()) -> "Stream":
        """Text pieces as they are accepted; ``.result`` holds the full result at the end."""
        self._acquire()
        try:
            ctl = self._begin([prompt], max_tokens, sampling, stop)
        except BaseException:
            self._lock.release()
            raise
        try:
            st = Stream(self, ctl, _stop_list(stop))
        except BaseException:
            self._lock.release()
            raise
        self._stream = weakref.ref(st)
        return st

    def chat(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int = 128,
             sampling: Union[Sampling, dict, str, None] = None,
             stop: Union[str, Iterable[str]] = (), chat_template: Optional[str] = None,
             **template_vars: Any) -> GenerationResult:
        """The assistant's reply to OpenAI-style ``messages``, rendered by the model's chat
        template (or ``chat_template``: Jinja source or a llama.cpp built-in name); it ends
        at the template's end of turn. ``template_vars`` reach Jinja templates."""
        p = chat_prompt(self.model, messages, chat_template=chat_template, **template_vars)
        return self.generate(p.tokens, max_tokens=max_tokens, sampling=sampling,
                             stop=_stop_list(stop) + p.stop)

    def stream_chat(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int = 128,
                    sampling: Union[Sampling, dict, str, None] = None,
                    stop: Union[str, Iterable[str]] = (), chat_template: Optional[str] = None,
                    **template_vars: Any) -> "Stream":
        """:meth:`chat`, streamed: text pieces as they are accepted."""
        p = chat_prompt(self.model, messages, chat_template=chat_template, **template_vars)
        return self.stream(p.tokens, max_tokens=max_tokens, sampling=sampling,
                           stop=_stop_list(stop) + p.stop)


class Stream:
    """Iterator over text pieces of one generation (one piece per round)."""

    def __init__(self, decoder: Decoder, ctl: Controller, stops: List[str]) -> None:
        self._decoder = decoder
        self._ctl = ctl
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._stops = stops
        self._first = True
        self._yielded = 0
        self._owner = threading.get_ident()
        self.result: Optional[GenerationResult] = None

    def __iter__(self) -> "Stream":
        return self

    @property
    def n_tokens(self) -> int:
        """Tokens generated so far (the first comes from the prompt pass)."""
        return len(self._ctl.tokens())

    def _release(self) -> None:
        if self.result is None:
            self.result = self._decoder._result(self._ctl)
            self._decoder._lock.release()

    def _piece(self, final: bool) -> str:
        if final:
            # the whole text, once: a stop string may have cut what was held back
            self._held = ""
            text = self._ctl.text().decode("utf-8", "replace")[self._yielded:]
            self._yielded += len(text)
            return text
        text = self._held + self._utf8.decode(self._ctl.take_text())
        if not self._hold:
            self._yielded += len(text)
            return text
        # hold back a tail that could still become a stop string
        keep = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self._held = text[len(text) - keep:] if keep else ""
        out = text[:len(text) - keep] if keep else text
        self._yielded += len(out)
        return out

    def __next__(self) -> str:
        if self.result is not None:
            raise StopIteration
        try:
            while True:
                if self._first:
                    self._first = False
                    alive = self._ctl.finish_reason() is None
                else:
                    alive = self._ctl.step() > 0
                if not alive:
                    piece = self._piece(final=True)
                    self._release()
                    if piece:
                        return piece
                    raise StopIteration
                piece = self._piece(final=False)
                if piece:
                    return piece
        except StopIteration:
            raise
        except BaseException:
            self._release()
            raise

    def close(self) -> None:
        """Stop early; the decoder is free again. A new call on the decoder from this
        thread closes an unfinished stream too (after a Ctrl-C, say)."""
        self._release()

    def __del__(self) -> None:
        if self.result is None and self._decoder._lock.locked():
            try:
                self._release()
            except Exception:
                pass


def generate(model: Union[Model, PathLike], prompt: Prompt, *, max_tokens: int = 128,
             sampling: Union[Sampling, dict, str, None] = None,
             stop: Union[str, Iterable[str]] = (), drafter=None, **decoder_options: Any
             ) -> GenerationResult:
    """One-shot generation. For repeated calls keep a :class:`Decoder` instead."""
    dec = Decoder(model, drafter=drafter, **decoder_options)
    return dec.generate(prompt, max_tokens=max_tokens, sampling=sampling, stop=stop)


def stream(model: Union[Model, PathLike], prompt: Prompt, *, max_tokens: int = 128,
           sampling: Union[Sampling, dict, str, None] = None,
           stop: Union[str, Iterable[str]] = (), drafter=None, **decoder_options: Any
           ) -> Iterator[str]:
    """One-shot streaming generation: yields text pieces."""
    dec = Decoder(model, drafter=drafter, **decoder_options)
    return dec.stream(prompt, max_tokens=max_tokens, sampling=sampling, stop=stop)
