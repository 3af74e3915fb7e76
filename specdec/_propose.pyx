# cython: language_level=3
# distutils: language = c++
"""The round's drafting: every sequence that asks for a draft (``k_cap > 0``) gets one from
its drafters, each drafter called once with all the sequences it is asked by
(``Drafter.propose_batch_c``), so a drafter with a model decodes them together.

A sequence whose drafter gave less than ``n_min`` tokens asks its next drafter, again all
such sequences together. Each sequence is charged an equal part of its calls' time, their
catch-up left out (``t_asked``; its part of the catch-up in ``t_caught``, and of that, in
``t_caught_out``, the part that was rows its drafters sat out, not its prompt: see
``sat_out_part``). Under ``isolate`` a failed draft ends its sequence
(``FAILED``, the error kept in ``errors``), the others go on; else it is raised. A grammar's
forced tokens then lead the draft, which ends before the first token the grammar refuses;
they cost no drafting and are accepted, so a sequence takes them whatever its cap
(``k_room``), in rounds its policy or the batch's floor holds plain too.

A drafter that reads only its history (``drafts_past_forced``: the n-gram family and the
suffix drafter, without Python overrides) drafts past the forced run: while it proposes, its
history holds the pending token and the forced tokens but the last, lent for the call
(``Drafter.lend_hist``; one that indexes its history, ngram-map and ngram-cache, indexes
only what was observed), and it is given the last as the pending one, so its lookup ends in
them (in JSON, after a forced ``", "name": "`` it copies the value from the prompt). Its
proposal follows the forced tokens: the policy's cap is its own tokens' (forced rows are
the grammar's, not its drafts: counted against the cap, a forced ``", "email": "`` left an
adaptive cap of 7 two tokens of the value, and suffix drafting at 4 slots ran at 1.25x
where a fixed 16 ran at 1.67x), within the sequence's room ``k_room`` for both. The
grammar cuts it at its first refusal, and its ``accept`` counts its own tokens. Other
drafters are asked from the pending token, and a proposal that does not begin with the
forced tokens is replaced by them.
"""
from ._timing cimport now
from ._output cimport RUNNING, FAILED
from libc.stdint cimport int32_t
from libcpp.vector cimport vector
from ._seq cimport _Seq, NO_DRAFT, DRAFTED, FORCED
from .drafters._base cimport Drafter


cdef inline void rows_behind(int n_past, int n_asked_at, int n_prompt, long * sat,
                             long * prompt) noexcept:
    """The rows a sequence's drafter may have to catch up on when asked now: those it sat out
    (``sat``: the rounds since it was last asked, held plain) and its prompt (``prompt``: only
    at its first ask in the request, ``n_asked_at`` -1)."""
    if n_asked_at < 0:
        prompt[0] = n_prompt
        sat[0] = max(0, n_past - n_prompt)
    else:
        prompt[0] = 0
        sat[0] = max(0, n_past - n_asked_at)


cdef inline double sat_out_part(double t_sync, long sat, long prompt) noexcept:
    """Of a drafter call's catch-up ``t_sync`` over ``sat`` rows sat out and ``prompt`` prompt
    rows, the rows sat out's part (by rows: a catch-up decodes them in one batch).

    The batch's measured length (``_batch_length``) leaves the rows sat out out of a round's
    time: they are a cost of the rounds before, held plain, not of this round's cap. A
    prompt's catch-up is no such cost: every request that drafts pays it once, and plain
    decoding never does (about 5% of a 48-token request at 4 slots); it is left out of the
    round and spread over the rounds of drafting caps instead (left out and not charged,
    drafting looked that much cheaper than it runs; charged to its round, that round's cap
    lost)."""
    if sat + prompt <= 0:
        return t_sync
    return t_sync * sat / <double>(sat + prompt)


def sat_out_share(double t_sync, rows) -> float:
    """``sat_out_part`` from Python, for the sequences of one drafter call: ``rows`` holds each
    one's ``(n_past, n_asked_at, n_prompt)``; returns the part of ``t_sync`` left out."""
    cdef long sat = 0, prompt = 0, s1, p1
    for n_past, n_asked_at, n_prompt in rows:
        rows_behind(n_past, n_asked_at, n_prompt, &s1, &p1)
        sat += s1
        prompt += p1
    return sat_out_part(t_sync, sat, prompt)


cdef inline int lead_of(_Seq s, Drafter d) except -1:
    """How many forced tokens ``d`` is given as context for ``s`` (0: asked from ``last``):
    all of them, where the grammar forces some, the drafter reads only its history and the
    sequence's room (``k_room``) leaves some past them."""
    if s.req.grammar is None or not d.drafts_past_forced or d._py_propose \
            or d._py_propose_batch or s.req.out.finish != RUNNING:
        return 0
    cdef int n_f = s.req.grammar.forced_c().size()
    return n_f if 0 < n_f < s.k_room else 0


cdef inline int own_cap(_Seq s) noexcept:
    """The most tokens ``s``'s drafter may give: its cap, and past a forced run of ``n_lead``
    (not drafts of it) the sequence's room left after them too."""
    return s.k_cap if s.n_lead == 0 else min(s.k_cap, s.k_room - s.n_lead)


cdef int propose(Asks asks, list seqs, bint isolate, dict errors) except -1:
    """Draft for ``seqs`` (see the module docstring); ``asks``: the controller's, reused."""
    cdef _Seq s
    cdef Drafter d
    cdef int j, n, n_l, level = 0
    cdef const vector[int32_t] * forced
    cdef long sat, prompt, s1, p1
    cdef double t0, share, out
    cdef list pending = [], group
    cdef dict groups
    for s in seqs:
        s.draft.clear()
        s.kind = NO_DRAFT
        s.n_forced = 0
        s.n_lead = 0
        s.t_asked = 0.0
        s.t_caught = 0.0
        s.t_caught_out = 0.0
        if s.k_cap > 0 and s.req.n_drafters > 0:
            pending.append(s)
    while pending:
        groups = {}
        for s in pending:
            if level < s.req.n_drafters:
                groups.setdefault(id(s.req.drafters[level]), []).append(s)
        pending = []
        for group in groups.values():
            d = <Drafter> (<_Seq> group[0]).req.drafters[level]
            asks.clear()
            asks.isolate = isolate
            sat = prompt = 0
            t0 = now()
            try:
                for s in group:
                    n_l = s.n_lead = lead_of(s, d)
                    if n_l > 0:
                        # the drafter's history ends in the pending token and the forced
                        # run (its last token as the pending one); taken back after the call
                        forced = s.req.grammar.forced_c()
                        d.lend_hist(s.id, s.last, forced.data(), n_l - 1)
                        asks.add(s.id, forced[0][n_l - 1], own_cap(s), s.p_stop, s.draft)
                    else:
                        asks.add(s.id, s.last, s.k_cap, s.p_stop, s.draft)
                    rows_behind(s.mem.n_past, s.n_asked_at, s.cnt.n_prompt, &s1, &p1)
                    sat += s1
                    prompt += p1
                    s.n_asked_at = s.mem.n_past
                t0 = now()
                d.propose_batch_c(asks)
            finally:
                n = len(group)
                share = max(0.0, now() - t0 - asks.t_sync) / n
                out = sat_out_part(asks.t_sync, sat, prompt) / n
                asks.drafts = []
                for s in group:
                    if s.n_lead > 0:
                        d.take_back_hist(s.id)
            for j in range(n):
                s = <_Seq> group[j]
                s.t_asked += share
                s.t_caught += asks.t_sync / n
                s.t_caught_out += out
                if asks.errors[j] is not None:
                    # nothing of this round reached the target yet: the others go on
                    s.draft.clear()
                    s.req.out.set_finish(FAILED)
                    errors[s.id] = asks.errors[j]
                    continue
                if <int>s.draft.tokens.size() > own_cap(s):
                    s.draft.tokens.resize(own_cap(s))
                if <int>s.draft.tokens.size() >= (s.req.n_min if s.req.n_min > 0 else 1):
                    s.kind = DRAFTED
                    s.proposer = level
                    if s.n_lead > 0:
                        # the proposal follows the forced run: it leads the draft
                        forced = s.req.grammar.forced_c()
                        s.draft.tokens.insert(s.draft.tokens.begin(), forced.data(),
                                              forced.data() + s.n_lead)
                else:
                    s.draft.clear()
                    s.n_lead = 0
                    pending.append(s)
        level += 1
    for s in seqs:
        if s.req.grammar is not None and s.k_room > 0 and s.req.out.finish == RUNNING:
            # the grammar's forced tokens lead the draft, which ends before its first
            # token the grammar refuses (the grammar is after ``last``: verify row 0); they
            # are drafted up to ``k_room`` even where the policy's cap is 0
            s.n_forced = s.req.grammar.fit_draft_c(s.draft, s.k_room)
            if s.draft.tokens.size() == 0:
                s.kind = NO_DRAFT
            elif s.kind == NO_DRAFT or s.req.grammar.replaced:
                s.kind = FORCED
    return 0
