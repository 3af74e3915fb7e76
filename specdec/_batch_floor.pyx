# cython: language_level=3
# distutils: language = c++
"""Never below plain decoding, measured on the batch: the floor of the adaptive policy
once several sequences share a round.

Each sequence's adaptive policy compares its drafts with rounds it decoded plain, and the
draft budget (``_batch_budget``) prices verify rows by the batch's cost line. Both are
models: of what a row costs, of what a draft step costs a sequence when one decode drafts
for all, of acceptance. Their errors add up across the sequences of a round, and what
one sequence calls a plain round is not one for the batch while the others draft. On a
2-core CPU an MTP Engine under the adaptive policy ran at 0.79-0.91x its plain decoding at
4 and 8 slots: the budget's rows each looked like they paid, the batch's rounds did not.

The floor does not model, it measures what the models promise: the token rate of the
batch's rounds in which the adaptive policies drafted against that of rounds without
drafts, for each number of running sequences (a round of 8 and a round of 3 are not
alike). When drafting rounds are the slower (by 2%, the rates' noise), the adaptive
sequences draft nothing for 16 rounds at that size, then probe for 3 rounds, and stay
off twice as long (up to 256 rounds) while probes keep losing, as each policy probes a
drafter that does not pay. While drafting is on, every 16th round at a size is held plain,
so the rate it is compared with is measured under the machine's current load (on a
shared machine it drifts); until three such rounds are measured, every 4th is. A fixed
draft length is the caller's choice: rounds in which one drafts are neither held nor
measured. A batch drafted by a model is measured per cap instead (``_batch_length``):
the floor judges the rounds that one does not take.
"""
from libcpp.vector cimport vector

from ._seq cimport _Seq

DEF DECAY = 0.85          # the rates follow the last ~7 rounds of each kind
DEF MIN_SAMPLES = 2.5     # decayed samples of each kind before the rates are compared
DEF PLAIN_EVERY = 16      # while drafting is on, a round in this many is held plain
DEF PLAIN_EARLY = 4       # ... every 4th until the plain rate is measured
DEF PAUSE_FIRST = 16      # drafting off for this many rounds, then a probe
DEF PAUSE_MAX = 256
DEF PROBE_ROUNDS = 3      # a probe: this many drafting rounds (one round's time is noisy)
DEF MARGIN = 0.02


cdef class BatchFloor:
    """BatchFloor(n_max)
--

    The floor of rounds of up to ``n_max`` running sequences."""

    def __init__(self, int n_max):
        self.n_max = max(n_max, 1)
        cdef int m = self.n_max + 1
        self.p_tok.assign(m, 0.0)
        self.p_t.assign(m, 0.0)
        self.p_n.assign(m, 0.0)
        self.d_tok.assign(m, 0.0)
        self.d_t.assign(m, 0.0)
        self.d_n.assign(m, 0.0)
        self.rounds.assign(m, 0)
        self.off_left.assign(m, 0)
        self.gap.assign(m, PAUSE_FIRST)
        self.probe_left.assign(m, 0)
        self.n_held = self.n_off = 0
        self.kind = self.n_in = self.tokens0 = 0

    cdef bint allow(self, int n) noexcept:
        """Before drafting, in a round of ``n >= 2`` sequences some of which draft under the
        adaptive policy: may they draft?"""
        if n < 2 or n > self.n_max:
            return True
        self.rounds[n] += 1
        if self.probe_left[n] > 0:
            return True
        if self.off_left[n] > 0:
            self.off_left[n] -= 1
            if self.off_left[n] == 0:
                # the probe: its own rate, not one averaged with the rounds that lost
                self.probe_left[n] = PROBE_ROUNDS
                self.d_tok[n] = self.d_t[n] = self.d_n[n] = 0.0
                return True
            self.n_held += 1
            return False
        cdef int every = PLAIN_EVERY if self.p_n[n] >= MIN_SAMPLES else PLAIN_EARLY
        if self.rounds[n] % every == 0:
            self.n_held += 1
            return False
        return True

    cdef void observe(self, int n, bint drafting, double tokens, double t) noexcept:
        """After a round of ``n`` sequences that made ``tokens`` tokens in ``t`` seconds,
        with the adaptive policies drafting or held plain."""
        if n < 2 or n > self.n_max or t <= 0.0 or tokens <= 0.0:
            return
        if not drafting:
            self.p_tok[n] = DECAY * self.p_tok[n] + tokens
            self.p_t[n] = DECAY * self.p_t[n] + t
            self.p_n[n] = DECAY * self.p_n[n] + 1.0
            return
        self.d_tok[n] = DECAY * self.d_tok[n] + tokens
        self.d_t[n] = DECAY * self.d_t[n] + t
        self.d_n[n] = DECAY * self.d_n[n] + 1.0
        cdef bint probing = self.probe_left[n] > 0
        if probing:
            self.probe_left[n] -= 1
            if self.probe_left[n] > 0:
                return
        if self.p_n[n] < MIN_SAMPLES or (self.d_n[n] < MIN_SAMPLES and not probing):
            return
        cdef double plain = self.p_tok[n] / self.p_t[n], drafted = self.d_tok[n] / self.d_t[n]
        if drafted < (1.0 - MARGIN) * plain:
            self.off_left[n] = self.gap[n]
            self.gap[n] = min(2 * self.gap[n], PAUSE_MAX)
            self.n_off += 1
        elif probing:
            self.gap[n] = PAUSE_FIRST

    cdef int judge(self, list seqs) except -1:
        """Before drafting, the round's running ``seqs`` (their caps set): hold its adaptive
        sequences plain if the floor says so (``k_cap`` 0), and note what to measure."""
        cdef _Seq s
        cdef bint wants = False, fixed = False
        self.kind = 0
        self.n_in = len(seqs)
        self.tokens0 = 0
        for s in seqs:
            self.tokens0 += s.req.out.n_tokens
            if s.k_cap > 0:
                if s.req.policy.adaptive:
                    wants = True
                else:
                    fixed = True
        if self.n_in < 2 or fixed:
            return 0
        self.kind = 2 if wants else 1
        if wants and not self.allow(self.n_in):
            self.kind = 1
            for s in seqs:
                s.k_cap = 0
        return 0

    cdef int settle(self, list seqs, double t) except -1:
        """After the round judged last (``seqs``: the same sequences), which took ``t``
        seconds: its tokens against its kind."""
        cdef _Seq s
        cdef int tokens = -self.tokens0
        if self.kind == 0:
            return 0
        for s in seqs:
            tokens += s.req.out.n_tokens
        self.observe(self.n_in, self.kind == 2, tokens, t)
        self.kind = 0
        return 0

    def allow_round(self, int n) -> bool:
        """``allow`` from Python: may the adaptive sequences of a round of ``n`` draft?"""
        return self.allow(n)

    def observe_round(self, int n, bint drafting, double tokens, double seconds) -> None:
        self.observe(n, drafting, tokens, seconds)

    def state(self, int n) -> dict:
        """The floor at ``n`` sequences: rates (tokens/s, 0 unmeasured), the pause left."""
        if n < 0 or n > self.n_max:
            raise ValueError(f"n must be in 0..{self.n_max}")
        return {"plain_rate": self.p_tok[n] / self.p_t[n] if self.p_t[n] > 0 else 0.0,
                "draft_rate": self.d_tok[n] / self.d_t[n] if self.d_t[n] > 0 else 0.0,
                "off_left": self.off_left[n], "probe_left": self.probe_left[n],
                "gap": self.gap[n], "rounds": self.rounds[n],
                "held": self.n_held, "turned_off": self.n_off}
