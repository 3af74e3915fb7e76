# cython: language_level=3
from libc.stdint cimport int32_t
from libcpp.vector cimport vector


cdef class Penalty:
    cdef int n_vocab
    cdef float repetition, presence, frequency
    cdef bint active
    cdef vector[int32_t] count        # per token: times in the output so far
    cdef vector[int32_t] out_ids      # the distinct tokens of the output
    cdef vector[char] in_prompt       # per token: in the prompt (repetition penalty)
    cdef vector[int32_t] prompt_ids   # the distinct prompt tokens
    cdef vector[float] bias           # per token: logit_bias (empty: none)
    cdef vector[int32_t] bias_ids
    cdef vector[char] saved           # per token: its raw logit is in saved_*
    cdef vector[int32_t] saved_ids
    cdef vector[float] saved_vals

    cdef void _one(self, float * logits, int32_t t) noexcept nogil
    cdef void push(self, int32_t tok) noexcept nogil
    cdef void apply(self, float * logits, const int32_t * before, int n_before) noexcept nogil
    cdef void restore(self, float * logits) noexcept nogil
