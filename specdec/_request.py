"""One request, checked once at the API boundary, for every front door of the controller.

:class:`~specdec.Decoder` (one caller at a time), :class:`~specdec.Engine` (many
concurrent callers) and ``specdec serve`` (OpenAI's wire format) take the same request
options; each builds one :class:`Request` of them (through ``Scheduler.request``), the one
record the scheduler core runs and the arguments of ``Controller.join`` come from. This
module also reads a finished sequence back as a :class:`GenerationResult`. Below this layer
the controller only asserts.
"""
from __future__ import annotations

import codecs
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._core import ContextFullError, Model
from .config import SAMPLING_OPTIONS, Sampling
from .constraint import Constraint, take_options
from .refused import BODY_ONLY, REFUSED, TEMPLATE_VARIABLES, refusal
from .results import GenerationResult, Piece, Stats, TokenLogprob

Prompt = Union[str, bytes, Sequence[int]]
StopSpec = Union[str, bytes, Iterable[Union[str, bytes]], None]
SamplingSpec = Union[Sampling, Dict[str, Any], str, None]
#: the most top-k alternatives a request may ask per token (OpenAI's limit)
MAX_TOP_LOGPROBS = 20


def split_chat_options(sampling: SamplingSpec, options: Dict[str, Any]
                       ) -> Tuple[Sampling, Dict[str, Any]]:
    """A chat call's extra keywords: the sampling keywords, and the rest for the template.

    A generation option specdec does not honour (:data:`specdec.refused.REFUSED`) is refused
    here: handed to the template, it would be ignored while the caller believes it applied."""
    for name in options:
        if name in BODY_ONLY:
            raise ValueError(f"'{name}' is a field of the server's requests; here use the "
                             "constraint keywords (grammar=, json_schema=, regex=, choices=)")
        if name in REFUSED and name not in TEMPLATE_VARIABLES:
            raise ValueError(refusal(name))
    sampling_kw = {k: v for k, v in options.items() if k in SAMPLING_OPTIONS}
    template_vars = {k: v for k, v in options.items() if k not in SAMPLING_OPTIONS}
    return Sampling.resolve(sampling, **sampling_kw), template_vars


def call_options(sampling: SamplingSpec, options: Dict[str, Any]
                 ) -> Tuple[Sampling, Dict[str, Any]]:
    """A call's ``sampling`` and its extra keywords: the sampling they give (its fields as
    keywords, or ``sampling``, not both) and the constraint options among them."""
    constraint = take_options(options)
    return Sampling.resolve(sampling, **options), constraint


def stop_list(stop: StopSpec) -> List[str]:
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
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:   # a lone surrogate: no text the model writes can hold it
            raise ValueError(f"stop string {s!r} is not valid Unicode text") from None
        out.append(s)
    return out


def stop_id_list(model: Model, stop_token_ids: Any) -> List[int]:
    """Token ids that end a request, checked up front: ints in the vocabulary."""
    if stop_token_ids is None:
        return []
    if isinstance(stop_token_ids, (str, bytes)) or not isinstance(stop_token_ids, Iterable):
        raise TypeError("stop_token_ids must be a list of token ids, got "
                        f"{type(stop_token_ids).__name__}")
    return [token_id(model, t, "stop") for t in stop_token_ids]


def token_id(model: Model, t: Any, what: str) -> int:
    """``t`` as a token id of ``model``'s vocabulary (``what``: whose id, for the error)."""
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
        raise TypeError(f"{what} token ids must be ints, got {type(t).__name__}")
    if not 0 <= t < model.n_vocab:
        raise ValueError(f"{what} token id {t} out of range [0, {model.n_vocab})")
    return int(t)


def check_max_tokens(max_tokens: Any) -> int:
    if isinstance(max_tokens, (bool, np.bool_)) or not isinstance(max_tokens, (int, np.integer)) \
            or not 0 < max_tokens < 2**31:
        raise ValueError(f"max_tokens must be an int in [1, 2**31), got {max_tokens!r}")
    return int(max_tokens)


def check_logprobs(logprobs: Any) -> int:
    """None or False: none (-1); True: the chosen token's only (0); k: also the k best."""
    if logprobs is None or logprobs is False:
        return -1
    if logprobs is True:
        return 0
    if not isinstance(logprobs, (int, np.integer)) or not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs must be None, a bool or an int in [0, {MAX_TOP_LOGPROBS}], "
                         f"got {logprobs!r}")
    return int(logprobs)


def tokenize(model: Model, prompt: Prompt) -> List[int]:
    if isinstance(prompt, (str, bytes)):
        return model.tokenize(prompt, add_special=True, parse_special=True)
    if isinstance(prompt, np.ndarray) and prompt.ndim != 1:
        raise ValueError(f"a prompt of token ids is one-dimensional, got shape {prompt.shape}")
    return list(prompt)


def check_prompt(model: Model, prompt: Prompt, n_ctx_seq: int) -> List[int]:
    """Token ids of ``prompt``, each in range, leaving room to generate."""
    p = tokenize(model, prompt)
    if not p:
        raise ValueError("empty prompt: nothing to condition on")
    ids = [token_id(model, t, "prompt") for t in p]
    if len(ids) >= n_ctx_seq:
        raise ContextFullError(f"prompt of {len(ids)} tokens does not fit the context "
                               f"(n_ctx={n_ctx_seq}); leave room to generate")
    return ids


@dataclass(frozen=True)
class Request:
    """A checked request: what ``Controller.join`` needs, minus the slot and the policy.

    The one shape a request has inside specdec, whichever door it came in by: the server
    builds it from a request body, the Decoder and the Engine from their keywords, and the
    scheduler runs it as it is."""

    prompt: List[int]
    max_tokens: int
    sampling: Sampling
    seed: int
    stops: Tuple[str, ...]
    logprobs: int            # -1: none
    stop_ids: Tuple[int, ...] = ()
    grammar: Any = None      # a fresh GrammarState the output must match (one per request)
    drafters: Tuple[Any, ...] = ()   # the Drafter chain it drafts with (empty: plain)
    n_max: int = 0           # its draft cap (0 without drafters)
    deadline: Optional[float] = None   # time.monotonic() past which it ends with "timeout"

    @classmethod
    def make(cls, model: Model, n_ctx_seq: int, prompt: Prompt, max_tokens: Any,
             sampling: SamplingSpec, stop: StopSpec, logprobs: Any = None,
             stop_token_ids: Any = None, constraint: Optional[Constraint] = None) -> "Request":
        s = Sampling.resolve(sampling)
        for t, _ in s.logit_bias:
            token_id(model, t, "logit_bias")
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little")
        return cls(prompt=check_prompt(model, prompt, n_ctx_seq),
                   max_tokens=check_max_tokens(max_tokens), sampling=s, seed=seed,
                   stops=tuple(stop_list(stop)), logprobs=check_logprobs(logprobs),
                   stop_ids=tuple(stop_id_list(model, stop_token_ids)),
                   grammar=constraint.compile(model).state() if constraint is not None else None)

    def join_args(self) -> Dict[str, Any]:
        """The keywords of ``Controller.join`` that come from the request itself."""
        s = self.sampling
        return dict(max_tokens=self.max_tokens, seed=self.seed % 2**64,
                    temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
                    stop=[x.encode("utf-8") for x in self.stops], stop_ids=list(self.stop_ids),
                    logprobs=self.logprobs, repetition_penalty=s.repetition_penalty,
                    presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                    logit_bias=s.logit_bias, grammar=self.grammar)


def logprob_list(raw: Optional[List[Any]]) -> Optional[List[TokenLogprob]]:
    if raw is None:
        return None
    return [TokenLogprob(lp, top) for lp, top in raw]


def result(ctl: Any, seq: int, finish_reason: Optional[str] = None) -> GenerationResult:
    """The finished (or cut short: ``finish_reason``) request on ``seq`` of ``ctl``."""
    toks = ctl.tokens(seq)
    return GenerationResult(
        text=ctl.text(seq).decode("utf-8", "replace"), tokens=toks,
        finish_reason=finish_reason or ctl.finish_reason(seq), stats=Stats(**ctl.stats(seq)),
        logprobs=logprob_list(ctl.logprobs(seq)))


class Pieces:
    """Turns what ``Controller.take`` releases into :class:`Piece` objects (text decoded
    incrementally: a UTF-8 character split across tokens comes out whole)."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def next(self, ctl: Any, seq: int, final: bool = False) -> Piece:
        data, toks, lps = ctl.take(seq)
        text = self._utf8.decode(data, final=final)
        return Piece(text=text, tokens=toks, logprobs=logprob_list(lps))
