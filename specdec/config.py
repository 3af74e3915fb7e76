"""Generation settings, resolved once into immutable objects before the loop starts."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, List, Mapping, Optional, Union

# the longest draft a round may verify (its batch holds n_max + 1 rows per sequence)
N_MAX_LIMIT = 64


@dataclass(frozen=True)
class Sampling:
    """How the target's next token is chosen.

    ``temperature == 0`` is greedy (argmax, lossless speculative verification).
    Otherwise top-k, top-p and min-p filter the raw logits, then temperature
    scales them (llama.cpp's order), and speculative verification uses
    rejection sampling so the output distribution is exactly this one.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None

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
            unknown = set(value) - set(SAMPLING_OPTIONS)
            if unknown:
                raise ValueError(_unknown_options(sorted(unknown)))
            return cls(**value)
        raise TypeError(f"sampling must be a Sampling, a dict or 'greedy', got {type(value).__name__}")

    def with_seed(self, seed: Optional[int]) -> "Sampling":
        return replace(self, seed=seed)


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
