# cython: language_level=3
# distutils: language = c++
"""Draft length: fixed, or adaptive by measured acceptance and measured cost.

On a CPU neither drafting nor verifying is free. A verify batch of ``k + 1`` rows
costs more than one row, and not even monotonically (on gemma3-270m Q4_K_M: 4
rows ~1.8x a single decode, 5 rows ~2.6x, 8 rows ~2.7x: the matmul kernels tile
by 4). A model drafter (MTP head, draft model) pays a decode per draft token. So
the length that maximises acceptance is not the one that maximises speed.

The adaptive policy keeps, per draft position, the conditional acceptance rate
``alpha_i`` (decayed counts with a prior worth 4 trials, so one early miss does not
switch a good drafter off); per draft length the measured verify time ``tv(k)``; and per cap the
measured time of the drafter call ``td(c)``. The expected tokens of a round that
verifies ``k`` drafts are

    E(k) = 1 + sum_{j<=k} prod_{i<=j} alpha_i

Before drafting it asks the drafter for the cap ``c`` with the best
``E(c) / (td(c) + tv(c))``, so a costly drafter drafts only what pays; after the
drafter answered it verifies the prefix ``k`` with the best
``E(k) / (td_paid + tv(k))`` (the draft time is spent by then).

Exploration keeps the estimates honest: every 8th round asks one token past the
best cap (or the whole ``n_max`` when drafting is nearly free) and verifies the
least measured length of the answer (every length gets measured: interpolating a
non-monotonic cost misleads); every 64th round is a plain one, so ``tv(0)`` (the cost drafting must beat) is
measured, not guessed. A drafter that does not pay gets cap 0 (no call at all)
and is probed after 16 rounds, then after 32, 64, ... 256 while it still does not pay
(a costly drafter with one token, a free one with all it has).
"""
from libcpp.vector cimport vector

DEF EMA = 0.15            # time averages
DEF PRIOR_ALPHA = 0.85
DEF PRIOR_N = 4.0          # the prior counts as this many trials of each position
DEF DECAY = 0.98           # acceptance forgets old trials (an effective window of ~50)
DEF EXPLORE_EVERY = 8
DEF PROBE_EVERY = 16      # first probe of a drafter that does not pay; then the gap doubles
DEF MAX_PROBE_GAP = 256
DEF MIN_TRIALS = 8        # verified drafts before the policy may stop asking
DEF PLAIN_EVERY = 64
DEF FREE_DRAFT = 0.05     # drafting "nearly free": the full cap costs < 5% of a plain round


cdef inline void _ema(vector[double] & t, vector[double] & n, int i, double x) noexcept:
    """A time sample ``x`` into the EMA ``t[i]`` (its first sample taken as is); ``n[i]`` counts."""
    t[i] = x if n[i] == 0 else t[i] + EMA * (x - t[i])
    n[i] += 1


cdef class DraftPolicy:

    def __init__(self, int n_max, float p_min=0.0, bint adaptive=False):
        self.n_max = n_max
        self.adaptive = adaptive
        self.t_verify = vector[double](n_max + 1, 0.0)
        self.n_verify = vector[double](n_max + 1, 0.0)
        self.t_draft_cap = vector[double](n_max + 1, 0.0)
        self.n_draft_cap = vector[double](n_max + 1, 0.0)
        self.n_alpha = vector[double](n_max + 1, 0.0)
        self.s_alpha = vector[double](n_max + 1, 0.0)
        self.rounds = 0
        self.current = n_max
        self.last_cap = n_max
        self.exploring = False
        self.probe_gap = PROBE_EVERY
        self.last_probe = 0
        self.n_drafts_seen = 0

    cdef double _t(self, int k) noexcept:
        """Verify time for ``k`` drafts (``k + 1`` rows): measured, else interpolated from
        the measured lengths (or extrapolated, +30% a row)."""
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

    cdef double _td(self, int c) noexcept:
        """Drafter time when asked for ``c`` tokens (0 for ``c == 0``: no call)."""
        if c <= 0:
            return 0.0
        if self.n_draft_cap[c] > 0:
            return self.t_draft_cap[c]
        # unmeasured: proportional to the cap from the nearest measured one
        cdef int j
        for j in range(1, self.n_max + 1):
            if c - j >= 1 and self.n_draft_cap[c - j] > 0:
                return self.t_draft_cap[c - j] * c / (c - j)
            if c + j <= self.n_max and self.n_draft_cap[c + j] > 0:
                return self.t_draft_cap[c + j] * c / (c + j)
        return 0.0

    cdef double _alpha(self, int i) noexcept:
        """P(draft i accepted | drafts < i accepted): decayed counts plus the prior."""
        return (self.s_alpha[i] + PRIOR_ALPHA * PRIOR_N) / (self.n_alpha[i] + PRIOR_N)

    cdef double _expected(self, int k) noexcept:
        cdef double e = 1.0, p = 1.0
        cdef int i
        for i in range(1, k + 1):
            p *= self._alpha(i)
            e += p
        return e

    cdef bint _free(self) noexcept:
        """Whether drafting is nearly free (the full cap costs < 5% of a plain round)."""
        return self._td(self.n_max) < FREE_DRAFT * self._t(0)

    cdef double _rate(self, int k) noexcept:
        return self._expected(k) / self._t(k)

    cdef int _best_cap(self) noexcept:
        cdef int c, best = 0
        cdef double r, best_rate = self._rate(0)
        for c in range(1, self.n_max + 1):
            r = self._expected(c) / (self._td(c) + self._t(c))
            if r > best_rate:
                best_rate = r
                best = c
        return best

    cdef int cap(self) noexcept:
        """How many tokens to ask the drafter for this round."""
        self.exploring = False
        if not self.adaptive or self.n_max == 0:
            return self.n_max
        self.rounds += 1
        if self.rounds % PLAIN_EVERY == 2:
            self.last_cap = 0               # measure what drafting has to beat
            return 0
        cdef int best = self._best_cap()
        if best == 0:
            # drafting does not pay: probe now and then, less often while it keeps not paying
            # ... but not before a few drafts were measured: a cold first decode must not
            # switch a good drafter off for the next 16 rounds
            if self.n_drafts_seen >= MIN_TRIALS and self.rounds - self.last_probe < self.probe_gap:
                self.last_cap = 0
                return 0
            if self.last_probe > 0 and self.n_drafts_seen >= MIN_TRIALS:
                self.probe_gap = min(2 * self.probe_gap, MAX_PROBE_GAP)
            self.last_probe = self.rounds
            self.exploring = True
            # a costly drafter is probed with one token (alpha_1 decides whether any draft
            # pays); a free one with everything it has
            best = self.n_max if self._free() else 1
        else:
            self.probe_gap = PROBE_EVERY
            self.last_probe = 0
            if self.rounds % EXPLORE_EVERY == 0:
                self.exploring = True
                best = self.n_max if self._free() else min(self.n_max, best + 1)
        self.last_cap = best
        return best

    cdef int choose(self, int proposed, double t_drafted) noexcept:
        """The prefix of a proposal worth verifying, the drafting time being spent."""
        if not self.adaptive or proposed <= 0:
            return proposed
        cdef int k, best = 0
        if self.exploring:
            # the least measured length: verify cost is not monotonic in the rows (kernels
            # tile by 4), so no length's cost may be left to interpolation for long
            best = proposed
            for k in range(proposed - 1, 0, -1):
                if self.n_verify[k] < self.n_verify[best]:
                    best = k
            self.current = best
            return best
        cdef double r, best_rate = 1.0 / (t_drafted + self._t(0))
        for k in range(1, proposed + 1):
            r = self._expected(k) / (t_drafted + self._t(k))
            if r > best_rate:
                best_rate = r
                best = k
        self.current = best
        return best

    cdef void observe(self, int k, int a, double t_dec) noexcept:
        cdef int i
        if k > self.n_max or k < 0:
            return
        _ema(self.t_verify, self.n_verify, k, t_dec)
        # draft i was tried only if drafts 1..i-1 were accepted
        for i in range(1, min(a + 1, k) + 1):
            self.n_alpha[i] = DECAY * self.n_alpha[i] + 1.0
            self.s_alpha[i] = DECAY * self.s_alpha[i] + (1.0 if i <= a else 0.0)
        if k > 0:
            self.n_drafts_seen += 1

    cdef void observe_draft_time(self, int cap, double t) noexcept:
        """Time of one drafter call asked for ``cap`` tokens."""
        if cap <= 0 or cap > self.n_max:
            return
        _ema(self.t_draft_cap, self.n_draft_cap, cap, t)

    def state(self) -> dict:
        return {"alpha": [self._alpha(i) for i in range(1, self.n_max + 1)],
                "t_verify": [self.t_verify[i] for i in range(self.n_max + 1)],
                "t_draft_cap": [self.t_draft_cap[i] for i in range(self.n_max + 1)],
                "current": self.current, "cap": self.last_cap}
