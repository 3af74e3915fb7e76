# cython: language_level=3
"""The batch's measured draft length as the round calls it (see ``_batch_length.pyx``)."""
from libcpp.vector cimport vector


cdef class BatchLength:
    cdef int n_seq_max
    # per number of running sequences n, per cap k: decayed tokens, seconds and weight of
    # the rounds at that cap, and their count
    cdef vector[vector[double]] tok, sec, w
    cdef vector[vector[int]] cnt
    cdef vector[int] best            # the best cap at n (-1: none yet)
    cdef vector[int] rounds          # rounds decided at n
    cdef vector[int] side            # the cap tried last at n (0 below, 1 above, 2 far)
    cdef vector[int] up_gap, up_last # plain best at n: rounds between tries of cap 1, the last
    cdef vector[double] prompt_sec, prompt_w  # per n: decayed prompt catch-up seconds, rounds
    cdef vector[double] try_cost     # per n: seconds a try of drafting cost past plain's rate
    cdef readonly long n_rounds      # rounds whose length was the batch's
    cdef readonly long n_switches    # times a best cap changed
    cdef int kind                    # this round: 0 not the batch's, 1 the batch's
    cdef int n_in, k_round           # its sequences and its cap
    cdef long tokens0                # their tokens when it began
    cdef readonly bint steady        # a new shape is dear (a CUDA target): changed caps held
    cdef int last_n, last_k          # steady: the last round's size and cap
    cdef int hold_left               # steady: rounds the changed cap is still held (not measured)
    cdef void _size(self, int n, int k_top) noexcept
    cdef double rate(self, int n, int k) noexcept
    cdef bint _measured(self, int n, int k) noexcept
    cdef int _start(self, int n, int k_top) noexcept
    cdef int _far(self, int n, int b, int k_top) noexcept
    cdef int decide(self, int n, int k_top) noexcept
    cdef int _decide(self, int n, int k_top) noexcept
    cdef void observe(self, int n, int k, double tokens, double t) noexcept
    cdef void charge_prompt(self, int n, double t) noexcept
    cdef double prompt_per_round(self, int n) noexcept
    cdef void charge_try(self, int n, int k, double tokens, double t, double t_caught) noexcept
    cdef int _try_gap(self, int n) noexcept
    cdef void take(self, int n, int k, double tokens, double t, double t_prompt,
                   double t_caught) noexcept
    cdef int judge(self, list seqs) except -1
    cdef int settle(self, list seqs, double t) except -1


cdef bint set_expected_tokens(bint on) noexcept
