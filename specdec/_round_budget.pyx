# cython: language_level=3
# distutils: language = c++
"""The draft lengths of a round: each sequence's own draft-length policy, then the batch's
draft budget (``_batch_budget``), twice a round.

Each sequence first wants what its policy's cap says (``wanted``); a request of a nearly free
drafter that was right before begins with a probe of its own while its policy drafts nothing
(``DraftPolicy.probes_new_requests``): its sequence alone drafts its whole cap and verifies
it, and probes again while such probes are all accepted. The policy's schedule, which every
sequence sharing it follows, stays as it is: restarting it for each new request made every
sequence of an Engine's round probe whenever one request joined.

Before drafting, ``draft_caps`` gives each sequence the cap and confidence floor its
drafters are asked for; after drafting, ``draft_lengths`` the drafts it verifies. The budget
applies to several sequences under the adaptive policy once verify batches were measured:
before drafting it cuts the caps to the rows that would pay for the whole batch, their
draft time counted; after drafting it gives the verify rows to the drafts that pay, by each
request's own acceptance. A round a sequence's policy explores or probes in keeps what its
policy chose, and under load no sequence drafts. A round whose cap is the batch's measured
length (``_batch_length``: a batch drafted by a model) verifies every draft, uncut.

A drafter that knows the probability of its whole draft so far (the suffix drafter's path
probability) is told, as its confidence floor ``p_stop``, the probability a verify row must
be kept with to pay in this batch (``row_floor``): it then drafts no row that would not pay,
and keeps the sure drafts of a repeated passage whatever the request's average. On the serve
bench's grounded prompts the suffix drafter's path probability tells few misses apart below
0.5 (a context seen once is certain to it), but a floor of 0.7 dropped a quarter of its
rejected drafts and 0.9 over a third, for the same accepted tokens (gemma3-270m, 8 prompts
twice, 64 tokens, one at a time). At 4 slots on a 2-core CPU a row costs about two thirds of
a plain token (trunk ~1.9 ms, the lazy head ~2.2 ms, against a plain step of ~25 ms for 4
tokens): such rows do not pay there.
"""
from libcpp.vector cimport vector

from ._batch_budget cimport allocate
from ._policy cimport DraftPolicy
from ._output cimport RUNNING
from ._seq cimport _Seq, NO_DRAFT, DRAFTED


DEF MARGIN = 0.02     # a draft row must raise the round's token rate by this much
DEF ROW_FLOOR_MAX = 0.9   # the confidence floor of a row never goes above this (sure drafts go)

# the batch's row price as drafters' confidence floor (``row_floor``); off: the policy's
# draft-step floor only (``_checks.row_floor``: the tests' and benchmarks' comparison)
cdef bint ROW_FLOOR = True


cdef bint set_row_floor(bint on) noexcept:
    """Set ``ROW_FLOOR``; returns the value it had."""
    global ROW_FLOOR
    cdef bint old = ROW_FLOOR
    ROW_FLOOR = on
    return old


# a new request restarts its policy's probe schedule, for every sequence sharing it, instead
# of probing on its own (``_checks.shared_request_probe``: the old behaviour, for comparison)
cdef bint SHARED_REQUEST_PROBE = False


cdef bint set_shared_request_probe(bint on) noexcept:
    """Set ``SHARED_REQUEST_PROBE``; returns the value it had."""
    global SHARED_REQUEST_PROBE
    cdef bint old = SHARED_REQUEST_PROBE
    SHARED_REQUEST_PROBE = on
    return old


cdef int wanted(_Seq s, long round_id) except -1:
    """The drafts ``s`` wants this round (``k_want``): its policy's cap for the round
    ``round_id``, or, where that is 0 and its request is owed a probe of its own, the
    policy's ``n_max`` (``s.probe``). A request is owed one from its first round where its
    policy ``probes_new_requests``, and again after a probe whose drafts were all accepted
    (``observed``); one that verified a draft is owed none, and a probe that drafted nothing
    was none."""
    cdef DraftPolicy pol = s.req.policy
    if s.cnt.rounds == 0:
        if SHARED_REQUEST_PROBE:
            pol.restart_probes()
        else:
            s.req.probe_owed = pol.probes_new_requests()
    s.k_want = pol.cap(round_id)
    s.probe = s.k_want == 0 and s.req.probe_owed
    if s.probe:
        s.k_want = pol.n_max
    return 0


cdef void observed(_Seq s, int k, int a) noexcept:
    """``s`` verified ``k`` drafts and accepted ``a``: whether its request is owed another
    probe (one whose every draft was accepted may have found a text the drafter knows: one
    probe cannot outweigh the rounds its policy's estimates remember, a run of them can)."""
    if k > 0:
        s.req.probe_owed = s.probe and a == k


cdef inline void _own_drafts(_Seq s, int k, int a, int * k_d, int * a_d) noexcept:
    """Of a round of ``s`` that verified ``k`` draft rows and accepted ``a``: its drafter's
    own drafts and accepted ones (a grammar's forced tokens lead the draft; they are none)."""
    cdef int f = min(s.n_forced, k)
    k_d[0] = k - f if a >= f else 0
    a_d[0] = a - f if a >= f else 0


cdef double expected_less_accepted(_Seq s) noexcept:
    """What ``s``'s drafter was expected to get accepted in the round just verified, by its
    policy's positions' acceptance at the length it drafted, less what it got (0 for a
    sequence that finished or did not draft). Added to a round's tokens, the round counts
    its sequences' expected acceptance, not their draw (``_batch_length``)."""
    if s.kind != DRAFTED or s.req.out.finish != RUNNING:
        return 0.0
    cdef int k_d, a_d
    _own_drafts(s, s.k, s.a, &k_d, &a_d)
    return s.req.policy._expected_tokens(k_d) - 1.0 - a_d


cdef int observe_drafter(_Seq s, int k, int a, int tokens) except -1:
    """A round of ``s`` that verified ``k`` draft rows, accepted ``a`` and gave ``tokens``, to
    its request's acceptance and its policy.

    The policy judges the drafter: a grammar's forced tokens leading the draft are no
    drafts of it. Its positions' acceptance starts after them, and of the verify's time its
    rows' share (the drafter's and the pending token's, by rows) is its cost: counted in, a
    forced run of five made a draft of two look twice its cost, and drafting stopped where
    it paid."""
    cdef int k_d, a_d
    _own_drafts(s, k, a, &k_d, &a_d)
    cdef double t_v = s.t_v * (k_d + 1) / (k + 1)
    s.req.acc.observe(k_d, a_d)
    observed(s, k_d, a_d)
    s.req.policy.observe(k_d, a_d, t_v)
    s.req.policy.observe_round(s.pred_e, s.pred_t, tokens - (a - a_d), s.t_asked + t_v,
                               s.t_caught)
    return 0


cdef inline bint _measures(_Seq s) noexcept:
    """A round in which ``s`` verifies what it asked for, as the budget leaves it: its
    policy explores or probes, or its request probes on its own. Such a round measures."""
    return s.probe or s.req.policy.exploring or s.req.policy.probing


cdef inline bint _cost_line(BatchCost batch_cost, int n_in, double * a, double * b) noexcept:
    """The verify batch's cost line ``T(R) = a + b R`` (``BatchCost``), when the budget
    applies: several sequences in the round, batches measured."""
    if n_in < 2 or batch_cost.n <= 0.0:
        return False
    batch_cost._line(a, b)
    return b[0] > 0.0


cdef double row_floor(BatchCost batch_cost, int n_in) noexcept:
    """The probability with which a verify row's draft (and the drafts before it) must be
    kept for the row to pay in a round of ``n_in`` sequences: the budget's test for one row
    (``_batch_budget.allocate``) against a round of plain rows, ``P T(n) > (1 + MARGIN) b n``
    on the batch's cost line ``T(R) = a + b R``; 0 where no line applies (one sequence, or
    no batch measured), at most ``ROW_FLOOR_MAX``."""
    cdef double a, b
    if not ROW_FLOOR or not _cost_line(batch_cost, n_in, &a, &b):
        return 0.0
    return min(ROW_FLOOR_MAX, (1.0 + MARGIN) * b * n_in / (a + b * n_in))


def row_floor_of(BatchCost batch_cost not None, int n_in) -> float:
    """``row_floor`` from Python."""
    return row_floor(batch_cost, n_in)


cdef int draft_caps(BatchCost batch_cost, list seqs) except -1:
    """The caps ``k_cap`` of ``seqs`` (their limits applied) cut by the budget, and the
    confidence floor ``p_stop`` of each that drafts: its policy's (what one more draft step
    is worth) and, under the adaptive policy in a batch, a row's price (``row_floor``)."""
    cdef _Seq s
    cdef double p_row = row_floor(batch_cost, len(seqs))
    _budget(batch_cost, seqs, False, 0.0)
    for s in seqs:
        # a batch's measured length (``_batch_length``) is its rate's at that cap: no
        # confidence floor of a policy that did not choose it
        s.p_stop = s.req.policy.p_stop() if s.k_cap > 0 and not s.batch_len else 0.0
        # (a round its policy explores or probes in verifies what it asked for, as the
        # budget leaves it: it measures)
        if s.k_cap > 0 and not s.batch_len and s.req.policy.adaptive and not _measures(s):
            s.p_stop = max(s.p_stop, p_row)
    return 0


cdef int draft_lengths(BatchCost batch_cost, list seqs, double t_drafted) except -1:
    """After drafting (``t_drafted``: its time): the drafts ``k`` each of ``seqs`` verifies,
    its draft cut to them, and its policy's prediction for the round."""
    cdef _Seq s
    for s in seqs:
        # a cap cut by the limits is not a sample of td(k_want); catching up after rounds
        # without drafts is not a cost of drafting this round (it would stop the drafts
        # for good: the longer the pause, the dearer the next draft would look)
        if s.k_cap == s.k_want:
            s.req.policy.observe_draft_time(s.k_cap, s.t_asked)
        if s.batch_len or s.probe:    # the batch's measured length, a request's own probe:
            s.k = s.draft.tokens.size()     # all of it is verified
            continue
        # (a round whose cap was 0 drafted forced tokens only: to its policy, a plain round)
        # forced tokens are certain: never cut; the policy weighs the drafter's tokens after
        # them, by their own positions' acceptance (``observe_drafter``)
        s.k = s.n_forced + s.req.policy.choose(
            <int>s.draft.tokens.size() - s.n_forced if s.k_cap > 0 else 0, s.t_asked)
    _budget(batch_cost, seqs, True, t_drafted)
    for s in seqs:
        s.pred_e = s.req.policy.predicted_tokens
        # no drafter asked, the batch's length or a request's own probe (no prediction of the
        # policy): no sample
        s.pred_t = (s.req.policy.predicted_time if s.k_cap > 0 and not s.batch_len
                    and not s.probe else 0.0)
        if s.k < <int>s.draft.tokens.size():
            s.draft.tokens.resize(s.k)
            if s.k == 0:
                s.kind = NO_DRAFT
        s.n_pad = 0
    return 0


cdef int _budget(BatchCost batch_cost, list seqs, bint drafted, double t_drafted) except -1:
    """The batch's budget for the sequences under the adaptive policy.

    Before drafting (``drafted`` False): their caps, cut to the rows that would pay for the
    whole batch, each row's draft time counted (each sequence's part of its drafter's calls,
    per token); under load, none. After drafting: the verify rows, given to the drafts that
    pay by each request's own acceptance, up to what its drafter proposed; the drafting time
    ``t_drafted`` is spent: it counts in the round's time, not as a cost of a row."""
    cdef double a, b, tokens, time
    cdef int j, k, f
    if not _cost_line(batch_cost, len(seqs), &a, &b):
        return 0
    cdef _Seq s
    cdef list free = []
    cdef vector[int] k_max, k_out
    cdef vector[double] cost
    tokens = len(seqs)
    time = (t_drafted if drafted else 0.0) + a + b * len(seqs)
    for s in seqs:
        k = <int>s.draft.tokens.size() if drafted else s.k_cap     # the most it may verify
        if k <= 0:
            continue
        if s.batch_len:     # its rows are the batch's measured length's (``_batch_length``)
            tokens += s.req.acc.gain(k)
            time += b * k
            continue
        # a grammar's forced tokens lead the draft: rows spent, each a token for sure; the
        # drafter's rows after them are weighed by its own positions' acceptance
        f = min(s.n_forced, k) if drafted else 0
        tokens += f
        time += b * f
        k -= f
        if s.req.policy.adaptive and not _measures(s):
            if k <= 0:
                continue
            free.append(s)
            k_max.push_back(k)
            cost.push_back(b if drafted else b + s.req.policy._draft_time(k) / k)
        elif drafted:   # a fixed length, an exploration: its rows are spent anyway
            tokens += s.req.acc.gain(s.k - f)
            time += b * (s.k - f)
        else:
            tokens += s.req.acc.gain(k)
            time += b * k + s.req.policy._draft_time(k)
    k_out = _allocate(free, k_max, cost, tokens, time)
    for j in range(len(free)):
        s = <_Seq> free[j]
        if not drafted:
            s.k_cap = k_out[j]
        elif s.n_forced + k_out[j] != s.k:
            s.k = s.n_forced + k_out[j]      # forced tokens are never cut
            s.req.policy._predict(k_out[j], s.t_asked)
    return 0


cdef vector[int] _allocate(list free, vector[int] & k_max, vector[double] & cost, double tokens,
                           double time):
    """``_batch_budget.allocate`` for the sequences ``free`` (their own acceptance gives each
    row's worth): the drafts each gets."""
    cdef int m = len(free), stride = 1, j, i
    cdef vector[int] k_out
    cdef vector[double] gain
    cdef _Seq s
    k_out.assign(m, 0)
    if m == 0:
        return k_out
    for j in range(m):
        stride = max(stride, k_max[j] + 1)
    gain.assign(<size_t>m * stride, 0.0)
    for j in range(m):
        s = <_Seq> free[j]
        for i in range(1, k_max[j] + 1):
            gain[j * stride + i] = s.req.acc.gain(i)
    allocate(m, k_max.data(), gain.data(), stride, cost.data(), tokens, time, MARGIN, k_out.data())
    return k_out
