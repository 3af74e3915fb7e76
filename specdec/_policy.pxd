# cython: language_level=3
from libcpp.vector cimport vector

cdef class DraftPolicy:
    cdef readonly int n_max
    cdef readonly bint adaptive
    cdef vector[double] t_verify     # EMA of a verify decode with k drafts (seconds), 0 = unknown
    cdef vector[double] n_verify
    cdef vector[double] alpha        # EMA of P(draft i accepted | drafts < i accepted)
    cdef vector[double] n_alpha
    cdef double t_draft_tok          # EMA of drafting time per drafted token
    cdef long rounds
    cdef int current
    cdef double _t(self, int k) noexcept
    cdef int next_len(self) noexcept
    cdef void observe(self, int k, int a, double t_dec) noexcept
    cdef void observe_draft_time(self, int k, double t) noexcept
