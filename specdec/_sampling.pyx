# cython: language_level=3
# distutils: language = c++
"""Sampling: greedy argmax, and the target distribution for sampled decoding.

The order follows llama.cpp's default chain: top-k, top-p and min-p on the raw
logits, then temperature. A distribution is kept sparse (sorted ids and
probabilities) because the vocabulary can be 262k tokens wide and rejection
sampling needs p(x) and residuals, not only a draw.
"""
from libc.math cimport exp, log
from libc.stdint cimport int32_t, uint64_t
from libcpp.algorithm cimport sort, partial_sort
from libcpp.utility cimport pair
from libcpp.vector cimport vector

import numpy as np

from .config import Sampling

# a token whose logit is this far below the best has relative probability < e^-40:
# dropping it changes no float32 probability
DEF _CUTOFF = 40.0


cdef extern from *:
    """
    #include <math.h>
    #if defined(__AVX__)
    #include <immintrin.h>
    #endif
    /* First index of the maximum (llama.cpp's greedy tie rule), vectorised: one pass
       for the value, one for its first position. NaNs never win, as with `x > m`. */
    static int specdec_argmax(const float * x, int n) {
        float m = -INFINITY;
        int i = 0;
    #if defined(__AVX__)
        __m256 vm = _mm256_set1_ps(-INFINITY);
        for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(_mm256_loadu_ps(x + i), vm);
        float buf[8];
        _mm256_storeu_ps(buf, vm);
        for (int k = 0; k < 8; ++k) if (buf[k] > m) m = buf[k];
    #endif
        for (; i < n; ++i) if (x[i] > m) m = x[i];
        i = 0;
    #if defined(__AVX__)
        const __m256 vt = _mm256_set1_ps(m);
        for (; i + 8 <= n; i += 8) {
            int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_EQ_OQ));
            if (mask) return i + __builtin_ctz(mask);
        }
    #endif
        for (; i < n; ++i) if (x[i] == m) return i;
        return 0;
    }
    """
    int specdec_argmax(const float * x, int n) noexcept nogil


cdef int argmax(const float * x, int n) noexcept nogil:
    """Index of the first maximum: the tie rule of llama.cpp's greedy sampler."""
    return specdec_argmax(x, n)


cdef bint prob_at_least(const float * logits, int n, int32_t y, double p) noexcept nogil:
    """Whether softmax(logits[:n])[y] >= p (y the argmax): a drafter's p_min test."""
    if p <= 0.0:
        return True
    cdef double mx = logits[y], z = 0.0
    cdef int j
    for j in range(n):
        z += exp(logits[j] - mx)
    return 1.0 / z >= p


def argmax_py(x) -> int:
    """``argmax`` on a float32 array (for tests)."""
    cdef const float[::1] v = np.ascontiguousarray(x, dtype=np.float32)
    if v.shape[0] == 0:
        raise ValueError("empty array")
    return argmax(&v[0], v.shape[0])


cdef inline uint64_t _rotl(uint64_t x, int k) noexcept nogil:
    return (x << k) | (x >> (64 - k))


cdef class Rng:
    """xoshiro256**: small, fast, reproducible across platforms."""

    def __init__(self, seed=0):
        self.seed_c(<uint64_t>(int(seed) & 0xFFFFFFFFFFFFFFFF))

    cdef void seed_c(self, uint64_t seed) noexcept nogil:
        cdef uint64_t z
        cdef int i
        for i in range(4):  # splitmix64
            seed += 0x9E3779B97F4A7C15ULL
            z = seed
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
            self.s[i] = z ^ (z >> 31)

    cdef double uniform(self) noexcept nogil:
        """Uniform in [0, 1) with 53 random bits."""
        cdef uint64_t r = _rotl(self.s[1] * 5, 7) * 9
        cdef uint64_t t = self.s[1] << 17
        self.s[2] ^= self.s[0]
        self.s[3] ^= self.s[1]
        self.s[1] ^= self.s[2]
        self.s[0] ^= self.s[3]
        self.s[2] ^= t
        self.s[3] = _rotl(self.s[3], 45)
        return (r >> 11) * (1.0 / 9007199254740992.0)

    def random(self) -> float:
        return self.uniform()


cdef bint _desc(const pair[float, int32_t] & a, const pair[float, int32_t] & b) noexcept nogil:
    if a.first != b.first:
        return a.first > b.first
    return a.second < b.second


cdef class Distribution:

    cdef int from_logits(self, const float * logits, int n_vocab, SamplingParams sp) except -1 nogil:
        """The distribution of ``logits`` under ``sp``, whose values the API checked
        (``config.Sampling``); asserted here, not checked again."""
        assert sp.top_k >= 0 and 0.0 < sp.top_p <= 1.0 and 0.0 <= sp.min_p <= 1.0 and n_vocab > 0
        cdef vector[pair[float, int32_t]] cand
        cdef int i, n, keep
        cdef float mx = logits[0]
        cdef double t = sp.temperature if sp.temperature > 0 else 1.0
        for i in range(1, n_vocab):
            if logits[i] > mx:
                mx = logits[i]
        cdef float floor_ = mx - _CUTOFF * (t if t > 1.0 else 1.0)
        for i in range(n_vocab):
            if logits[i] >= floor_:
                cand.push_back(pair[float, int32_t](logits[i], i))
        n = cand.size()
        if sp.top_k > 0 and sp.top_k < n:
            partial_sort(cand.begin(), cand.begin() + sp.top_k, cand.end(), _desc)
            cand.resize(sp.top_k)
            n = sp.top_k
        else:
            sort(cand.begin(), cand.end(), _desc)
        # probabilities at temperature 1 for top-p / min-p, as llama.cpp does
        cdef double z = 0.0, c = 0.0
        self._work.resize(n)
        for i in range(n):
            self._work[i] = exp(cand[i].first - mx)
            z += self._work[i]
        keep = n
        if sp.top_p < 1.0:
            for i in range(n):
                c += self._work[i] / z
                if c >= sp.top_p:
                    keep = i + 1
                    break
        if sp.min_p > 0.0:
            for i in range(1, keep):
                if self._work[i] / self._work[0] < sp.min_p:
                    keep = i
                    break
        self.ids.resize(keep)
        self.probs.resize(keep)
        z = 0.0
        for i in range(keep):
            self.ids[i] = cand[i].second
            self.probs[i] = exp((cand[i].first - mx) / t)
            z += self.probs[i]
        for i in range(keep):
            self.probs[i] = self.probs[i] / z
        return 0

    cdef float prob_of(self, int32_t tok) noexcept nogil:
        cdef size_t i
        for i in range(self.ids.size()):
            if self.ids[i] == tok:
                return self.probs[i]
        return 0.0

    cdef int32_t sample(self, Rng rng) noexcept nogil:
        cdef double u = rng.uniform(), c = 0.0
        cdef size_t i
        for i in range(self.ids.size()):
            c += self.probs[i]
            if u < c:
                return self.ids[i]
        return self.ids[self.ids.size() - 1]

    cdef int32_t sample_residual(self, Rng rng, const int32_t * q_ids, const float * q_probs,
                                 int q_n) noexcept nogil:
        """Draw from norm(max(0, p - q)): the correction after a rejected draft."""
        cdef size_t i
        cdef int j
        cdef double z = 0.0, c = 0.0, r, u
        self._work.resize(self.ids.size())
        for i in range(self.ids.size()):
            r = self.probs[i]
            for j in range(q_n):
                if q_ids[j] == self.ids[i]:
                    r = r - q_probs[j]
                    break
            self._work[i] = r if r > 0 else 0.0
            z += self._work[i]
        if z <= 0.0:
            return self.sample(rng)
        u = rng.uniform() * z
        for i in range(self.ids.size()):
            c += self._work[i]
            if u < c and self._work[i] > 0:
                return self.ids[i]
        for i in range(self.ids.size() - 1, -1, -1):
            if self._work[i] > 0:
                return self.ids[i]
        return self.ids[0]

    # Python access, for tests and Python drafters
    def set_logits(self, logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
        """The target's distribution for ``logits`` (1-D): top-k, top-p and min-p, then
        ``temperature`` (0 counts as 1 here: the distribution greedy decoding takes the
        argmax of). The settings follow :class:`specdec.Sampling`'s rules."""
        s = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        cdef const float[::1] l = np.ascontiguousarray(logits, dtype=np.float32)
        if l.shape[0] == 0:
            raise ValueError("empty logits")
        cdef SamplingParams sp
        sp.temperature = s.temperature
        sp.top_k = s.top_k
        sp.top_p = s.top_p
        sp.min_p = s.min_p
        self.from_logits(&l[0], l.shape[0], sp)
        return self

    def as_dict(self) -> dict:
        return {int(self.ids[i]): float(self.probs[i]) for i in range(self.ids.size())}
