# cython: language_level=3
# distutils: language = c++
"""The draft budget of a round: how many verify rows the whole batch gets, and whose drafts
they go to (adaptive policy, several sequences in a verify batch).

Each sequence's own policy weighs its drafts against its share of the batch's time
(``BatchCost.share``); what it cannot see is the batch. A verify of ``R`` rows costs
``T(R) = a + b R`` (``BatchCost``'s line, measured on this device): on a GPU ``b`` is
nearly nothing until the batch is large, on a CPU a row costs about what a plain token
does. A round of ``n`` sequences yields ``n`` tokens plus, for each draft row of sequence
``s`` at depth ``i``, the probability ``P_s(i)`` that its drafts ``1..i`` are all accepted.
Adding a row of cost ``c`` and worth ``P`` raises the round's token rate iff
``P * time > c * tokens``; the rows are taken best first (worth over cost, a sequence's
deeper rows after its shallower ones) while they pay by a margin, so the batch gets the
rows that pay and no others, and under load, where none pays, it verifies no drafts at
all: never below plain decoding.

``P_s`` comes from each request's own acceptance (``Acceptance``), not from one estimate
shared by the requests of an Engine: a batch mixing a request whose drafter is always
right with one whose drafter is mostly wrong drafts for the first, not for their average.
"""
from libcpp.vector cimport vector

from ._policy cimport DraftPolicy

DEF PRIOR_N = 4.0          # the shared policy's estimate counts as this many trials
DEF DECAY = 0.98           # as the policy's: old trials fade (a window of ~50 rounds)
DEF MARGIN = 0.02          # a row must raise the rate by this much (the estimates' noise)


cdef class Acceptance:
    """Acceptance(n_max)
--

    One request's acceptance per draft position: decayed counts of its own rounds, with
    the shared policy's estimate when the request began as the prior (worth a few trials,
    so a request's own text takes over within a few rounds)."""

    def __init__(self, int n_max):
        self.n_max = n_max
        self.n_alpha.assign(n_max + 1, 0.0)
        self.s_alpha.assign(n_max + 1, 0.0)
        self.prior.assign(n_max + 1, 0.85)

    cdef void begin(self, DraftPolicy shared) noexcept:
        cdef int i
        for i in range(1, self.n_max + 1):
            self.prior[i] = shared._alpha(i) if i <= shared.n_max else self.prior[i - 1]
            self.n_alpha[i] = self.s_alpha[i] = 0.0

    cdef void observe(self, int k, int a) noexcept:
        """A verify of ``k`` drafts accepted ``a``: draft i was tried if 1..i-1 were kept."""
        cdef int i
        for i in range(1, min(min(a + 1, k), self.n_max) + 1):
            self.n_alpha[i] = DECAY * self.n_alpha[i] + 1.0
            self.s_alpha[i] = DECAY * self.s_alpha[i] + (1.0 if i <= a else 0.0)

    cdef double alpha(self, int i) noexcept:
        """P(draft i accepted | drafts before it accepted)."""
        if i < 1 or i > self.n_max:
            return 0.0
        return (self.s_alpha[i] + self.prior[i] * PRIOR_N) / (self.n_alpha[i] + PRIOR_N)

    cdef double gain(self, int i) noexcept:
        """P(drafts 1..i all accepted): what a verify row at depth i is worth."""
        cdef double p = 1.0
        cdef int j
        for j in range(1, i + 1):
            p *= self.alpha(j)
        return p

    def estimate(self) -> list:
        """alpha_1 .. alpha_n_max of this request."""
        return [self.alpha(i) for i in range(1, self.n_max + 1)]

    def observe_round(self, int k, int a) -> None:
        self.observe(k, a)


cdef int allocate(int n, const int * k_max, const double * gain, int stride,
                  const double * row_cost, double tokens, double time, double margin,
                  int * k_out) noexcept:
    """Rows for ``n`` sequences: ``k_out[s] <= k_max[s]`` drafts of sequence ``s`` whose row
    at depth ``i`` is worth ``gain[s * stride + i]`` tokens and costs ``row_cost[s]``
    seconds, for a round that yields ``tokens`` in ``time`` without them; the rows that
    raise its token rate by ``margin``, best first. Returns the rows given."""
    cdef int s, i, best, rows = 0
    cdef double g, r, best_r
    for s in range(n):
        k_out[s] = 0
    while True:
        best = -1
        best_r = 0.0
        for s in range(n):
            i = k_out[s] + 1
            if i > k_max[s] or row_cost[s] <= 0.0:
                continue
            r = gain[s * stride + i] / row_cost[s]
            if r > best_r:
                best_r = r
                best = s
        if best < 0:
            return rows
        g = gain[best * stride + k_out[best] + 1]
        if g * time <= (1.0 + margin) * row_cost[best] * tokens:
            return rows
        tokens += g
        time += row_cost[best]
        k_out[best] += 1
        rows += 1


def allocate_rows(gains, row_costs, double tokens, double time, double margin=MARGIN) -> list:
    """``allocate`` from Python: ``gains[s][i - 1]`` is the worth of sequence ``s``'s row at
    depth ``i`` (its drafts' count is ``len(gains[s])``); returns the drafts per sequence."""
    cdef int n = len(gains), s, i, stride = 1
    for g in gains:
        stride = max(stride, len(g) + 1)
    cdef vector[int] k_max, k_out
    cdef vector[double] flat, cost
    k_max.resize(n)
    k_out.resize(n)
    flat.assign(<size_t>n * stride, 0.0)
    cost.resize(n)
    if len(row_costs) != n:
        raise ValueError("one row cost per sequence")
    for s in range(n):
        k_max[s] = len(gains[s])
        cost[s] = row_costs[s]
        for i in range(len(gains[s])):
            flat[s * stride + i + 1] = gains[s][i]
    allocate(n, k_max.data(), flat.data(), stride, cost.data(), tokens, time, margin,
             k_out.data())
    return [k_out[s] for s in range(n)]
