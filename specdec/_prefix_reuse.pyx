# cython: language_level=3
# distutils: language = c++
"""Prefix reuse: a request joining a slot keeps the target's memory of the longest prefix of
its prompt the slot still holds, and decodes only the rest.

The slot's memory is what its ``_SeqMemory.tokens`` say, as long as nothing else used the
context (``holds``). What may be kept depends on the memory:

- attention KV: any prefix, though the last prompt token is decoded again for its logits;
- a recurrent state: only where the memory ends (it cannot be cut back);
- sliding-window layers without a full cache (``swa_full=False``): a cut back to ``c``
  keeps the window of position ``c`` only if those layers still hold it. A window cache
  drops what falls out of the window as it goes, so a join with reuse keeps a checkpoint of
  the window layers at its prompt's end (``save_window``): a later request with the same
  prompt (another answer to the same question) keeps the prompt, as llama-server's context
  checkpoints do.

``HeldState`` is what a free slot held, saved for a prompt cache (``save``, ``restore``;
``specdec.prompt_cache`` decides what to keep).
"""
from libc.stdint cimport int32_t, uint8_t
from libcpp.vector cimport vector

import numpy as np

from ._llama cimport LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from ._seq cimport _SeqMemory


cdef class HeldState:
    """What a free slot held, saved by ``Controller.save_held`` for a prompt cache: its
    tokens, the target's state of them, and, with sliding-window layers, the first position
    that state's window holds and the prompt-end checkpoint of the window (``save_window``),
    which serves a join that cuts back to the prompt's end."""

    @property
    def nbytes(self) -> int:
        return len(self.state) + (len(self.win_state) if self.win_state is not None else 0)


cdef class PrefixReuse:
    """PrefixReuse(ctx, n_swa, exact)
--

    Prefix reuse on the slots of ``ctx`` (``n_swa``: the window of an attention-only
    target's sliding-window layers, else 0)."""

    def __init__(self, Context ctx not None, int n_swa, bint exact):
        self.ctx = ctx
        self.n_swa = n_swa
        self.recurrent = ctx.model.is_recurrent or ctx.model.is_hybrid
        self.exact = exact

    cdef int kept(self, const int32_t * held, int n_held, int pos_min, const int32_t * toks,
                  int n) noexcept:
        """Tokens of ``toks[:n]`` a join with reuse keeps of a memory holding ``held[:n_held]``
        whose sliding-window layers hold positions ``pos_min..``."""
        cdef int c = 0
        while c < n and c < n_held and held[c] == toks[c]:
            c += 1
        if c == n:
            c = n - 1
        if self.recurrent and (c != n_held or (self.exact and n - c < 2)):
            return 0
        if self.n_swa > 0 and c > 0 and not 0 <= pos_min <= min(c - 1, max(0, c - self.n_swa + 1)):
            return 0
        return c

    cdef int best(self, const int32_t * held, int n_held, int pos_min, int win_n, int win_start,
                  const int32_t * toks, int n, bint * window) noexcept:
        """``kept`` of the whole memory, or of its prompt-end window checkpoint (``win_n``
        tokens, holding ``win_start..``) where that keeps more (``window[0]`` set)."""
        cdef int c = self.kept(held, n_held, pos_min, toks, n), c_win = 0
        if 0 < win_n <= n_held:
            c_win = self.kept(held, win_n, win_start, toks, n)
        window[0] = c_win > c
        return max(c, c_win)

    cdef bint holds(self, _Seq s) noexcept:
        """The slot's memory is what ``s.mem.tokens`` says (a caller may have used the
        context)."""
        return self.ctx.pos_max_c(s.id) == <int>s.mem.tokens.size() - 1

    cdef int join(self, _Seq s, const int32_t * toks, int n, bint reuse) except -1:
        """The memory of ``s`` cut to what a join of ``toks[:n]`` keeps (nothing without
        ``reuse``); returns the tokens kept."""
        cdef _SeqMemory m = s.mem
        cdef int c = 0
        cdef bint window = False
        if reuse and self.holds(s):
            c = self.best(m.tokens.data(), m.tokens.size(), self.ctx.pos_min_c(s.id), m.win_n,
                          m.win_start, toks, n, &window)
            if window:      # back to the prompt-end window; the other layers hold it all
                try:
                    self.ctx.load_state_c(s.id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, m.win_state)
                except ValueError:
                    c = 0
        if c > 0:
            if not self.ctx.seq_rm_c(s.id, c, -1):
                c = 0
        if c == 0:
            self.ctx.seq_rm_c(s.id, -1, -1)
        if c < m.win_n:
            m.forget_window()
        m.tokens.resize(c)
        return c

    cdef int reusable(self, _Seq s, prompt) except -1:
        """Tokens a join of ``prompt`` with reuse on free slot ``s`` would keep."""
        cdef _SeqMemory m = s.mem
        cdef bint window
        if s.active or m.tokens.size() == 0 or not self.holds(s):
            return 0
        cdef vector[int32_t] toks = _tokens(prompt)
        return self.best(m.tokens.data(), m.tokens.size(), self.ctx.pos_min_c(s.id), m.win_n,
                         m.win_start, toks.data(), toks.size(), &window)

    cdef int kept_prefix(self, HeldState held, prompt) except -1:
        """Tokens a join of ``prompt`` with reuse keeps of the slot state ``held`` once
        ``restore`` put it back."""
        cdef vector[int32_t] h = _tokens(held.tokens), toks = _tokens(prompt)
        cdef bint window
        return self.best(h.data(), h.size(), held.window_start, held.win_n, held.win_start,
                         toks.data(), toks.size(), &window)

    cdef int window_start(self, int seq) except? -2:
        """The first position whose cells a state of ``seq`` saved now holds in the sliding-
        window layers (llama.cpp writes only the window of the last position); 0 without."""
        if self.n_swa == 0:
            return 0
        cdef int p0 = self.ctx.pos_min_c(seq), p1 = self.ctx.pos_max_c(seq)
        return max(p0, p1 - self.n_swa + 1) if p1 >= 0 else 0

    cdef int save_window(self, _Seq s) except -1:
        """After a prompt is in: keep the window layers' state of its end (see the module
        docstring). Only for joins with reuse, and where the request may outrun the window:
        before that, the window of its end holds the prompt's."""
        cdef _SeqMemory m = s.mem
        m.forget_window()
        cdef int n = m.tokens.size()
        if not s.req.reuse or self.n_swa == 0 or n < 2 or (
                n + s.req.out.max_tokens <= self.n_swa):
            return 0
        self.ctx.save_state_c(s.id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, m.win_state)
        m.win_n = n
        m.win_start = self.window_start(s.id)
        return 0

    cdef HeldState save(self, _Seq s):
        """What free slot ``s`` holds, or None when it holds nothing, or its memory is not
        what its tokens say."""
        cdef _SeqMemory m = s.mem
        if m.tokens.size() == 0 or not self.holds(s):
            return None
        cdef HeldState h = HeldState()
        h.tokens = np.asarray([m.tokens[i] for i in range(m.tokens.size())], dtype=np.int32)
        h.window_start = self.window_start(s.id)
        h.state = self.ctx.save_state(s.id)
        if 0 < m.win_n <= <int>m.tokens.size():
            h.win_n = m.win_n
            h.win_start = m.win_start
            h.win_state = (<char *> m.win_state.data())[:m.win_state.size()]
        return h

    cdef bint restore(self, _Seq s, HeldState held) except -1:
        """Free slot ``s``, holding nothing, holds ``held`` again; False, the slot still
        holding nothing, when llama.cpp could not place it (no room in the cache)."""
        cdef _SeqMemory m = s.mem
        cdef int i, n = len(held.tokens)
        try:
            self.ctx.load_state(held.state, s.id)
        except ValueError:
            self.ctx.seq_rm_c(s.id, -1, -1)
            return False
        if self.ctx.pos_max_c(s.id) != n - 1:
            self.ctx.seq_rm_c(s.id, -1, -1)
            return False
        m.tokens.resize(n)
        for i in range(n):
            m.tokens[i] = held.tokens[i]
        m.n_past = n
        if held.win_n > 0:
            m.win_state.assign(<const uint8_t *> (<const char *> held.win_state),
                               <const uint8_t *> (<const char *> held.win_state) + len(held.win_state))
            m.win_n = held.win_n
            m.win_start = held.win_start
        return True


cdef vector[int32_t] _tokens(seq):
    cdef vector[int32_t] v
    v.reserve(len(seq))
    for t in seq:
        v.push_back(t)
    return v
