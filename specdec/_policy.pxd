# cython: language_level=3
from libcpp.vector cimport vector

cdef class DraftPolicy:
    cdef readonly int n_max
    cdef readonly bint adaptive
    cdef vector[double] t_verify     # EMA of a verify decode of k+1 rows (seconds)
    cdef vector[double] n_verify
    cdef vector[double] alpha        # EMA of P(draft i accepted | drafts < i accepted)
    cdef vector[double] n_alpha
    cdef double t_draft              # EMA of a drafter call (seconds)
    cdef long rounds
    cdef long idle                   # rounds since drafting last paid
    cdef int current
    cdef double _t(self, int k) noexcept
    cdef double _rate(self, int k) noexcept
    cdef int cap(self) noexcept
    cdef int choose(self, int proposed) noexcept
    cdef void observe(self, int k, int a, double t_dec) noexcept
    cdef void observe_draft_time(self, int k, double t) noexcept
