# cython: language_level=3
# distutils: language = c++
"""Draft length: fixed, or adaptive by measured acceptance and measured cost.

On a CPU neither drafting nor verifying is free, so the length that maximises acceptance is not
the one that maximises speed. The adaptive policy keeps, per draft position, the conditional
acceptance rate ``alpha_i``; per draft length the measured verify time ``tv(k)``; per cap the
measured time of the drafter call ``td(c)``. A round that verifies ``k`` drafts is expected to
yield ``E(k) = 1 + sum_{j<=k} prod_{i<=j} alpha_i`` tokens. Before drafting it asks for the cap
``c`` with the best ``E(c) / (td(c) + tv(c))`` (drafting at all only 2% over plain decoding);
after, it verifies the prefix ``k`` with the best ``E(k) / (td_paid + tv(k))``.

The whole account (times scaled by the load's drift, the calibration against what drafting
rounds really yield, exploration, probes of a drafter that does not pay, the cost line of long
drafts, a batch shape's first verify) is in ``docs/architecture.md``, "The draft-length
policy"; how a time sample enters its average is ``_time_estimate.pxd``. ``DraftPolicy`` is one
cdef class: its estimates, schedules and decisions all read and write its one state.
"""
from libcpp.vector cimport vector

from ._time_estimate cimport add_time_sample, add_time_sample_ref

DEF PRIOR_ALPHA = 0.85
DEF PRIOR_N = 4.0          # the prior counts as this many trials of each position
DEF DECAY = 0.98           # acceptance forgets old trials (an effective window of ~50)
DEF EXPLORE_EVERY = 8     # (every schedule counts rounds: a round shared by sequences, once)
DEF PROBE_EVERY = 16      # first probe of a drafter that does not pay; then the gap doubles
DEF MAX_PROBE_GAP = 256
DEF NEAR_GAIN = 0.9       # a drafter estimated within 10% of plain is probed on a short gap
DEF NEAR_GAP = 4          # ... at least this one, without doubling
DEF PROBE_BUDGET = 0.01   # probes may lose this share of the time (their measured loss sets the gap)
DEF MAX_BUDGET_GAP = 4096
DEF PROBE_SHRINK = 4.0    # the measured loss counts fully after a few probes (see _budget_gap)
DEF RIGHT_BEFORE = 0.25   # decayed first-draft acceptances: right within the estimates' memory
DEF MIN_TRIALS = 8        # verified drafts before the policy may stop asking
DEF MEASURED = 8          # verify samples of a length before exploration stops choosing it
DEF PLAIN_EVERY = 64
DEF FREE_DRAFT = 0.05     # drafting "nearly free": the full cap costs < 5% of a plain round
DEF MARGIN = 0.02         # drafting must promise this much over plain decoding
DEF P_STOP_MAX = 0.5      # the confidence floor of p_stop never goes above this
DEF LINE_FROM = 8         # verify times of longer drafts come from the cost line (see _line)
DEF LINE_VAR = 4.0        # the line's lengths must spread this much (variance, rows^2)


cdef class DraftPolicy:

    def __init__(self, int n_max, bint adaptive=False):
        self.n_max = n_max
        self.adaptive = adaptive
        self.t_verify = vector[double](n_max + 1, 0.0)
        self.n_verify = vector[double](n_max + 1, 0.0)
        self.warmed = vector[char](n_max + 1, 0)
        self.t_draft_cap = vector[double](n_max + 1, 0.0)
        self.n_draft_cap = vector[double](n_max + 1, 0.0)
        self.ref_verify = vector[double](n_max + 1, 0.0)
        self.ref_draft = vector[double](n_max + 1, 0.0)
        self.n_alpha = vector[double](n_max + 1, 0.0)
        self.s_alpha = vector[double](n_max + 1, 0.0)
        self.rounds = 0
        self.round_id = -1
        self.probe_open = self.probe_paid = False
        self.probe_loss = self.n_probe_loss = 0.0
        self.current = n_max
        self.last_cap = n_max
        self.exploring = False
        self.probing = False
        self.probe_gap = PROBE_EVERY
        self.last_probe = 0
        self.last_gain = 0.0
        self.n_drafts_seen = 0
        self.cal_tokens = self.cal_time = self.cal_rounds = 0.0
        self.cal_tokens_predicted = self.cal_time_predicted = 0.0
        self.predicted_tokens = self.predicted_time = 0.0
        self.ln_n = self.ln_r = self.ln_rr = self.ln_t = self.ln_rt = 0.0
        self.n_long = 0

    cdef bint _line(self, double * a, double * b) noexcept:
        """The verify cost line of ``LINE_FROM`` drafts or more, ``tv(k) = (a + b k) tv(0)``
        (False: fewer than 3 samples, or their lengths too alike to fit a slope)."""
        if self.ln_n < 3.0:
            return False
        cdef double mr = self.ln_r / self.ln_n, mt = self.ln_t / self.ln_n
        cdef double var = self.ln_rr / self.ln_n - mr * mr
        if var < LINE_VAR:
            return False
        b[0] = max((self.ln_rt / self.ln_n - mr * mt) / var, 0.0)
        a[0] = mt - b[0] * mr
        return True

    cdef void _line_sample(self, int k, double t) noexcept:
        """A verify of ``k >= LINE_FROM`` drafts took ``t`` (with a plain round measured): a
        sample of the cost line, clipped at twice its estimate once it has one (a preempted
        decode must not tilt it)."""
        cdef double a, b, y = t / self.t_verify[0]
        if self._line(&a, &b) and y > 2.0 * (a + b * k):
            y = 2.0 * (a + b * k)
        self.ln_n = DECAY * self.ln_n + 1.0
        self.ln_r = DECAY * self.ln_r + k
        self.ln_rr = DECAY * self.ln_rr + <double>k * k
        self.ln_t = DECAY * self.ln_t + y
        self.ln_rt = DECAY * self.ln_rt + k * y
        self.n_long += 1

    cdef double _load_factor(self, double ref) noexcept:
        """How much slower plain rounds are now than when a time with plain-round reference
        ``ref`` was measured. A shared machine's load drifts: a draft length measured long
        ago, under less load, must not look cheap next to a plain round measured just now."""
        if ref <= 0.0 or self.n_verify[0] == 0:
            return 1.0
        return self.t_verify[0] / ref

    cdef inline double _plain_time_now(self) noexcept:
        """The plain-round time a new sample is stored with (0: none measured yet)."""
        return self.t_verify[0] if self.n_verify[0] > 0 else 0.0

    cdef double _verify_measured(self, int k) noexcept:
        """Measured verify time of ``k`` drafts, brought to the current load."""
        if k == 0:
            return self.t_verify[0]
        return self.t_verify[k] * self._load_factor(self.ref_verify[k])

    cdef double _verify_time(self, int k) noexcept:
        """Verify time for ``k`` drafts (``k + 1`` rows), never below a plain round's: more
        rows never cost less than one, whatever a noisy sample says (on a tiny model such a
        sample would make a drafter whose every draft is rejected look worth asking)."""
        cdef double t = self._verify_time_estimate(k)
        if k > 0 and self.n_verify[0] > 0 and t < self.t_verify[0]:
            return self.t_verify[0]
        return t

    cdef double _verify_time_estimate(self, int k) noexcept:
        """Verify time for ``k`` drafts: past ``LINE_FROM`` the cost line once it is fitted;
        else measured, else interpolated from the measured lengths (or extrapolated, +30% a
        row)."""
        cdef double a, b
        if k > LINE_FROM and self.n_verify[0] > 0 and self._line(&a, &b):
            return (a + b * k) * self.t_verify[0]
        if self.n_verify[k] > 0:
            return self._verify_measured(k)
        cdef int lo = -1, hi = -1, j
        cdef double t_lo
        for j in range(k - 1, -1, -1):
            if self.n_verify[j] > 0:
                lo = j
                break
        for j in range(k + 1, self.n_max + 1):
            if self.n_verify[j] > 0:
                hi = j
                break
        if lo >= 0 and hi >= 0:
            t_lo = self._verify_measured(lo)
            return t_lo + (self._verify_measured(hi) - t_lo) * (k - lo) / (hi - lo)
        if lo >= 0:
            return self._verify_measured(lo) * (1.0 + 0.3 * (k - lo))
        if hi >= 0:
            return self._verify_measured(hi) / (1.0 + 0.3 * (hi - k))
        return 1.0 + 0.3 * k

    cdef double _draft_time(self, int c) noexcept:
        """Drafter time when asked for ``c`` tokens (0 for ``c == 0``: no call)."""
        if c <= 0:
            return 0.0
        if self.n_draft_cap[c] > 0:
            return self.t_draft_cap[c] * self._load_factor(self.ref_draft[c])
        # unmeasured: proportional to the cap from the nearest measured one
        cdef int j
        for j in range(1, self.n_max + 1):
            if c - j >= 1 and self.n_draft_cap[c - j] > 0:
                return self._draft_time(c - j) * c / (c - j)
            if c + j <= self.n_max and self.n_draft_cap[c + j] > 0:
                return self._draft_time(c + j) * c / (c + j)
        return 0.0

    cdef double _alpha(self, int i) noexcept:
        """P(draft i accepted | drafts < i accepted): decayed counts plus a prior, which
        for i > 1 is the estimate at i - 1 (a fixed optimistic prior would make rarely tried
        deep positions look good)."""
        cdef double a = PRIOR_ALPHA
        cdef int j
        for j in range(1, i + 1):
            a = self._alpha_after(j, a)
        return a

    cdef inline double _alpha_after(self, int i, double prior) noexcept:
        """alpha_i from its decayed counts and ``prior`` (alpha_{i-1}, or PRIOR_ALPHA)."""
        return (self.s_alpha[i] + prior * PRIOR_N) / (self.n_alpha[i] + PRIOR_N)

    cdef double _expected_tokens(self, int k) noexcept:
        cdef double e = 1.0, p = 1.0, a = PRIOR_ALPHA
        cdef int i
        for i in range(1, k + 1):
            a = self._alpha_after(i, a)
            p *= a
            e += p
        return e

    cdef bint _drafting_nearly_free(self) noexcept:
        """Whether drafting is nearly free (the full cap costs < 5% of a plain round)."""
        return self._draft_time(self.n_max) < FREE_DRAFT * self._verify_time(0)

    cdef double _token_rate(self, int k) noexcept:
        return self._expected_tokens(k) / self._verify_time(k)

    cdef int _best_cap(self, double * gain) noexcept:
        """The cap to ask for (0: none pays); ``gain`` gets the best drafting rate over the
        plain rate, whether it pays or not."""
        cdef int c, best = 0
        cdef double r, r_max = 0.0, plain = self._token_rate(0), cal = self._calibration()
        for c in range(1, self.n_max + 1):
            r = cal * self._expected_tokens(c) / (self._draft_time(c) + self._verify_time(c))
            if r > r_max:
                r_max = r
                best = c
        gain[0] = r_max / plain
        # near break-even the estimates' noise decides, and a wrong "draft" costs more than
        # a wrong "don't": drafting must promise a margin over plain decoding
        return best if gain[0] > 1.0 + MARGIN else 0

    cdef int _probe_cap(self) noexcept:
        """The best cap with alpha_i >= alpha_1 at every depth: a probe of one token
        refreshes alpha_1 only, so deeper estimates that a few early misses pushed down
        would never be tried again."""
        cdef int c, best = 1
        cdef double a1 = self._alpha(1), a = PRIOR_ALPHA, e = 1.0, p = 1.0, r, best_rate = 0.0
        for c in range(1, self.n_max + 1):
            a = self._alpha_after(c, a)
            p *= a if a > a1 else a1
            e += p
            r = e / (self._draft_time(c) + self._verify_time(c))
            if r > best_rate:
                best_rate = r
                best = c
        return best

    cpdef bint probes_new_requests(self):
        """Whether a request that begins now begins with a probe of its own: a new text may be
        one the drafter knows, whatever the last ones taught the policy, so a nearly free
        drafter (n-gram, suffix) that does not pay drafts its whole cap for the new request
        (and again while such probes are all accepted: ``_round_budget.wanted``). Only that
        request's sequence probes: the policy's schedule, which every sequence sharing it
        follows, is left as it is (restarting it made all the sequences of an Engine's round
        probe each time one request joined: at 4 slots, a whole-cap verify of four sequences
        per request). A costly drafter gets none: its first draft in a request would first
        catch up on the whole prompt (an MTP head decodes every row it missed). Nor does one
        none of whose drafts the acceptance estimates remember accepted (~50 verified drafts):
        its probes would only cost (5% of plain decoding on a target rolled back by
        checkpoints, where a missed draft is decoded again)."""
        return self.adaptive and self._drafting_nearly_free() and self.s_alpha[1] >= RIGHT_BEFORE

    cpdef void restart_probes(self):
        """What a request's beginning did before requests probed on their own: the schedule of
        every sequence sharing the policy probes now, then on the shortest gap (where
        ``probes_new_requests``). For comparison only (``_checks.shared_request_probe``)."""
        if self.probes_new_requests():
            self.probe_gap = PROBE_EVERY
            self.last_probe = 0

    cdef int cap(self, long round_id=-1) noexcept:
        """How many tokens to ask the drafter for this round. ``round_id``: the controller's
        id of the round (-1: a round of its own). Sequences that share the policy in one
        round (an Engine's requests of one configuration) get the round's one decision, and
        the round counts once: counted per sequence, the probe and plain-round schedules ran
        4-8x faster than designed at 4-8 sequences."""
        if not self.adaptive or self.n_max == 0:
            self.exploring = False
            self.probing = False
            return self.n_max
        if round_id >= 0 and round_id == self.round_id:
            return self.last_cap
        self.round_id = round_id
        self.exploring = False
        self.probing = False
        self.rounds += 1
        return self._decide_cap()

    cdef int _decide_cap(self) noexcept:
        """``cap``'s decision for a new round (``rounds`` counted)."""
        if self.probe_open:           # a probe whose round's time never came: judged without
            self.probe_open = False
            self._probed(self.probe_paid)
        cdef double gain
        cdef int best = self._best_cap(&gain)
        self.last_gain = gain
        # plain rounds measure what drafting has to beat: every PLAIN_EVERY-th, and every
        # 8th until 4 were measured while the call is close (tv(0) decides it; a drafter far
        # ahead of plain would only lose those rounds: 15% of a short request)
        if self.rounds % PLAIN_EVERY == 2 or (
                self.n_verify[0] < 4 and (gain < 1.3 or self.n_verify[0] == 0)
                and self.rounds % EXPLORE_EVERY == 2):
            self.last_cap = 0
            return 0
        if best == 0:
            # drafting does not pay: probe now and then, less often while it keeps not paying
            # ... but not before a few drafts were measured: a cold first decode must not
            # switch a good drafter off for the next 16 rounds
            if self.n_drafts_seen >= MIN_TRIALS and self.rounds - self.last_probe < self.probe_gap:
                self.last_cap = 0
                return 0
            # the probe's schedule moves on when it verified a draft (``choose``, ``observe``)
            self.exploring = True
            self.probing = True
            # a free drafter is probed with everything it has, a costly one with the cap
            # that would pay best if deeper drafts were as good as the first
            best = self.n_max if self._drafting_nearly_free() else self._probe_cap()
        else:
            self.probe_gap = PROBE_EVERY
            self.last_probe = 0
            if self.rounds % EXPLORE_EVERY == 0:
                self.exploring = True
                best = self.n_max if self._drafting_nearly_free() else min(self.n_max, best + 1)
        self.last_cap = best
        return best

    cdef int choose(self, int proposed, double t_drafted) noexcept:
        """The prefix of a proposal worth verifying, the drafting time being spent."""
        if not self.adaptive:
            return proposed
        if proposed <= 0:
            if self.probing and not self._drafting_nearly_free():
                self._probed(False)      # a costly drafter's answer, empty or not, was the probe
            self._predict(0, t_drafted)
            return 0
        cdef int k, best = 0
        cdef double n_best
        if self.exploring:
            # the least measured length, until it has MEASURED samples: verify cost is not
            # monotonic in the rows (kernels tile by 4), so no short length's cost may be left
            # to interpolation; once measured, the load factor keeps it current, and cutting a
            # good draft short every EXPLORE_EVERY rounds would cost ~10% of the tokens. The
            # lengths past LINE_FROM are one, the cost line's: the whole proposal measures it
            best = proposed
            n_best = self.n_verify[proposed] if proposed <= LINE_FROM else self.n_long
            for k in range(min(proposed - 1, LINE_FROM), 0, -1):
                if self.n_verify[k] < n_best:
                    best = k
                    n_best = self.n_verify[k]
            if n_best >= MEASURED:
                # a probe verifies what it asked for: it is there to test the acceptance
                # that the estimates rule out
                best = proposed if self.probing else 0
            if best > 0:
                self.current = best
                self._predict(best, t_drafted)
                return best
        cdef double r, best_rate = 1.0 / (t_drafted + self._verify_time(0))
        for k in range(1, proposed + 1):
            r = self._expected_tokens(k) / (t_drafted + self._verify_time(k))
            if r > best_rate:
                best_rate = r
                best = k
        self.current = best
        self._predict(best, t_drafted)
        return best

    cdef double p_stop(self) noexcept:
        """The draft probability below which a drafter that knows its own (a model's
        softmax) should stop this round's draft: one more draft token, right with about
        that probability, must be worth its draft step at the token rate the cap promises,
        ``p >= (td(c) / c) / ((td(c) + tv(c)) / E(c))``. 0 for a fixed length, while the cap's
        draft time is unmeasured, or when no draft is asked; at most ``P_STOP_MAX``, so
        noisy estimates never stop a drafter at its surest guesses."""
        cdef int c = self.last_cap
        if not self.adaptive or c <= 0 or self.n_draft_cap[c] == 0:
            return 0.0
        cdef double td = self._draft_time(c), t = td + self._verify_time(c)
        if t <= 0.0:
            return 0.0
        return min(P_STOP_MAX, (td / c) * self._expected_tokens(c) / t)

    cdef void _predict(self, int k, double t_drafted) noexcept:
        """What the round verifying ``k`` drafts should yield and cost (``predicted_time`` 0
        while that length's verify time is unmeasured: a guess is no base for calibration)."""
        self.predicted_tokens = self._expected_tokens(k)
        self.predicted_time = t_drafted + self._verify_time(k) if self.n_verify[k] > 0 else 0.0

    cdef bint _pays_if_all_accepted(self, int c) noexcept:
        """Whether the cap ``c`` would pay if every draft were accepted."""
        return ((c + 1) * self._verify_time(0)
                > (1.0 + MARGIN) * (self._draft_time(c) + self._verify_time(c)))

    cdef void _probed(self, bint paid) noexcept:
        """A probe was made. ``paid``: every draft it verified was accepted, and the cap would
        pay at that rate; then the next probe follows at once (the text may have turned to one
        the drafter knows: one probe cannot outweigh the ~50 rounds the acceptance estimates
        remember, a run of them can). Otherwise the gap doubles while probes keep missing."""
        if paid:
            self.last_probe = self.rounds - self.probe_gap
            return
        if self.last_gain >= NEAR_GAIN:
            # near break-even the estimates' noise may be all that switched it off (a few early
            # misses, one preempted sample): probe often, and each probe refreshes them
            self.probe_gap = NEAR_GAP
        elif self.last_probe > 0 and self.n_drafts_seen >= MIN_TRIALS:
            self.probe_gap = min(2 * self.probe_gap, MAX_PROBE_GAP)
        # ... but never so often that probes lose more than PROBE_BUDGET of the time
        self.probe_gap = max(self.probe_gap, self._budget_gap())
        self.last_probe = self.rounds

    cdef long _budget_gap(self) noexcept:
        """The fewest rounds between probes for their catch-up to cost at most
        ``PROBE_BUDGET`` of the time, by the measured catch-up of probe rounds (0 before one
        was measured).

        A drafter with a context of its own (an MTP head, EAGLE-3) decodes, at its first
        draft after a pause, every row it sat out (``_target_fed``): a probe after G plain
        rounds pays G rows' catch-up. The model's times leave the catch-up out (it is no
        cost of a draft length), so near break-even they called a probe nearly free: the
        bench's MTP head right half the time drafted 2 tokens in 4 requests and ran at 0.92x
        plain. Where a row's catch-up costs more than ``PROBE_BUDGET`` of a plain round, the
        gap grows with each probe (the catch-up grows with it) up to ``MAX_BUDGET_GAP``: such
        a drafter, once it does not pay, is not probed within a request."""
        # shrunk towards 0 by the probes measured: one missed probe of a drafter that pays
        # must not hold it off for dozens of rounds
        cdef double loss = self.probe_loss * self.n_probe_loss / (self.n_probe_loss + PROBE_SHRINK)
        if loss <= 0.0:
            return 0
        return min(<long>(loss / PROBE_BUDGET) + 1, MAX_BUDGET_GAP)

    cdef void observe(self, int k, int a, double t_dec) noexcept:
        cdef int i
        if k > self.n_max or k < 0:
            return
        if self.probing and k > 0:
            # the probe's schedule moves on once its round's time is known (observe_round)
            self.probe_open = True
            self.probe_paid = a == k and self._pays_if_all_accepted(self.last_cap)
        self.probing = False
        # the first decode of a row count pays a one-off set-up of that batch shape (llama.cpp
        # builds and allocates its graph; an RPC backend asks the servers, a round trip per
        # new tensor shape; a GPU backend loads kernels): no sample of what the length costs
        if not self.warmed[k]:
            self.warmed[k] = 1
        elif k == 0:
            add_time_sample(self.t_verify, self.n_verify, 0, t_dec)
        else:
            add_time_sample_ref(self.t_verify, self.ref_verify, self.n_verify, k, t_dec,
                                self._plain_time_now())
            if k >= LINE_FROM and self.n_verify[0] > 0:
                self._line_sample(k, t_dec)
        # draft i was tried only if drafts 1..i-1 were accepted
        for i in range(1, min(a + 1, k) + 1):
            self.n_alpha[i] = DECAY * self.n_alpha[i] + 1.0
            self.s_alpha[i] = DECAY * self.s_alpha[i] + (1.0 if i <= a else 0.0)
        if k > 0:
            self.n_drafts_seen += 1

    cdef double _calibration(self) noexcept:
        """Measured over predicted token rate of the drafting rounds (1 until 8 were seen, then
        shrunk towards 1 by 16 rounds' worth; within [0.5, 1.1]).

        The model's estimates are averages over rounds unlike the ones it is asked
        about (verify times measured in exploration rounds, acceptance that lags the
        text): near break-even they can make drafting look paying while it runs below
        plain. Scaling the drafting rates by what drafting rounds really yielded closes
        that gap, and recovers as soon as drafting really pays."""
        # 8 decayed rounds before any verdict
        if self.cal_rounds < 7.0 or self.cal_time <= 0.0 or self.cal_tokens_predicted <= 0.0:
            return 1.0
        cdef double c = ((self.cal_tokens / self.cal_time)
                         / (self.cal_tokens_predicted / self.cal_time_predicted))
        # shrunk towards 1 by the rounds seen: a round's token count is noisy (8 rounds leave
        # ~15% of noise, enough to turn a paying drafter off); above 1 only a little: an
        # optimistic error is the one that costs speed
        c = 1.0 + (c - 1.0) * self.cal_rounds / (self.cal_rounds + 16.0)
        return min(1.1, max(0.5, c))

    cdef void observe_round(self, double predicted_tokens, double predicted_time, int tokens,
                            double t, double t_caught=0.0) noexcept:
        """A round that asked the drafter: tokens it gave and its whole time (drafting,
        verification), against the prediction of ``choose``; ``t_caught``: the drafter's
        catch-up in it (no part of the prediction, but of a probe's cost)."""
        cdef double loss
        if self.probe_open:
            self.probe_open = False
            if self.n_verify[0] > 0:
                loss = t_caught / self.t_verify[0]
                self.probe_loss = (DECAY * self.probe_loss * self.n_probe_loss + loss) / (
                    DECAY * self.n_probe_loss + 1.0)
                self.n_probe_loss = DECAY * self.n_probe_loss + 1.0
            self._probed(self.probe_paid)
        if not self.adaptive or predicted_time <= 0.0 or t <= 0.0:
            return
        # clipped as the time estimates' samples are (``add_time_sample``): the prediction is
        # made of clipped averages, and a shared machine's preempted rounds (5x, one in 20) left
        # unclipped here made drafting look ~15% slower than predicted, which scaled a drafter
        # paying 1.2x plain down to the margin and switched it off (plain rounds, the rate it
        # is weighed against, are clipped)
        if t > 2.0 * predicted_time:
            t = 2.0 * predicted_time
        self.cal_tokens = DECAY * self.cal_tokens + tokens
        self.cal_time = DECAY * self.cal_time + t
        self.cal_tokens_predicted = DECAY * self.cal_tokens_predicted + predicted_tokens
        self.cal_time_predicted = DECAY * self.cal_time_predicted + predicted_time
        self.cal_rounds = DECAY * self.cal_rounds + 1.0

    cdef void observe_draft_time(self, int cap, double t) noexcept:
        """Time of one drafter call asked for ``cap`` tokens."""
        if cap <= 0 or cap > self.n_max:
            return
        add_time_sample_ref(self.t_draft_cap, self.ref_draft, self.n_draft_cap, cap, t,
                            self._plain_time_now())

    def state(self) -> dict:
        return {"alpha": [self._alpha(i) for i in range(1, self.n_max + 1)],
                # measured times, brought to the current load (0: not measured yet)
                "t_verify": [self._verify_measured(i) if self.n_verify[i] > 0 else 0.0
                             for i in range(self.n_max + 1)],
                "t_draft_cap": [self._draft_time(i) if self.n_draft_cap[i] > 0 else 0.0
                                for i in range(self.n_max + 1)],
                "current": self.current, "cap": self.last_cap, "calibration": self._calibration(),
                # rounds decided (once per round however many sequences share the policy), the
                # rounds between probes of a drafter that does not pay, and a probe's measured
                # loss in plain rounds' worth (0: none measured)
                "rounds": self.rounds, "probe_gap": self.probe_gap, "probe_loss": self.probe_loss,
                "p_stop": self.p_stop(),
                # the calibration's parts: drafting rounds' tokens and time, measured / predicted
                "cal_tokens": (self.cal_tokens / self.cal_tokens_predicted
                               if self.cal_tokens_predicted else 1.0),
                "cal_time": (self.cal_time / self.cal_time_predicted
                             if self.cal_time_predicted else 1.0)}


cdef class BatchCost:
    """What each sequence of a verify batch pays of its time, for its draft-length policy.

    A decode costs a part that does not grow with its rows (weights read once, threads
    started) and a part per row. Charged the whole batch, a sequence's drafts would look
    free (the batch costs about the same whatever one sequence adds); charged its rows'
    fraction, they would look dear (each row then costs a single decode's share). Each
    sequence pays an equal part of the fixed cost and its rows' part of the rest, from a
    line ``T(R) = a + b R`` fitted (decayed least squares) to the batches' times by row
    count; until the row counts vary, half and half. The shares add up to the batch's time.
    """

    def __init__(self):
        self.n = self.s_r = self.s_rr = self.s_t = self.s_rt = 0.0

    cpdef void observe(self, int rows, double t):
        """A batch of ``rows`` rows took ``t`` seconds."""
        if rows <= 0 or t <= 0.0:
            return
        self.n = DECAY * self.n + 1.0
        self.s_r = DECAY * self.s_r + rows
        self.s_rr = DECAY * self.s_rr + <double>rows * rows
        self.s_t = DECAY * self.s_t + t
        self.s_rt = DECAY * self.s_rt + rows * t

    cdef void _line(self, double * a, double * b) noexcept:
        cdef double mr = self.s_r / self.n, mt = self.s_t / self.n
        cdef double var = self.s_rr / self.n - mr * mr
        b[0] = 0.5 * mt / mr
        if self.n >= 4.0 and var > 0.25:
            b[0] = min(max((self.s_rt / self.n - mr * mt) / var, 0.0), mt / mr)
        a[0] = mt - b[0] * mr

    cpdef double share(self, double t, int rows, int n_seqs, int rows_seq):
        """The part of a batch's time ``t`` (``rows`` rows, ``n_seqs`` sequences) a sequence
        with ``rows_seq`` of the rows pays."""
        if n_seqs <= 1 or rows <= 0:
            return t
        cdef double a = rows, b = 1.0     # half and half before any batch was measured
        if self.n > 0.0:
            self._line(&a, &b)
        return t * (a / n_seqs + b * rows_seq) / (a + b * rows)
