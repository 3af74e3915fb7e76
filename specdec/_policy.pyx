# cython: language_level=3
# distutils: language = c++
"""Draft length: fixed, or adaptive by measured acceptance and measured cost.

On a CPU a verify batch is not free (on Q8_0 two tokens cost ~1.9x one, each
further token ~0.55x), so the length that maximises acceptance is not the one
that maximises speed. The adaptive policy keeps, per draft position, the
conditional acceptance rate, and per draft length the measured verify time, and
picks the length with the most expected tokens per second:

    E(k) = 1 + sum_{j<=k} prod_{i<=j} alpha_i,   T(k) = t_verify(k) + k * t_draft

Zero drafts is a candidate, so a drafter that does not pay is switched off, and
every 16th round probes a neighbouring length so the estimates stay fresh.
"""
from libcpp.vector cimport vector

DEF EMA = 0.1
DEF PRIOR_ALPHA = 0.6


cdef class DraftPolicy:

    def __init__(self, int n_max, float p_min=0.0, bint adaptive=False):
        self.n_max = n_max
        self.adaptive = adaptive
        self.t_verify = vector[double](n_max + 1, 0.0)
        self.n_verify = vector[double](n_max + 1, 0.0)
        self.alpha = vector[double](n_max + 1, PRIOR_ALPHA)
        self.n_alpha = vector[double](n_max + 1, 0.0)
        self.t_draft_tok = 0.0
        self.rounds = 0
        self.current = n_max

    cdef double _t(self, int k) noexcept:
        """Measured verify time for k drafts, or a linear estimate from the nearest measured ones."""
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
            # unmeasured longer batches: assume each token costs half a single decode more
            return self.t_verify[lo] * (1.0 + 0.5 * (k - lo))
        if hi >= 0:
            return self.t_verify[hi] / (1.0 + 0.5 * (hi - k))
        return 1.0 + 0.5 * k

    cdef int next_len(self) noexcept:
        if not self.adaptive or self.n_max == 0:
            return self.n_max
        self.rounds += 1
        cdef int k, best = 0
        cdef double e = 1.0, p = 1.0, rate, best_rate = -1.0
        for k in range(self.n_max + 1):
            if k > 0:
                p *= self.alpha[k]
                e += p
            rate = e / (self._t(k) + k * self.t_draft_tok)
            if rate > best_rate:
                best_rate = rate
                best = k
        if self.rounds % 16 == 0:
            # probe a neighbour so that its cost and acceptance stay measured
            best = best + 1 if best < self.n_max and (self.rounds // 16) % 2 == 0 else max(best - 1, 1)
            best = min(best, self.n_max)
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
        # draft i+1 was tried only if drafts 1..i were accepted
        for i in range(1, min(a + 1, k) + 1):
            self.alpha[i] += EMA * ((1.0 if i <= a else 0.0) - self.alpha[i])
            self.n_alpha[i] += 1
        # positions past k: at most as likely as the last one tried
        for i in range(k + 1, self.n_max + 1):
            if self.n_alpha[i] == 0 and k > 0:
                self.alpha[i] = min(self.alpha[i], self.alpha[k])

    cdef void observe_draft_time(self, int k, double t) noexcept:
        if k > 0:
            self.t_draft_tok += EMA * (t / k - self.t_draft_tok)

    def state(self) -> dict:
        return {"alpha": [self.alpha[i] for i in range(1, self.n_max + 1)],
                "t_verify": [self.t_verify[i] for i in range(self.n_max + 1)],
                "t_draft_tok": self.t_draft_tok, "current": self.current}
