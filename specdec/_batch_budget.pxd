# cython: language_level=3
"""The draft budget of a round as the controller calls it (see ``_batch_budget.pyx``)."""
from libcpp.vector cimport vector

from ._policy cimport DraftPolicy


cdef class Acceptance:
    cdef int n_max
    cdef vector[double] n_alpha      # decayed trials of draft position i (this request)
    cdef vector[double] s_alpha      # decayed acceptances
    cdef vector[double] prior        # the shared policy's alpha_i when the request began
    cdef void begin(self, DraftPolicy shared) noexcept
    cdef void observe(self, int k, int a) noexcept
    cdef double alpha(self, int i) noexcept
    cdef double gain(self, int i) noexcept


cdef int allocate(int n, const int * k_max, const double * gain, int stride,
                  const double * row_cost, double tokens, double time, double margin,
                  int * k_out) noexcept
