# cython: language_level=3
"""A drafter whose own context is fed the target's rows (declared for the drafters built on it)."""
from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

from .._core cimport Context, Batch
from ._base cimport Drafter


cdef class TargetFedDrafter(Drafter):
    cdef list fed_ctxs                   # the drafter's contexts the queued rows go into
    cdef Batch batch                     # a draft step's rows: catch-up, then the draft rows
    cdef int q_cap                       # rows a sequence's queue holds before it is decoded
    cdef vector[vector[int32_t]] q_tok   # per seq: the queued pairs' tokens,
    cdef vector[vector[int32_t]] q_pos   # ... positions
    cdef vector[vector[float]] q_row     # ... and rows (n_embd floats each)
    cdef int n_embd                      # floats per fed row
    cdef vector[vector[float]] pend      # per seq: the fed row waiting for the next token
    cdef vector[int32_t] n_sync          # per seq: positions whose row is in the KV or queued
    cdef vector[int32_t] kept_tok        # per seq: token of the seed row kept at n_sync-1, or -1
    cdef int64_t n_decodes, n_catchup, n_caught_up, n_flushes
    cdef double t_decode                 # seconds spent in the drafter's decodes

    cdef int _bind_fed(self, list ctxs, int n_seq, int cap, int n_embd) except -1
    cdef int _check_bound(self, int seq) except -1
    cdef int _flush_batch(self) except -1
    cdef int _load(self, int seq) except -1
    cdef int _flush(self) except -1
    cdef int _flush_seq(self, int seq) except -1
    cdef int n_queued(self, int seq) noexcept
    cdef int _queue(self, int32_t tok, int pos, int seq, const float * row) except -1
    cdef int _unqueue_from(self, int seq, int keep) except -1
    cdef int _forget(self, int seq) except -1
    cdef int _trim(self, int seq, int keep) except -1
    cdef int _seed_kept(self, int seq, int q, int32_t tok) except -1
    cdef int _sync_at(self, int seq, int q) except -1
    cdef int _keep_seed(self, int seq, int q, int32_t tok, int n_dec) except -1
    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1
    cdef int _reset(self, int seq) except -1
