# cython: language_level=3
"""Token sampling shared by plain decoding, verification and drafters."""
from libc.stdint cimport int32_t, uint64_t
from libcpp.vector cimport vector
from libcpp.unordered_set cimport unordered_set


cdef extern from "_candidates.h" nogil:
    cdef struct specdec_cand:
        float x      # the logit
        int32_t id
        double w     # exp(x - max), temperature 1


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
    sparse (``ids``, ``probs``) or dense (weights by id; see the class)."""
    cdef bint dense
    cdef int n_vocab                  # dense: the row's width
    cdef vector[int32_t] ids          # sparse: the tokens it can draw
    cdef vector[float] probs          # sparse: their probabilities; dense: weights by id
    cdef vector[double] blocks        # dense: sums of ``probs`` per SPECDEC_BLOCK ids
    cdef double total                 # dense: the sum of ``probs``
    cdef vector[float] _work
    cdef vector[double] _wblocks
    cdef vector[specdec_cand] _cands  # sparse: the candidates, the kept ones first
    cdef float _gap                   # top-p: where the last row's cut lay below the max
    cdef unordered_set[int32_t] _seen
    cdef int from_logits(self, const float * logits, int n_vocab, SamplingParams sp) except -1 nogil
    cdef int _one(self, int32_t tok) noexcept nogil
    cdef int _drop_below(self, float theta) noexcept nogil
    cdef int _nucleus(self, const float * logits, int n, float mx, float floor_, float theta_m,
                      double top_p) noexcept nogil
    cdef int _normalise(self, int keep, float mx, double t, double min_p) noexcept nogil
    cdef int32_t _residual_dense(self, Rng rng, const int32_t * q_ids, const float * q_probs,
                                 int q_n) noexcept nogil
    cdef float prob_of(self, int32_t tok) noexcept nogil
    cdef int32_t sample(self, Rng rng) noexcept nogil
    cdef int32_t sample_residual(self, Rng rng, const int32_t * q_ids, const float * q_probs,
                                 int q_n) noexcept nogil
