# cython: language_level=3
"""The batch's floor as the round calls it (see ``_batch_floor.pyx``)."""
from libcpp.vector cimport vector


cdef class BatchFloor:
    cdef int n_max
    # per number of running sequences n: decayed tokens, seconds and samples of the rounds
    # without drafts (plain) and of the rounds the adaptive policies drafted in
    cdef vector[double] p_tok, p_t, p_n, d_tok, d_t, d_n
    cdef vector[int] rounds          # rounds asked at n
    cdef vector[int] off_left        # rounds still held plain at n (drafting off)
    cdef vector[int] gap             # the next pause at n, once a probe fails
    cdef vector[int] probe_left      # drafting rounds left in the probe under way at n
    cdef readonly long n_held         # rounds held plain, in all
    cdef readonly long n_off          # times drafting was turned off
    cdef int kind                    # this round: 0 not judged, 1 plain, 2 adaptive drafts
    cdef int n_in, tokens0           # its sequences, and their tokens when it began
    cdef bint allow(self, int n) noexcept
    cdef void observe(self, int n, bint drafting, double tokens, double t) noexcept
    cdef int judge(self, list seqs) except -1
    cdef int settle(self, list seqs, double t) except -1
