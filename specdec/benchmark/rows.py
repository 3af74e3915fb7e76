"""The rows of a benchmark run: one method on one prompt of one case, with its timings and
checks, as the runner measures them and the results JSON keeps them (``rows_of`` reads them
back); and the names of the special prompts (plain from an empty context, interleaved rows)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

BOS_PROMPT = "(empty context)"   # the prompt name of plain decoding against llama-bench
INTERLEAVED = "(interleaved with plain)"   # suffix of the prompt name of interleaved rows


def interleaved_prompt(name: str) -> str:
    return f"{name} {INTERLEAVED}"


def is_interleaved(prompt: str) -> bool:
    return prompt.endswith(INTERLEAVED)


@dataclass
class Row:
    """One method on one prompt of one case: median tok/s over the rounds, and checks."""

    case: str
    prompt: str
    category: str
    method: str
    side: str
    family: str
    drafter: str = ""
    n_max: int = 0
    adaptive: bool = False
    exact: bool = False
    temperature: float = 0.0           # sampled rows: their temperature (0: greedy)
    constraint: str = ""               # constrained rows: what each output matched (json_schema)
    tok_s: float = 0.0
    tok_s_runs: List[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    drafted_per_position: List[int] = field(default_factory=list)
    accepted_per_position: List[int] = field(default_factory=list)
    match: Optional[float] = None      # fast mode: share of tokens equal to plain greedy, from the start
    check: str = ""                    # exact mode: PASS / FAIL (specdec only), else ""
    status: str = "ok"                 # ok / unavailable / error
    note: str = ""
    ref_tok_s: float = 0.0             # interleaved and sampled plain rows: (greedy) plain, timed in turn
    ref_tok_s_runs: List[float] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["acceptance"] = self.acceptance
        return d


@dataclass
class Sample:
    tok_s: float
    tokens: Optional[List[int]] = None
    text: str = ""
    drafted: int = 0
    accepted: int = 0
    drafted_at: List[int] = field(default_factory=list)
    accepted_at: List[int] = field(default_factory=list)


def prefix_share(a: Sequence, b: Sequence) -> float:
    """Share of the common length on which ``a`` and ``b`` agree from the start."""
    n = min(len(a), len(b))
    k = next((i for i in range(n) if a[i] != b[i]), n)
    return k / n if n else 0.0


def rows_of(results: Dict[str, Any]) -> List[Row]:
    """Rows back from a results dict (e.g. a loaded JSON file)."""
    names = {f.name for f in Row.__dataclass_fields__.values()}  # type: ignore[attr-defined]
    return [Row(**{k: v for k, v in d.items() if k in names}) for d in results["rows"]]
