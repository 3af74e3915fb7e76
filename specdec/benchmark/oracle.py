"""The oracle drafter: it drafts the target's own greedy continuation, recorded beforehand.

Every draft it makes is right, so a run with it costs only verification: on each prompt and
draft length it measures the hardware's ceiling for speculative decoding, and in exact mode any
departure from the recorded output is the verify batch's fault (its rows rounding differently
from plain decoding's), never the drafter's. Bench harness only, not a user-facing drafter.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from specdec.drafters import Drafter


class Oracle(Drafter):
    """Drafts from ``book``: prompt tokens -> the greedy continuation recorded for them.

    A request whose prompt is not in the book, or whose output has left the recorded path,
    gets no drafts.
    """

    def __init__(self, book: Dict[Tuple[int, ...], Sequence[int]]) -> None:
        super().__init__("oracle")
        self.book = {tuple(k): list(v) for k, v in book.items()}
        self._cont: Dict[int, List[int]] = {}
        self._n_prompt: Dict[int, int] = {}

    def begin(self, seq: int, prompt_tokens: Sequence[int]) -> None:
        self._cont[seq] = self.book.get(tuple(prompt_tokens), [])
        self._n_prompt[seq] = len(prompt_tokens)

    def propose(self, seq: int, last_token: int, n_max: int) -> List[int]:
        cont = self._cont.get(seq, [])
        hist = self.history(seq)
        done = len(hist) - self._n_prompt.get(seq, len(hist)) + 1   # emitted, ``last`` included
        if done < 1 or done > len(cont) or cont[done - 1] != last_token:
            return []
        return cont[done:done + n_max]

    def reset(self, seq: int) -> None:
        self._cont.pop(seq, None)
        self._n_prompt.pop(seq, None)
