# cython: language_level=3
from libc.stdint cimport int32_t, uint32_t
from libcpp.vector cimport vector
from .drafters._base cimport Draft


cdef class GrammarState:
    cdef object matcher          # llguidance.LLMatcher of one request
    cdef vector[uint32_t] bits   # the last mask computed (one bit per token id)
    cdef bint fresh              # ``bits`` is the mask of the state as it is now
    cdef vector[uint32_t] ahead  # masks of rows further on (``whole_ahead``), one per token of
    cdef vector[int32_t] ahead_path  # ... this path from the state it was computed at
    cdef int ahead_at            # tokens of the path the state has gone on by since (advance_c):
                                 # the state's mask, while not fresh, is ``ahead``'s ahead_at - 1
    cdef readonly int n_ahead    # masks computed ahead of the state so far
    cdef readonly int n_reused   # masks of rows taken from those computed ahead
    cdef int n_vocab
    cdef int32_t eos             # allowed alone when the matcher fails mid-request
    cdef readonly int n_masks    # rows masked so far
    cdef readonly int n_forced   # tokens of drafts the grammar forced
    cdef readonly int n_cut      # draft tokens the grammar refused before they were verified
    cdef bint replaced           # the last fit_draft_c replaced the proposal by forced tokens
    cdef vector[int32_t] forced  # the tokens the grammar forces now (``forced_c``)
    cdef bint forced_known       # ``forced`` is of the state as it is now
    cdef readonly int n_after_forced  # draft tokens proposed past a forced run, kept for verify
    cdef readonly str error      # the matcher's error, if it failed mid-request

    cdef const uint32_t * bits_c(self) except NULL
    cdef void apply_c(self, float * logits) noexcept nogil
    cdef int mask_c(self, float * logits) except -1
    cdef int whole_ahead(self, const int32_t * toks, int n, int sparse_head) except -1
    cdef bint allowed_c(self, int32_t tok) noexcept nogil
    cdef int advance_c(self, int32_t tok) except -1
    cdef const vector[int32_t] * forced_c(self) except NULL
    cdef int fit_draft_c(self, Draft draft, int k_cap) except -1
