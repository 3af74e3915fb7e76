# cython: language_level=3
from libc.stdint cimport int32_t

cdef float token_logprobs(const float * logits, int n_vocab, int32_t tok, int n_top,
                          int32_t * top_ids, float * top_lp) noexcept nogil
