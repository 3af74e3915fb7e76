# cython: language_level=3
"""The suffix drafter (declared for the test hooks, which read its trees)."""
from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

from .._core cimport Context
from ._base cimport Drafter, Draft
from ._suffix_tree cimport SuffixTree


cdef class SuffixDrafter(Drafter):
    cdef readonly int max_depth
    cdef readonly double spec_factor
    cdef readonly double spec_offset
    cdef readonly int64_t max_corpus_tokens
    cdef SuffixTree corpus
    cdef list local                  # per sequence: SuffixTree over its prompt and accepted tokens
    cdef vector[int] gen_start       # per sequence: where its generation starts in hist
    cdef int32_t corpus_max_tok
    cdef vector[int32_t] ctx, draft_a, draft_b

    cdef int bind_c(self, Context target, int n_seq) except -1
    cdef SuffixTree _local(self, int seq)
    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1
    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1
    cdef int _reset(self, int seq) except -1
    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1
    cdef int _commit(self, int seq) except -1
    cdef void _add_c(self, const int32_t * toks, int64_t n) noexcept
    cdef SuffixTree _tree(self, int seq)
