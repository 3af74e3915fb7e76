"""What a generation returns: text, tokens, why it stopped, and what it cost."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Tuple


@dataclass(frozen=True)
class Stats:
    """Counters of one generation. Times are seconds; rates are per second of generation.

    ``t_generate_s`` is the time of the rounds after the prompt (what a caller does
    between a stream's pieces is not counted), split without overlap into
    ``t_target_s`` (the target's decodes), ``t_lm_head_s`` (the lazy LM head's passes:
    logits of the verify rows that verification reads), ``t_draft_s`` (drafters
    proposing and being told what was kept), ``t_verify_s`` (accepting or rejecting
    drafts, and rolling back) and ``t_controller_s`` (batches, the draft-length
    policy, text and stop strings). The five add up to ``t_generate_s``.
    """

    n_prompt: int
    n_generated: int
    tokens_per_s: float
    t_prompt_s: float
    t_generate_s: float
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: Optional[float] = None   # accepted / drafted; None: nothing was drafted
    drafted_per_position: List[int] = field(default_factory=list)
    accepted_per_position: List[int] = field(default_factory=list)
    draft_rounds: int = 0
    filler_rounds: int = 0
    redecodes: int = 0          # checkpoint rollbacks: decodes of the accepted prefix again
    n_prompt_decoded: int = -1  # prompt tokens decoded (the rest reused a kept prefix); -1: all
    t_target_s: float = 0.0
    t_lm_head_s: float = 0.0
    t_draft_s: float = 0.0
    t_verify_s: float = 0.0
    t_controller_s: float = 0.0

    @property
    def acceptance_per_position(self) -> List[float]:
        """P(draft i accepted | it was proposed), per draft position."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def mean_accepted_per_round(self) -> float:
        return self.accepted / self.draft_rounds if self.draft_rounds else 0.0

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["acceptance_per_position"] = self.acceptance_per_position
        return d


class TokenLogprob(NamedTuple):
    """A generated token's log-probability under the target (``log_softmax`` of its raw
    logits, before sampling filters), and the ``top`` alternatives as ``(id, logprob)``,
    best first."""

    logprob: float
    top: List[Tuple[int, float]]


@dataclass(frozen=True)
class Piece:
    """A piece of a streamed generation: its text, the token ids it came from, and their
    logprobs when the request asked for them. A UTF-8 character split across tokens
    comes out whole, with the piece of its last token."""

    text: str
    tokens: List[int]
    logprobs: Optional[List[TokenLogprob]] = None


@dataclass(frozen=True)
class GenerationResult:
    """``finish_reason``: ``"length"`` (``max_tokens`` reached), ``"stop"`` (a stop string;
    ``text`` ends right before it, and ``tokens`` ends with the token in which it begins),
    ``"eos"`` (the model's end-of-generation token, which is not in ``tokens``),
    ``"context"`` (the context window is full), or for a request cut short,
    ``"cancelled"`` (a Decoder stream closed early, an Engine request cancelled) or
    ``"timeout"``."""

    text: str
    tokens: List[int]
    finish_reason: Optional[str]
    stats: Stats
    #: per token of ``tokens``, when the request asked for logprobs
    logprobs: Optional[List[TokenLogprob]] = None

    def to_dict(self) -> Dict[str, Any]:
        d = {"text": self.text, "tokens": list(self.tokens),
             "finish_reason": self.finish_reason, "stats": self.stats.to_dict()}
        if self.logprobs is not None:
            d["logprobs"] = [{"logprob": lp.logprob, "top": [list(t) for t in lp.top]}
                             for lp in self.logprobs]
        return d
