# cython: language_level=3
# distutils: language = c++
"""The draft length of a batch whose drafter has a model, chosen by measuring the batch.

A drafter with a model (an MTP head, a draft model, EAGLE-3, DFlash) drafts every sequence
of a round with one decode of its context per draft step (``propose_batch``), and the
target verifies every sequence's rows in one decode: what a round costs is the batch's
(a decode's fixed part, each draft step, each row), not a sum of sequences' parts. Each
sequence's adaptive policy prices its drafts by its share of the batch (``BatchCost``'s
line ``T(R) = a + b R``) and the draft budget (``_batch_budget``) by that line too: a
model, fitted to the batches the policy happened to choose. On a 2-core CPU, at 4 slots of
the mid bigram model and its MTP head right 90% of the time, the rounds it saw (mostly
plain ones, all of 4 rows) left the line half and half, a row looked twice its cost, and
the adaptive Engine drafted almost nothing (0.83-0.93x plain) where a fixed length of 3
ran at 1.15-1.19x.

So such a batch's length is not modelled but measured: for each number ``n`` of running
sequences, the token rate of whole rounds (drafting, verifying, everything) at each cap
``k`` (0: plain decoding) the batch was given, and the cap with the best rate is used.
It climbs: besides the best cap, its neighbours are tried (every 2nd round while one of
them has fewer than ``MIN_SAMPLES`` rounds, then every 8th, in turn, and every third time
the far cap: one not measured yet, else the best measured past the neighbours), and a cap
that beats the best by ``MARGIN`` becomes the best. Verify and draft costs grow steadily
with the length and acceptance falls with depth, so the rate over ``k`` has one peak (the
far cap is there for the noise that hides it); at the peak, a neighbour costs a few
percent for an eighth of the rounds. While plain decoding is the best, cap 1 and the far
cap are tried in turn after 8 rounds, then 16, ... up to 128 while they keep losing; while drafting is, a plain round in 32 keeps the rate to
beat measured (and jumps back to plain when it wins), so the batch is never held below
plain decoding for long. A batch size first seen starts from the best cap of the nearest
size measured (rows cost relatively more in bigger batches, but the best lengths of
neighbouring sizes are close), else at 2: on a 2-core CPU one verify row more is the dearest
per token (at 4 slots of the mid bigram model, 90%, cap 1 ran no faster than plain decoding
where caps 2-3 ran 1.1-1.2x), so a climb from 1 saw plain decoding win and held it for tens of
rounds, most of a short request; from 2 it tries 1 and 3 first.

Each cap's rate is the ratio of its decayed tokens and seconds (the last ~7 rounds of that
cap). A round's tokens are its sequences' expected ones: what each drafter got accepted is
replaced by what its policy's positions' acceptance (pooled over every sequence and round)
expects at the length it drafted. Sequences of one batch are often at the same text (the
same request several times, one document's questions, the bench's bigram chains), and then
they accept or reject together: on an H200 (1.4B bigram, 8 slots, MTP 70%) single rounds at
cap 3 made 8 to 32 tokens, so the one measured round of a held cap was a draw of 1 in 4, and
cap 4, measured at 8 and 12 tokens (665-880 tok/s against 2,200-2,700 for a fixed length of
4), was never tried again: the adaptive Engine ran 1.05x plain where fixed n4 ran 1.39x.
A round's time clipped at 1.5 times the cap's mean once it has two (a preempted
round on a shared machine, 5x, must not decide; a round's own noise is about 20%). Which sequences and rounds it applies to is the
controller's (``judge``): rounds of two or more sequences all of whose drafting sequences
are adaptive with a model drafter. The cap it gives is each sequence's ``k_cap`` (within
the round's limits), every draft is verified, and each sequence's own policy goes on
learning (acceptance, costs) for rounds it drafts alone.

A drafter with a model catches up on a request's prompt at its first ask: once per request,
whatever the cap, and never under plain decoding. Charged to the round it fell in, it made
that round 2-3 times its cost (4 prompts of ~70 tokens through the MTP layer, at 4 slots on
a 2-core CPU), and the cap that round had (the first cap of every batch of new requests) lost
for the next ~7 rounds: at 90% the Engine settled on plain decoding in one of three runs
where a fixed length of 3 ran 1.1-1.2x. So the catch-up is taken out of the round (the rows
a sequence sat out are, too: a cost of the plain rounds before) and spread over the rounds
instead: every drafting cap's rounds are charged the prompt catch-up per round of that batch
size (decayed over its last ~50 rounds, plain ones included), so that drafting still pays it
against plain decoding, evenly.

While plain decoding is best, a try of drafting pays that catch-up too: the drafter decodes
every row it sat out (and a new request's prompt) before its first draft step, in order
(llama.cpp takes a sequence's positions only past the last one it holds), about 300 MTP rows
at 4 slots of the mid bigram model, 5% of a 48-token pass, for every try. The tries doubling
up to every 128 rounds cost the floor 3-7% at 50-70%; so each try's cost past plain
decoding's rate, its catch-up included (``try_cost``), spaces the next ones: at least as many
rounds apart as keeps them within ``TRY_BUDGET`` (2%) of plain decoding's time (at most
``MAX_TRY_GAP``). Tries that cost little keep the doubling schedule.

Where a new shape is dear (``steady``: a target on a CUDA device, see ``_steady_rows``), a
round whose cap differs from the round before runs uncaptured, the next one captures the graph
again, and only the third runs at the cap's steady cost:
on an H200 with the ~1.4B bigram model that made a tried cap's one round about twice its
steady cost, so every cap tried for one round lost to the one held, and the adaptive Engine
at 8 slots stayed at plain decoding (0.91x) where a fixed length of 4 ran at 1.6-1.9x. There
a changed cap is held for ``HOLD`` rounds and only the last is measured;
the schedules count decisions, and explore ``STEADY_SPARSER`` times less often (a try costs
its rounds and two captures); a batch size first seen starts from the cap at its top
(rows are nearly free on such a device: the climb goes down from there).
"""
from libcpp.vector cimport vector

from ._round_budget cimport expected_less_accepted
from ._seq cimport _Seq

DEF DECAY = 0.85          # a cap's rate follows its last ~7 rounds
DEF MIN_SAMPLES = 2       # rounds of a cap before its rate is compared
DEF EARLY_EVERY = 2       # a neighbour tried every 2nd round while one lacks samples ...
DEF EXPLORE_EVERY = 8     # ... then every 8th
DEF PLAIN_EVERY = 32      # while drafting is best (cap >= 2), a plain round in 32
DEF UP_FIRST = 8          # plain best: cap 1 tried after 8 rounds, doubling while it loses
DEF UP_MAX = 128
DEF CLIP = 1.5           # a round's time counts at most this many times its cap's mean
DEF MARGIN = 0.02         # a neighbour must beat the best by this much (the rates' noise)
DEF START = 2             # the first cap of a batch size with no measured neighbour
DEF HOLD = 3              # steady: rounds a changed cap is held, the last one measured
DEF STEADY_SPARSER = 6    # steady: exploration and plain checks this many times rarer
DEF PROMPT_DECAY = 0.98   # the prompt catch-up per round follows the last ~50 rounds
DEF TRY_BUDGET = 0.02     # plain best: tries of drafting cost at most this share of the time
DEF MAX_TRY_GAP = 1024    # ... and come at least this often (rounds)


# a round counts its sequences' expected accepted drafts (see the module); off, their draw
# (the old behaviour, for comparisons: ``_checks.expected_tokens``)
cdef bint EXPECTED_TOKENS = True


cdef bint set_expected_tokens(bint on) noexcept:
    """Set ``EXPECTED_TOKENS``; returns the value it had."""
    global EXPECTED_TOKENS
    cdef bint old = EXPECTED_TOKENS
    EXPECTED_TOKENS = on
    return old


cdef class BatchLength:
    """BatchLength(n_seq_max, steady=False)
--

    The measured draft length of rounds of 2..``n_seq_max`` sequences (see the module);
    ``steady``: a new shape is dear (a changed cap held, its first rounds not measured)."""

    def __init__(self, int n_seq_max, bint steady=False):
        self.n_seq_max = max(n_seq_max, 1)
        self.steady = steady
        self.last_n = self.last_k = -1
        self.hold_left = 0
        cdef int m = self.n_seq_max + 1
        self.tok.assign(m, vector[double]())
        self.sec.assign(m, vector[double]())
        self.w.assign(m, vector[double]())
        self.cnt.assign(m, vector[int]())
        self.best.assign(m, -1)
        self.rounds.assign(m, 0)
        self.side.assign(m, 0)
        self.up_gap.assign(m, UP_FIRST)
        self.up_last.assign(m, 0)
        self.prompt_sec.assign(m, 0.0)
        self.prompt_w.assign(m, 0.0)
        self.try_cost.assign(m, 0.0)
        self.n_rounds = self.n_switches = 0
        self.kind = self.n_in = self.k_round = 0
        self.tokens0 = 0

    cdef void _size(self, int n, int k_top) noexcept:
        """Room for caps ``0..k_top`` at ``n``."""
        if <int>self.tok[n].size() < k_top + 1:
            self.tok[n].resize(k_top + 1, 0.0)
            self.sec[n].resize(k_top + 1, 0.0)
            self.w[n].resize(k_top + 1, 0.0)
            self.cnt[n].resize(k_top + 1, 0)

    cdef double rate(self, int n, int k) noexcept:
        """Measured tokens per second of the rounds of ``n`` sequences at cap ``k`` (0: none)."""
        if n < 1 or n > self.n_seq_max or k < 0 or k >= <int>self.tok[n].size():
            return 0.0
        if self.sec[n][k] <= 0.0:
            return 0.0
        if k == 0:
            return self.tok[n][k] / self.sec[n][k]
        return self.tok[n][k] / (self.sec[n][k] + self.w[n][k] * self.prompt_per_round(n))

    cdef void charge_try(self, int n, int k, double tokens, double t, double t_caught) noexcept:
        """A round at cap ``k`` while plain decoding is best (a try): what it cost past plain
        decoding's rate, its drafters' catch-up ``t_caught`` (prompts, rows sat out) included."""
        if n < 2 or n > self.n_seq_max or k <= 0 or self.best[n] != 0:
            return
        cdef double r0 = self.rate(n, 0), cost
        if r0 <= 0.0:
            return
        cost = t_caught + max(0.0, t - tokens / r0)
        self.try_cost[n] = cost if self.try_cost[n] <= 0.0 else 0.5 * (self.try_cost[n] + cost)

    cdef int _try_gap(self, int n) noexcept:
        """Plain best: the fewest rounds between tries that keeps their cost (``try_cost``)
        within ``TRY_BUDGET`` of plain decoding's time."""
        cdef double r0 = self.rate(n, 0)
        if r0 <= 0.0 or self.try_cost[n] <= 0.0:
            return 0
        return <int>min(self.try_cost[n] * r0 / (TRY_BUDGET * n), <double>MAX_TRY_GAP)

    cdef double prompt_per_round(self, int n) noexcept:
        """The drafters' prompt catch-up per round of ``n`` sequences (see the module)."""
        return self.prompt_sec[n] / self.prompt_w[n] if self.prompt_w[n] > 0.0 else 0.0

    cdef void charge_prompt(self, int n, double t) noexcept:
        """A round of ``n`` sequences whose drafters caught up on prompts for ``t`` seconds
        (0: none; every judged round counts, plain ones too)."""
        if n < 2 or n > self.n_seq_max:
            return
        self.prompt_sec[n] = PROMPT_DECAY * self.prompt_sec[n] + max(t, 0.0)
        self.prompt_w[n] = PROMPT_DECAY * self.prompt_w[n] + 1.0

    cdef bint _measured(self, int n, int k) noexcept:
        return 0 <= k < <int>self.cnt[n].size() and self.cnt[n][k] >= MIN_SAMPLES

    cdef int _start(self, int n, int k_top) noexcept:
        """The first best cap at ``n``: the nearest measured size's, else ``START``."""
        cdef int d
        for d in range(1, self.n_seq_max + 1):
            if n + d <= self.n_seq_max and self.best[n + d] >= 0:
                return min(self.best[n + d], k_top)
            if n - d >= 2 and self.best[n - d] >= 0:
                return min(self.best[n - d], k_top)
        return k_top if self.steady else min(START, k_top)

    cdef int _far(self, int n, int b, int k_top) noexcept:
        """The cap past the best's neighbours to try (-1: none): one not measured yet, else
        the best measured. The rate over the cap has one peak, but a round's noise can hide
        it behind a neighbour that looks worse (at 8 slots, cap 1 lost to plain decoding
        while cap 4 beat it)."""
        cdef int c, far = -1
        cdef double r_far = 0.0
        for c in range(k_top + 1):
            if c >= b - 1 and c <= b + 1:
                continue
            if not self._measured(n, c):
                return c
            if self.rate(n, c) > r_far:
                r_far = self.rate(n, c)
                far = c
        return far

    cdef int decide(self, int n, int k_top) noexcept:
        """The cap of a round of ``n`` sequences whose caps may go up to ``k_top``."""
        if n < 2 or n > self.n_seq_max or k_top <= 0:
            return max(k_top, 0)
        cdef int k
        if not self.steady:
            return self._decide(n, k_top)
        if self.hold_left > 0 and n == self.last_n and self.last_k <= k_top:
            # a changed cap's later rounds: its graph captured, then run captured
            self.hold_left -= 1
            return self.last_k
        k = self._decide(n, k_top)
        self.hold_left = HOLD - 1 if n != self.last_n or k != self.last_k else 0
        self.last_n = n
        self.last_k = k
        return k

    cdef int _decide(self, int n, int k_top) noexcept:
        """``decide``'s schedule: one call per decision (a held cap's rounds are one)."""
        self._size(n, k_top)
        if self.best[n] < 0:
            self.best[n] = self._start(n, k_top)
        cdef int b = min(self.best[n], k_top), r, lo, hi, far
        cdef int sparse = STEADY_SPARSER if self.steady else 1
        self.rounds[n] += 1
        r = self.rounds[n]
        lo = b - 1
        hi = b + 1 if b + 1 <= k_top else -1
        if b == 0:
            # plain decoding is best: cap 1 (or the far cap) now and then, less often while
            # drafting keeps losing
            if r - self.up_last[n] >= max(self.up_gap[n], self._try_gap(n)):
                self.up_last[n] = r
                self.side[n] = 1 - self.side[n]
                far = self._far(n, 0, k_top)
                return far if self.side[n] and far > 0 else 1
            return 0
        cdef bint early = not (self._measured(n, b) and self._measured(n, lo)
                               and (hi < 0 or self._measured(n, hi)))
        if r % (EARLY_EVERY if early else EXPLORE_EVERY * sparse) == 0:
            if early:
                if hi < 0 or not self._measured(n, lo):
                    return lo
                return hi
            # the neighbours in turn, and every third time the far cap
            self.side[n] = (self.side[n] + 1) % 3
            far = self._far(n, b, k_top)
            if self.side[n] == 2 and far >= 0:
                return far
            return hi if self.side[n] == 1 and hi >= 0 else lo
        if b >= 2 and r % (PLAIN_EVERY * sparse) == 3:      # (odd: never a neighbour's round)
            return 0
        return b

    cdef void observe(self, int n, int k, double tokens, double t) noexcept:
        """A round of ``n`` sequences at cap ``k`` made ``tokens`` tokens in ``t`` seconds."""
        if n < 2 or n > self.n_seq_max or k < 0 or t <= 0.0 or tokens <= 0.0:
            return
        if self.hold_left > 0:
            return      # a changed cap's first rounds (uncaptured, capture): not the cap's cost
        self._size(n, k)
        if self.cnt[n][k] >= MIN_SAMPLES and t > CLIP * self.sec[n][k] / self.w[n][k]:
            t = CLIP * self.sec[n][k] / self.w[n][k]
        self.tok[n][k] = DECAY * self.tok[n][k] + tokens
        self.sec[n][k] = DECAY * self.sec[n][k] + t
        self.w[n][k] = DECAY * self.w[n][k] + 1.0
        self.cnt[n][k] += 1
        cdef int b = self.best[n], c, top = <int>self.tok[n].size() - 1
        if b < 0:
            return
        b = min(b, top)
        if not self._measured(n, b):
            return
        cdef int nb = b
        cdef double r_best = self.rate(n, b)
        for c in range(top + 1):
            if c == b or not self._measured(n, c):
                continue
            if self.rate(n, c) > (1.0 + MARGIN) * r_best:
                r_best = self.rate(n, c)
                nb = c
        if nb != b:
            self.best[n] = nb
            self.n_switches += 1
            if nb == 0:
                self.up_gap[n] = UP_FIRST
                self.up_last[n] = self.rounds[n]
        elif b == 0 and k > 0:
            self.up_gap[n] = min(2 * self.up_gap[n], UP_MAX)     # drafting lost again

    cdef int judge(self, list seqs) except -1:
        """Before drafting, the round's running ``seqs`` (``k_lim`` set): 1 when their length
        is the batch's (their ``k_cap`` set, ``batch_len`` marked), else 0 (their policies
        decide, and the batch's floor)."""
        cdef _Seq s
        cdef int k_top = 0, n_drafting = 0
        self.kind = 0
        for s in seqs:
            s.batch_len = False
        if len(seqs) < 2:
            return 0
        for s in seqs:
            if s.req.n_drafters == 0:
                continue
            if not (s.req.policy.adaptive and s.req.model_drafter):
                return 0
            n_drafting += 1
            k_top = max(k_top, s.req.policy.n_max)
        if n_drafting == 0 or k_top <= 0:
            return 0
        self.n_in = len(seqs)
        self.k_round = self.decide(self.n_in, k_top)
        self.kind = 1
        self.n_rounds += 1
        self.tokens0 = 0
        for s in seqs:
            self.tokens0 += s.req.out.n_tokens
            if s.req.n_drafters > 0:
                s.batch_len = True
                s.k_cap = min(self.k_round, s.k_lim, s.req.policy.n_max)
        return 1

    cdef int settle(self, list seqs, double t) except -1:
        """After the round judged last (``seqs``: the same sequences), which took ``t``
        seconds: its tokens, at its cap."""
        cdef _Seq s
        cdef long tokens = -self.tokens0
        cdef double t_prompt = 0.0, t_caught = 0.0, expected = 0.0
        if self.kind == 0:
            return 0
        for s in seqs:
            tokens += s.req.out.n_tokens
            if EXPECTED_TOKENS:
                expected += expected_less_accepted(s)
            # the drafter's catch-up on the rows it sat out (plain rounds before): a cost of
            # the cap the rounds before had, not of this one's (counted here, a cap tried
            # after plain rounds looked 10-20% dearer than it runs, and lost to plain); its
            # catch-up on a request's prompt: spread over the rounds (see the module); both,
            # the cost of a try while plain decoding is best (see the module)
            t_caught += s.t_caught
            t_prompt += s.t_caught - s.t_caught_out
        self.take(self.n_in, self.k_round, max(tokens + expected, 1.0), t - t_caught, t_prompt,
                  t_caught)
        self.kind = 0
        return 0

    cdef void take(self, int n, int k, double tokens, double t, double t_prompt,
                   double t_caught) noexcept:
        """A round measured: ``t`` seconds without its drafters' catch-up ``t_caught``, of
        which ``t_prompt`` was on prompts (spread over the rounds), the rest on rows sat out."""
        self.charge_try(n, k, tokens, t, t_caught)
        self.charge_prompt(n, t_prompt)
        self.observe(n, k, tokens, t)

    def decide_round(self, int n, int k_top) -> int:
        """``decide`` from Python: the cap of a round of ``n`` sequences (caps up to ``k_top``)."""
        return self.decide(n, k_top)

    def observe_round(self, int n, int k, double tokens, double seconds,
                      double prompt=0.0, double sat=0.0) -> None:
        """``observe`` from Python; ``prompt``, ``sat``: the round's catch-up on prompts and on
        rows sat out (neither in ``seconds``)."""
        self.take(n, k, tokens, seconds, prompt, prompt + sat)

    def state(self, int n) -> dict:
        """At ``n`` sequences: the best cap (-1: none yet), each cap's rate (tokens/s, 0
        unmeasured) and rounds, the rounds decided."""
        if n < 0 or n > self.n_seq_max:
            raise ValueError(f"n must be in 0..{self.n_seq_max}")
        return {"best": self.best[n], "rounds": self.rounds[n], "steady": self.steady,
                "rates": [self.rate(n, k) for k in range(self.tok[n].size())],
                "samples": [self.cnt[n][k] for k in range(self.cnt[n].size())],
                "up_gap": self.up_gap[n], "switches": self.n_switches,
                "prompt_per_round": self.prompt_per_round(n),
                "try_cost": self.try_cost[n], "try_gap": self._try_gap(n),
                "judged": self.n_rounds}
