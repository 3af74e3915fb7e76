# cython: language_level=3
# distutils: language = c++
"""Sampling: greedy argmax, and the target distribution for sampled decoding.

The order follows llama.cpp's default chain: top-k, top-p and min-p on the raw
logits, then temperature. The vocabulary can be 262k tokens wide and rejection
sampling needs p(x) and residuals, not only a draw, so a distribution is kept
sparse (the few candidates top-k / top-p / min-p leave, found by a partial selection
without sorting the vocabulary: ``_candidates.h``) or, with temperature alone, dense
(weights by id and block sums: no sort at all).
"""
from libc.math cimport exp, log, INFINITY
from libc.stdint cimport int32_t, int64_t, uint64_t
from libcpp.vector cimport vector

import numpy as np

from .config import Sampling

# a token whose logit is this far below the best has relative probability < e^-40:
# dropping it changes no float32 probability
DEF _CUTOFF = 40.0


cdef extern from "_logit_kernels.h" nogil:
    enum: SPECDEC_BLOCK
    float specdec_max(const float * x, int n)
    double specdec_exp_sum(const float * x, int n, float mx, float floor_)
    double specdec_dense(const float * x, int n, float mx, float floor_, float inv_t, float * w,
                         double * blocks)
    int specdec_draw(const float * w, int n, const double * blocks, double u)


cdef extern from "_candidates.h" nogil:
    void specdec_top_k(const float * x, int n, int k, float floor_, vector[specdec_cand] & c)
    double specdec_mass_collect(const float * x, int n, float mx, float floor_, float theta,
                                vector[specdec_cand] & c)
    void specdec_collect_band(const float * x, int n, float lo, float hi,
                              vector[specdec_cand] & c)
    double specdec_weigh(specdec_cand * c, int m, float mx)
    int specdec_nucleus(specdec_cand * c, int m, double need)


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
    cdef float mx = logits[y]
    return 1.0 / specdec_exp_sum(logits, n, mx, mx - _CUTOFF) >= p


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


# the min-p bound is collected this far below max + log(min_p) (nats), against the rounding
# of the vectorised exp; the exact test follows on the candidates' weights
cdef double _MINP_MARGIN = 1e-3
# the first guess of how far below the maximum logit top-p's cut lies (nats); each row
# then starts from the last row's cut plus _GAP_SLACK
cdef float _GAP_START = 8.0
cdef float _GAP_SLACK = 2.0


cdef class Distribution:
    """The target's sampling distribution for one row of logits.

    Built as llama.cpp's sampler chain is: a candidate set is cut (top-k, top-p, min-p)
    by a partial selection, never a sort of the vocabulary (``_candidates.h``), so a
    262k-token row costs one or two vectorised passes, about greedy's argmax. Two forms:

    - *sparse* (top-k, top-p or min-p set): ``ids`` and their normalised ``probs``, in
      no particular order (a draw and p(x) do not depend on it);
    - *dense* (none set: temperature alone, the OpenAI default): ``probs`` holds every
      token's unnormalised weight by id, ``blocks`` their per-block sums and ``total``
      their sum; a draw scans block sums, then one block.
    """

    def __cinit__(self):
        self._gap = _GAP_START

    cdef int from_logits(self, const float * logits, int n_vocab, SamplingParams sp) except -1 nogil:
        """The distribution of ``logits`` under ``sp``, whose values the API checked
        (``config.Sampling``); asserted here, not checked again."""
        assert sp.top_k >= 0 and 0.0 < sp.top_p <= 1.0 and 0.0 <= sp.min_p <= 1.0 and n_vocab > 0
        cdef double t = sp.temperature if sp.temperature > 0 else 1.0
        cdef bint top_k = 0 < sp.top_k < n_vocab
        cdef float mx
        cdef int keep
        if top_k:
            # one pass: the k best hold the maximum
            specdec_top_k(logits, n_vocab, sp.top_k, -INFINITY, self._cands)
            mx = -INFINITY
            for keep in range(<int>self._cands.size()):
                mx = max(mx, self._cands[keep].x)
        else:
            mx = specdec_max(logits, n_vocab)
        if mx == -INFINITY or mx == INFINITY or mx != mx:
            return self._one(specdec_argmax(logits, n_vocab))
        # a token whose logit is this far below the best has relative probability < e^-40
        cdef float floor_ = mx - _CUTOFF * (t if t > 1.0 else 1.0)
        if not top_k and sp.top_p >= 1.0 and sp.min_p <= 0.0:
            self.dense = True
            self.n_vocab = n_vocab
            self.ids.clear()
            self.probs.resize(n_vocab)
            self.blocks.resize((n_vocab + SPECDEC_BLOCK - 1) // SPECDEC_BLOCK)
            self.total = specdec_dense(logits, n_vocab, mx, floor_, <float>(1.0 / t),
                                       self.probs.data(), self.blocks.data())
            return 0
        self.dense = False
        # min-p keeps p >= min_p * p_max: logits >= max + log(min_p)
        cdef float theta_m = floor_
        if sp.min_p > 0.0:
            theta_m = max(floor_, <float>(mx + log(sp.min_p) - _MINP_MARGIN))
        if top_k:
            # top-p after top-k is a share of the k candidates' mass; without top-p the
            # candidates need only reach min-p's bound
            keep = self._drop_below(floor_ if sp.top_p < 1.0 else theta_m)
            if sp.top_p < 1.0:
                keep = specdec_nucleus(self._cands.data(), keep,
                                       sp.top_p * specdec_weigh(self._cands.data(), keep, mx))
                keep = keep if keep >= 0 else <int>self._cands.size()
            else:
                specdec_weigh(self._cands.data(), keep, mx)
        elif sp.top_p < 1.0:
            keep = self._nucleus(logits, n_vocab, mx, floor_, theta_m, sp.top_p)
        else:
            self._cands.clear()
            specdec_collect_band(logits, n_vocab, theta_m, INFINITY, self._cands)
            keep = self._cands.size()
            specdec_weigh(self._cands.data(), keep, mx)
        if keep == 0:
            return self._one(specdec_argmax(logits, n_vocab))
        self._normalise(keep, mx, t, sp.min_p)
        return 0

    cdef int _drop_below(self, float theta) noexcept nogil:
        """Drops the candidates below ``theta``; returns how many are left."""
        cdef size_t i, j = 0
        for i in range(self._cands.size()):
            if self._cands[i].x >= theta:
                self._cands[j] = self._cands[i]
                j += 1
        self._cands.resize(j)
        return j

    cdef int _nucleus(self, const float * logits, int n, float mx, float floor_, float theta_m,
                      double top_p) noexcept nogil:
        """Top-p without top-k: into ``_cands``, with the kept ones first; returns how many
        are kept (all the candidates when min-p's bound ends them before top-p's mass).

        The pass that sums the row's mass (temperature 1, as llama.cpp's top-p) collects
        the tokens above a guess of the cut (the last row's, a little lower); if they do
        not hold top-p's mass, the collection widens below it, doubling the gap, down to
        min-p's bound or the floor."""
        cdef float theta = max(mx - self._gap, theta_m)
        cdef float lower
        self._cands.clear()
        cdef double z = specdec_mass_collect(logits, n, mx, floor_, theta, self._cands)
        cdef int m = self._cands.size()
        cdef int keep
        specdec_weigh(self._cands.data(), m, mx)
        while True:
            keep = specdec_nucleus(self._cands.data(), m, top_p * z)
            if keep >= 0 or theta <= theta_m:
                break
            lower = max(mx - 2 * (mx - theta), theta_m)
            specdec_collect_band(logits, n, lower, theta, self._cands)
            theta = lower
            m = self._cands.size()
            specdec_weigh(self._cands.data(), m, mx)
        if keep < 0:
            return m
        # the next row's guess: this cut's depth, with some slack
        cdef int i
        cdef float low = mx
        for i in range(keep):
            low = min(low, self._cands[i].x)
        self._gap = min(<float>_CUTOFF, max(mx - low + _GAP_SLACK, <float>1.0))
        return keep

    cdef int _normalise(self, int keep, float mx, double t, double min_p) noexcept nogil:
        """``ids`` / ``probs``: the first ``keep`` candidates that min-p keeps (weight at
        least ``min_p`` times the best's, which is 1), at temperature ``t``."""
        cdef int i, j = 0
        cdef double z = 0.0, w
        self.ids.resize(keep)
        self.probs.resize(keep)
        for i in range(keep):
            if min_p > 0.0 and self._cands[i].w < min_p:
                continue
            self.ids[j] = self._cands[i].id
            w = self._cands[i].w if t == 1.0 else exp((self._cands[i].x - mx) / t)
            self.probs[j] = w
            z += w
            j += 1
        self.ids.resize(j)
        self.probs.resize(j)
        for i in range(j):
            self.probs[i] = self.probs[i] / z
        return 0

    cdef int _one(self, int32_t tok) noexcept nogil:
        self.dense = False
        self.ids.assign(1, tok)
        self.probs.assign(1, 1.0)
        return 0

    cdef float prob_of(self, int32_t tok) noexcept nogil:
        cdef size_t i
        if self.dense:
            return self.probs[tok] / self.total if 0 <= tok < self.n_vocab else 0.0
        for i in range(self.ids.size()):
            if self.ids[i] == tok:
                return self.probs[i]
        return 0.0

    cdef int32_t sample(self, Rng rng) noexcept nogil:
        cdef double u = rng.uniform(), c = 0.0
        cdef size_t i
        if self.dense:
            return max(0, specdec_draw(self.probs.data(), self.n_vocab, self.blocks.data(),
                                       u * self.total))
        for i in range(self.ids.size()):
            c += self.probs[i]
            if u < c:
                return self.ids[i]
        return self.ids[self.ids.size() - 1]

    cdef int32_t sample_residual(self, Rng rng, const int32_t * q_ids, const float * q_probs,
                                 int q_n) noexcept nogil:
        """Draw from norm(max(0, p - q)): the correction after a rejected draft."""
        if self.dense:
            return self._residual_dense(rng, q_ids, q_probs, q_n)
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

    cdef int32_t _residual_dense(self, Rng rng, const int32_t * q_ids, const float * q_probs,
                                 int q_n) noexcept nogil:
        """``sample_residual`` on the dense form: a copy of the weights with each drafted
        id's weight lowered by q (its first entry in ``q_ids``, as the sparse form reads
        it), block sums and total mended, then one draw."""
        cdef int j, tok
        cdef double z = self.total, old, new
        self._work.assign(self.probs.begin(), self.probs.end())
        self._wblocks.assign(self.blocks.begin(), self.blocks.end())
        self._seen.clear()
        for j in range(q_n):
            tok = q_ids[j]
            if tok < 0 or tok >= self.n_vocab or self._seen.count(tok):
                continue
            self._seen.insert(tok)
            old = self._work[tok]
            new = old - q_probs[j] * self.total
            new = new if new > 0 else 0.0
            self._work[tok] = new
            self._wblocks[tok // SPECDEC_BLOCK] -= old - new
            z -= old - new
        if z <= self.total * 1e-9:
            return self.sample(rng)
        cdef int y = specdec_draw(self._work.data(), self.n_vocab, self._wblocks.data(),
                                  rng.uniform() * z)
        return y if y >= 0 else self.sample(rng)

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

    def draw(self, Rng rng not None, q=None) -> int:
        """One draw from the distribution, or with ``q`` (token id -> the drafter's
        probability) from the residual norm(max(0, p - q)) that follows a rejected draft."""
        if self.probs.size() == 0:
            raise ValueError("no distribution: call set_logits first")
        if q is None:
            return self.sample(rng)
        cdef vector[int32_t] ids = [int(k) for k in q]
        cdef vector[float] qp = [float(v) for v in q.values()]
        return self.sample_residual(rng, ids.data(), qp.data(), ids.size())

    def as_dict(self) -> dict:
        """Token id -> probability, for the tokens the distribution can draw."""
        if self.dense:
            return {i: float(self.probs[i] / self.total) for i in range(self.n_vocab)
                    if self.probs[i] > 0}
        return {int(self.ids[i]): float(self.probs[i]) for i in range(self.ids.size())}
