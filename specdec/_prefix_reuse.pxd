# cython: language_level=3
"""Prefix reuse: what a join keeps of what its slot held (see ``_prefix_reuse.pyx``)."""
from libc.stdint cimport int32_t

from ._core cimport Context
from ._seq cimport _Seq


cdef class HeldState:
    cdef readonly object tokens     # int32 array
    cdef readonly bytes state
    cdef readonly int window_start
    cdef readonly int win_n, win_start
    cdef readonly bytes win_state


cdef class PrefixReuse:
    cdef Context ctx
    cdef int n_swa          # sliding-window layers of an attention-only target: their window
    cdef bint recurrent     # recurrent or hybrid: a state is kept only where it ends
    cdef bint exact
    cdef int kept(self, const int32_t * held, int n_held, int pos_min, const int32_t * toks,
                  int n) noexcept
    cdef int best(self, const int32_t * held, int n_held, int pos_min, int win_n, int win_start,
                  const int32_t * toks, int n, bint * window) noexcept
    cdef bint holds(self, _Seq s) noexcept
    cdef int join(self, _Seq s, const int32_t * toks, int n, bint reuse) except -1
    cdef int reusable(self, _Seq s, prompt) except -1
    cdef int kept_prefix(self, HeldState held, prompt) except -1
    cdef int window_start(self, int seq) except? -2
    cdef int save_window(self, _Seq s) except -1
    cdef HeldState save(self, _Seq s)
    cdef bint restore(self, _Seq s, HeldState held) except -1
