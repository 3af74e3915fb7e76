# cython: language_level=3
# distutils: language = c++
"""Draft length: fixed, or adaptive by measured acceptance and measured cost.

On a CPU a verify batch is not free, and its cost is not even monotonic in the
number of rows (on gemma3-270m Q4_K_M: 4 rows ~1.8x a single decode, 5 rows
~2.6x, 8 rows ~2.7x: the matmul kernels tile by 4). So the length that
maximises acceptance is not the one that maximises speed. The adaptive policy
keeps, per draft position, the conditional acceptance rate, and per draft length
the measured verify time; after the drafter has proposed ``L`` tokens it keeps the
prefix ``k <= L`` with the most expected tokens per second:

    E(k) = 1 + sum_{j<=k} prod_{i<=j} alpha_i,      rate(k) = E(k) / t_verify(k)

Keeping none is a candidate, so a drafter that does not pay stops being asked
(probed every 32 rounds); every 8th round verifies the whole proposal so deep
positions stay measured.
"""
from libcpp.vector cimport vector

DEF EMA = 0.15
DEF PRIOR_ALPHA = 0.85


cdef class DraftPolicy:

    def __init__(self, int n_max, float p_min=0.0, bint adaptive=False):
        self.n_max = n_max
        self.adaptive = adaptive
        self.t_verify = vector[double](n_max + 1, 0.0)
        self.n_verify = vector[double](n_max + 1, 0.0)
        self.alpha = vector[double](n_max + 1, PRIOR_ALPHA)
        self.n_alpha = vector[double](n_max + 1, 0.0)
        self.t_draft = 0.0
        self.rounds = 0
        self.idle = 0
        self.current = n_max

    cdef double _t(self, int k) noexcept:
        """Measured verify time for k drafts, else interpolated from measured lengths."""
        if self.n_verify[k] > 0:
            return self.t_verify[k]
        cdef int lo = -1, hi = -1, j
        for j in range(k - 1, -1, -1):
            if self.n_verify[j] > 0:
                lo = j
                break
        for j in range(k + 1, self.n_max + 1):
            if self.n_verify[j] > 0:
                hi = j
                break
        if lo >= 0 and hi >= 0:
            return self.t_verify[lo] + (self.t_verify[hi] - self.t_verify[lo]) * (k - lo) / (hi - lo)
        if lo >= 0:
            return self.t_verify[lo] * (1.0 + 0.3 * (k - lo))
        if hi >= 0:
            return self.t_verify[hi] / (1.0 + 0.3 * (hi - k))
        return 1.0 + 0.3 * k

    cdef double _rate(self, int k) noexcept:
        cdef double e = 1.0, p = 1.0
        cdef int i
        for i in range(1, k + 1):
            p *= self.alpha[i]
            e += p
        return e / self._t(k)

    cdef int cap(self) noexcept:
        """How many tokens to ask the drafter for this round."""
        if not self.adaptive or self.n_max == 0:
            return self.n_max
        self.rounds += 1
        # when no length has beaten plain decoding for a while, stop asking (probe sometimes)
        if self.idle > 64 and self.rounds % 32 != 0:
            return 0
        return self.n_max

    cdef int choose(self, int proposed) noexcept:
        """The prefix of a proposal worth verifying."""
        if not self.adaptive or proposed <= 0:
            return proposed
        if self.rounds % 8 == 0:
            self.current = proposed
            return proposed
        cdef int k, best = 0
        cdef double r, best_rate = self._rate(0)
        for k in range(1, proposed + 1):
            r = self._rate(k)
            if r > best_rate:
                best_rate = r
                best = k
        self.current = best
        return best

    cdef void observe(self, int k, int a, double t_dec) noexcept:
        cdef int i
        if k > self.n_max or k < 0:
            return
        if self.n_verify[k] == 0:
            self.t_verify[k] = t_dec
        else:
            self.t_verify[k] += EMA * (t_dec - self.t_verify[k])
        self.n_verify[k] += 1
        # draft i was tried only if drafts 1..i-1 were accepted
        for i in range(1, min(a + 1, k) + 1):
            self.alpha[i] += EMA * ((1.0 if i <= a else 0.0) - self.alpha[i])
            self.n_alpha[i] += 1
        if k > 0:
            if a > 0 and self._rate(k) > self._rate(0):
                self.idle = 0
            else:
                self.idle += 1

    cdef void observe_draft_time(self, int k, double t) noexcept:
        self.t_draft += EMA * (t - self.t_draft)

    def state(self) -> dict:
        return {"alpha": [self.alpha[i] for i in range(1, self.n_max + 1)],
                "t_verify": [self.t_verify[i] for i in range(self.n_max + 1)],
                "t_draft": self.t_draft, "current": self.current, "idle": self.idle}
