# cython: language_level=3
"""The MTP drafter (declared so that a test-only subclass can chain copies of one head)."""
from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

from .._core cimport Model, Context
from ._base cimport Draft, Asks
from ._target_fed cimport TargetFedDrafter


cdef class MtpDrafter(TargetFedDrafter):
    cdef readonly Model mtp_model
    cdef readonly Context mtp_ctx        # head 0 (fed_ctxs: one per head)
    cdef object _source
    cdef int n_threads
    cdef readonly int n_heads            # >1: chained heads
    cdef int n_vocab_draft               # ids both vocabularies have (a head file may differ)
    cdef vector[float] chain_h           # chained heads: the rows of the prefix being drafted
    cdef vector[int32_t] chain_tok
    cdef Asks one                        # chained heads: a single ``propose`` as one ask

    cdef int _head_count(self, Model mm) except -1
    cdef int bind_c(self, Context target, int n_seq) except -1
    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1
    cdef bint _confident(self, const float * lg, int32_t y) noexcept nogil
    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1
    cdef int _start_asks(self, Asks asks, vector[int] & p0, vector[char] & live) except -1
    cdef int _propose_batch(self, Asks asks) except -1
    cdef int _propose_chain(self, Asks asks) except -1
