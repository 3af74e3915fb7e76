"""Prompts' KV in host memory, for prompts that come back after their slot was taken.

A slot keeps its KV after a request (prefix reuse) only until another request takes it:
with more distinct prompts in turn than slots (users coming back with a longer chat, a few
system prompts, one slot for several clients) the KV of a prompt is gone when it returns,
and its prefill is paid again. So before a join overwrites what a slot holds, the slot's
state is copied here (llama.cpp's sequence state); a join whose prompt shares a longer
prefix with a saved state than with its slot gets that state restored first and decodes
only the rest. Least recently used states are dropped past the size cap. llama-server's
``--cache-ram`` does the same for its slots.

Recurrent and hybrid targets hold their state at the end of the tokens only: a saved state
serves a prompt it is a strict prefix of, and saved states are never trimmed. A state of a
model with sliding-window layers holds only the window of its last position, and the window
of its prompt's end (the controller's prompt-end checkpoint): it serves a prompt that leaves
it within one of those. ``Controller.kept_prefix`` says what a join keeps.
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from ._prefix_reuse import HeldState

#: the default cap of the Engine's (and ``specdec serve``'s ``--cache-ram``) cache, MiB
DEFAULT_MIB = 1024
#: slots holding fewer tokens are not saved (their prefill is cheap)
MIN_TOKENS = 32


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two int32 token arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PromptCache:
    """Saved slot states, least recently used first, at most ``max_mib`` MiB in all.

    One thread uses it, between rounds (the Engine's worker, or a Decoder under its lock).
    """

    def __init__(self, max_mib: float, *, recurrent: bool, min_tokens: int = MIN_TOKENS) -> None:
        if isinstance(max_mib, bool) or not isinstance(max_mib, (int, float)) or not max_mib >= 0:
            raise ValueError(f"the prompt cache size must be a number of MiB >= 0, got {max_mib!r}")
        self.max_bytes = int(max_mib * (1 << 20))
        self.recurrent = recurrent
        self.min_tokens = min_tokens
        self._entries: "collections.OrderedDict[int, HeldState]" = collections.OrderedDict()
        self._next = 0
        self.n_bytes = 0
        self.hits = 0
        self.tokens_restored = 0

    def __len__(self) -> int:
        return len(self._entries)

    def prepare(self, ctl: Any, slot: int, prompt: Sequence[int]) -> int:
        """Before ``ctl.join(slot, prompt, reuse=True)``: save what free ``slot`` holds if
        the join would lose some of it, then restore the saved state that gives the join
        the longest prefix, if it beats the slot's own. Returns the tokens restored."""
        if self.max_bytes == 0:
            return 0
        p = np.asarray(prompt, dtype=np.int32)
        held = np.asarray(ctl.held(slot), dtype=np.int32)
        own = ctl.reusable(slot, prompt)
        best: Optional[int] = None
        best_n = own
        for key, e in self._entries.items():
            # a state that leaves the prompt before the slot's own does serves nothing more
            if _common(e.tokens, p) > best_n:
                n = ctl.kept_prefix(e, p)
                if n > best_n:
                    best, best_n = key, n
        if own < len(held) and not np.array_equal(held, p):    # the join loses some of it
            self._save(ctl, slot, held, keep=best)
        if best is None:
            return 0
        e = self._entries[best]
        self._entries.move_to_end(best)
        if not ctl.restore_held(slot, e):
            return 0
        self.hits += 1
        self.tokens_restored += best_n
        return best_n

    def _save(self, ctl: Any, slot: int, held: np.ndarray, keep: Optional[int]) -> None:
        """Save what ``slot`` holds, dropping least recently used states for room (never
        ``keep``, the one about to be restored)."""
        if len(held) < self.min_tokens:
            return
        # a state holds every position of its tokens (attention KV without a window): a
        # longer one serves every prompt a shorter one does
        whole = not self.recurrent and ctl.n_swa == 0
        for key, e in self._entries.items():
            # held already (it, or more when states hold every position)
            if (len(e.tokens) == len(held) or (len(e.tokens) > len(held) and whole)
                    ) and _common(e.tokens, held) == len(held):
                self._entries.move_to_end(key)
                return
        saved = ctl.save_held(slot)
        kept = self._entries[keep].nbytes if keep is not None else 0
        if saved is None or kept + saved.nbytes > self.max_bytes:
            return
        if whole:                   # a saved prefix of ``held`` serves nothing it does not
            for key in [k for k, e in self._entries.items() if k != keep and
                        len(e.tokens) < len(held) and _common(e.tokens, held) == len(e.tokens)]:
                self._drop(key)
        while self.n_bytes + saved.nbytes > self.max_bytes:
            self._drop(next(k for k in self._entries if k != keep))
        self._entries[self._next] = saved
        self._next += 1
        self.n_bytes += saved.nbytes

    def _drop(self, key: int) -> None:
        self.n_bytes -= self._entries.pop(key).nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.n_bytes = 0

    def stats(self) -> Dict[str, int]:
        return {"entries": len(self._entries), "bytes": self.n_bytes, "hits": self.hits,
                "tokens_restored": self.tokens_restored}

    def held_prompts(self) -> List[List[int]]:
        """The token lists saved, least recently used first."""
        return [e.tokens.tolist() for e in self._entries.values()]
