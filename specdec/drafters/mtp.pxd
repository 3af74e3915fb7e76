# cython: language_level=3
"""The MTP drafter (declared so that a test-only subclass can chain copies of one head)."""
from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

from .._core cimport Model, Context, Batch
from ._base cimport Drafter, Draft


cdef class MtpDrafter(Drafter):
    cdef readonly Model mtp_model
    cdef readonly Context mtp_ctx        # head 0; the only context of a single-head model
    cdef list head_ctxs                  # chained heads: one context per head
    cdef Batch batch                     # the queued catch-up, then the draft rows
    cdef object _source
    cdef int n_threads
    cdef readonly int n_heads            # >1: chained heads
    cdef int n_embd
    cdef int n_vocab_draft               # ids both vocabularies have (a head file may differ)
    cdef vector[vector[float]] pend      # per seq: target row of the last committed token
    cdef vector[int32_t] n_sync          # per seq: positions whose row is in the MTP KV or queued
    cdef vector[int32_t] kept_tok        # per seq: token of the draft row kept at n_sync-1, or -1
    cdef vector[float] chain_h           # chained heads: the rows of the prefix being drafted
    cdef vector[int32_t] chain_tok
    cdef vector[int32_t] idle            # per seq: rounds observed since its last propose
    cdef int64_t n_decodes, n_catchup, n_flushes, n_skipped
    cdef double t_decode                 # seconds spent in MTP decodes

    cdef int _head_count(self, Model mm) except -1
    cdef int bind_c(self, Context target, int n_seq) except -1
    cdef int _check_bound(self, int seq) except -1
    cdef int _flush(self) except -1
    cdef int _queue(self, int32_t tok, int pos, int seq, const float * row) except -1
    cdef int _drop_queued(self, int seq, int n_drop=*) noexcept nogil
    cdef int _skip_old(self, int seq) noexcept nogil
    cdef int _forget(self, int seq) except -1
    cdef int _trim(self, int seq, int keep) except -1
    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1
    cdef int _reset(self, int seq) except -1
    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1
    cdef bint _confident(self, const float * lg, int32_t y) noexcept nogil
    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1
    cdef int _propose_chain(self, int seq, int32_t last, int n_max, Draft out) except -1
