# cython: language_level=3
"""The drafter interface as the controller sees it (C-level hooks)."""
from libc.stdint cimport int32_t
from libcpp.vector cimport vector
from .._core cimport Context, TargetView


cdef class Draft:
    """One proposal: tokens, and optionally a sparse draft distribution per token."""
    cdef vector[int32_t] tokens
    cdef vector[int32_t] q_ids      # ids of position i: q_ids[q_off[i]:q_off[i+1]]
    cdef vector[float] q_probs
    cdef vector[int32_t] q_off
    cdef bint has_probs
    cdef void clear(self) noexcept nogil


cdef class Drafter:
    cdef public str name
    cdef readonly int n_vocab
    cdef Context _target                # the target itself, for C-level drafters
    cdef readonly TargetView target     # what Python code of a drafter sees (read only)
    cdef vector[vector[int32_t]] hist   # per sequence: prompt + accepted tokens
    cdef bint _py_observe, _py_accept, _py_begin, _py_reset
    cdef double t_sync                  # seconds of the last propose_c spent catching up with
                                        # history rather than drafting (the policy leaves it out)

    cdef int _grow(self, int seq) except -1
    cdef int bind_c(self, Context target, int n_seq) except -1
    cdef int begin_c(self, int seq, const int32_t * toks, int n) except -1
    cdef int observe_c(self, int seq, const int32_t * toks, int n, int row0) except -1
    cdef int propose_c(self, int seq, int32_t last, int n_max, Draft out) except -1
    cdef int accept_c(self, int seq, int n_accepted) except -1
    cdef int reset_c(self, int seq) except -1
