# cython: language_level=3
"""Token sampling shared by plain decoding, verification and drafters."""
from libc.stdint cimport int32_t, uint64_t
from libcpp.vector cimport vector


cdef struct SamplingParams:
    float temperature     # <= 0: greedy
    int top_k             # 0: off
    float top_p           # 1: off
    float min_p           # 0: off


cdef int argmax(const float * x, int n) noexcept nogil
cdef bint prob_at_least(const float * logits, int n, int32_t y, double p) noexcept nogil


cdef class Rng:
    cdef uint64_t s[4]
    cdef void seed_c(self, uint64_t seed) noexcept nogil
    cdef double uniform(self) noexcept nogil


cdef class Distribution:
    """A sparse distribution over token ids: the target's sampling distribution
    after top-k / top-p / min-p / temperature, sorted by probability."""
    cdef vector[int32_t] ids
    cdef vector[float] probs
    cdef vector[float] _work
    cdef int from_logits(self, const float * logits, int n_vocab, SamplingParams sp) except -1 nogil
    cdef float prob_of(self, int32_t tok) noexcept nogil
    cdef int32_t sample(self, Rng rng) noexcept nogil
    cdef int32_t sample_residual(self, Rng rng, const int32_t * q_ids, const float * q_probs,
                                 int q_n) noexcept nogil
