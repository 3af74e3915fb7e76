"""Generation settings, resolved once into immutable objects before the loop starts."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any, List, Mapping, Optional, Tuple, Union

# the longest draft a round may verify (its batch holds n_max + 1 rows per sequence)
N_MAX_LIMIT = 64


@dataclass(frozen=True)
class Sampling:
    """How the target's next token is chosen.

    ``temperature == 0`` is greedy (argmax, lossless speculative verification).
    Otherwise top-k, top-p and min-p filter the raw logits, then temperature
    scales them (llama.cpp's order), and speculative verification uses
    rejection sampling so the output distribution is exactly this one.

    Before either, ``logit_bias`` (token id -> added to its logit, as OpenAI's) and the
    penalties change the logits by the history, with vLLM's meanings:
    ``repetition_penalty`` divides the positive logit (multiplies the negative one) of a
    token in the prompt or the output; ``presence_penalty`` is subtracted from a token in
    the output, ``frequency_penalty`` times its count there. Each verify row is
    penalised with the history up to it, so greedy speculation still equals plain
    decoding and sampled speculation still samples this distribution.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    #: (token id, bias) pairs, sorted; a mapping given is turned into them
    logit_bias: Tuple[Tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                or not 0 <= self.top_k < 2**31):
            raise ValueError(f"top_k must be an int in [0, 2**31), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not -2**63 <= self.seed < 2**64):
            raise ValueError(f"seed must be None or an int in [-2**63, 2**64), got {self.seed!r}")
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if not 0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ValueError(f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}], got "
                             f"{self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2] (OpenAI's range), got "
                                 f"{getattr(self, name)}")
        object.__setattr__(self, "logit_bias", bias_pairs(self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def resolve(cls, value: Union["Sampling", Mapping[str, Any], str, None] = None,
                **options: Any) -> "Sampling":
        """Accept a Sampling, a dict of its fields, ``"greedy"`` or None; or, instead of
        ``value``, its fields as keywords (the shortcuts ``generate(..., temperature=0.7)``
        of the API take; a keyword given as None counts as not given)."""
        unknown = sorted(set(options) - set(SAMPLING_OPTIONS))
        if unknown:       # as Python's own "unexpected keyword argument"
            raise TypeError(_unknown_options(unknown))
        given = {k: v for k, v in options.items() if v is not None}
        if given:
            if value is not None:
                raise ValueError(f"give either sampling= or the sampling keywords "
                                 f"{sorted(given)}, not both")
            value = given
        if value is None or value == "greedy":
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            extra = sorted(set(value) - set(SAMPLING_OPTIONS))
            if extra:
                raise ValueError(_unknown_options(extra))
            return cls(**value)
        raise TypeError(f"sampling must be a Sampling, a dict or 'greedy', got {type(value).__name__}")

    def with_seed(self, seed: Optional[int]) -> "Sampling":
        return replace(self, seed=seed)

    def for_choice(self, i: int) -> "Sampling":
        """The sampling of choice ``i`` of a request of several (``n`` choices, a batch's
        prompts): a seeded request draws choice i with ``seed + i`` (vLLM's rule), so
        that the choices differ yet replay; an unseeded one draws each with its own."""
        if self.seed is None:
            return self
        return self.with_seed((self.seed + i) % 2**64)


#: the largest repetition penalty (vLLM takes any > 0; past this a logit is all but erased)
MAX_REPETITION_PENALTY = 100.0
#: OpenAI's bound on a logit_bias value
MAX_LOGIT_BIAS = 100.0


#: a token id written as JSON keys write it (ASCII digits: ``str.isdigit`` also takes '²' and
#: other scripts' digits, which ``int`` refuses or reads as another number)
_ID_TEXT = re.compile(r"\s*-?[0-9]+\s*")


def bias_pairs(value: Any) -> Tuple[Tuple[int, float], ...]:
    """``logit_bias`` as sorted (token id, bias) pairs: from a mapping of ids (ints, or
    strings of them as in JSON) to biases, or from pairs. Ids are checked against the
    vocabulary when the request is made."""
    items = value.items() if isinstance(value, Mapping) else value
    if isinstance(items, (str, bytes)):
        raise ValueError("logit_bias must map token ids to numbers")
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        raise ValueError("logit_bias must map token ids to numbers") from None
    out = {}
    for k, v in pairs:
        if isinstance(k, str) and _ID_TEXT.fullmatch(k):
            k = int(k)
        if isinstance(k, bool) or not isinstance(k, int):
            raise ValueError(f"logit_bias keys must be token ids, got {k!r:.40}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias values must be numbers in [-{MAX_LOGIT_BIAS:g}, "
                             f"{MAX_LOGIT_BIAS:g}], got {v!r:.40} for token {k}")
        out[k] = float(v)
    return tuple(sorted(out.items()))


#: the fields of :class:`Sampling`: the keyword shortcuts of ``Decoder.generate`` / ``stream`` /
#: ``chat`` and ``Engine.submit`` / ``generate`` / ``stream`` are these names
SAMPLING_OPTIONS = tuple(f.name for f in fields(Sampling))


def _unknown_options(names: List[str]) -> str:
    from .refused import REFUSED, refusal
    known = [n for n in names if n in REFUSED]
    if known:
        return refusal(known[0])
    return (f"unknown sampling options {names}; the sampling keywords are "
            f"{list(SAMPLING_OPTIONS)}")


@dataclass(frozen=True)
class SpecConfig:
    """How drafts are made and verified.

    ``n_max`` caps the draft length, ``n_min`` drops shorter drafts, ``p_min``
    lets probabilistic drafters stop early, and ``adaptive`` picks the length
    each round from measured acceptance and measured verify cost.
    """

    n_max: int = 4
    n_min: int = 0
    p_min: float = 0.0
    adaptive: bool = False

    def __post_init__(self) -> None:
        for name in ("n_max", "n_min"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if self.n_max > N_MAX_LIMIT:
            raise ValueError(f"n_max must be at most {N_MAX_LIMIT}, got {self.n_max}")
        if self.n_min > self.n_max:
            # a draft shorter than n_min is dropped and none is longer than n_max: such a
            # decoder would never draft (and a huge n_min overflowed the controller's int)
            raise ValueError(f"n_min must be at most n_max={self.n_max}, got {self.n_min}")
        if not 0.0 <= self.p_min <= 1.0:
            raise ValueError(f"p_min must be in [0, 1], got {self.p_min}")
