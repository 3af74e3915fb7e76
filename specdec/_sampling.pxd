# cython: language_level=3
"""Token sampling shared by plain decoding, verification and drafters."""
from libc.stdint cimport int32_t, uint64_t
from libcpp.vector cimport vector
from libcpp.utility cimport pair
from libcpp.unordered_set cimport unordered_set


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
    """The target's sampling distribution after top-k / top-p / min-p / temperature:
    sparse (``ids`` by probability, ``probs``) or dense (weights by id; see the class)."""
    cdef bint dense
    cdef int n_vocab                  # dense: the row's width
    cdef vector[int32_t] ids          # sparse: the candidates, most probable first
    cdef vector[float] probs          # sparse: their probabilities; dense: weights by id
    cdef vector[double] blocks        # dense: sums of ``probs`` per SPECDEC_BLOCK ids
    cdef double total                 # dense: the sum of ``probs``
    cdef vector[float] _work
    cdef vector[double] _wblocks
    cdef vector[int32_t] _idx
    cdef vector[pair[float, int32_t]] _cand
    cdef unordered_set[int32_t] _seen
    cdef int from_logits(self, const float * logits, int n_vocab, SamplingParams sp) except -1 nogil
    cdef int _one(self, int32_t tok) noexcept nogil
    cdef float _kth_threshold(self, const float * logits, int n, float mx, float floor_,
                              int k) noexcept nogil
    cdef double _nucleus_threshold(self, const float * logits, int n, float mx, float floor_,
                                   double top_p, float * theta) noexcept nogil
    cdef int _cut(self, const float * logits, int n_vocab, float mx, double t, float theta,
                  double z_all, SamplingParams sp) except -2 nogil
    cdef int32_t _residual_dense(self, Rng rng, const int32_t * q_ids, const float * q_probs,
                                 int q_n) noexcept nogil
    cdef float prob_of(self, int32_t tok) noexcept nogil
    cdef int32_t sample(self, Rng rng) noexcept nogil
    cdef int32_t sample_residual(self, Rng rng, const int32_t * q_ids, const float * q_probs,
                                 int q_n) noexcept nogil
