# cython: language_level=3
# distutils: language = c++
"""The round's drafting: every sequence that asks for a draft (``k_cap > 0``) gets one from
its drafters, each drafter called once with all the sequences it is asked by
(``Drafter.propose_batch_c``), so a drafter with a model decodes them together.

A sequence whose drafter gave less than ``n_min`` tokens asks its next drafter, again all
such sequences together. Each sequence is charged an equal part of its calls' time, their
catch-up left out (``t_asked``; its part of the catch-up in ``t_caught``). Under ``isolate`` a failed draft ends its sequence
(``FAILED``, the error kept in ``errors``), the others go on; else it is raised. A grammar's
forced tokens then lead the draft, which ends before the first token the grammar refuses;
they cost no drafting and are accepted, so a sequence takes them whatever its cap
(``k_room``), in rounds its policy or the batch's floor holds plain too.
"""
from ._timing cimport now
from ._output cimport RUNNING, FAILED
from ._seq cimport _Seq, NO_DRAFT, DRAFTED, FORCED
from .drafters._base cimport Drafter


cdef int propose(Asks asks, list seqs, bint isolate, dict errors) except -1:
    """Draft for ``seqs`` (see the module docstring); ``asks``: the controller's, reused."""
    cdef _Seq s
    cdef Drafter d
    cdef int j, n, level = 0
    cdef double t0, share
    cdef list pending = [], group
    cdef dict groups
    for s in seqs:
        s.draft.clear()
        s.kind = NO_DRAFT
        s.n_forced = 0
        s.t_asked = 0.0
        s.t_caught = 0.0
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
            for s in group:
                asks.add(s.id, s.last, s.k_cap, s.p_stop, s.draft)
            t0 = now()
            try:
                d.propose_batch_c(asks)
            finally:
                n = len(group)
                share = max(0.0, now() - t0 - asks.t_sync) / n
                asks.drafts = []
            for j in range(n):
                s = <_Seq> group[j]
                s.t_asked += share
                s.t_caught += asks.t_sync / n
                if asks.errors[j] is not None:
                    # nothing of this round reached the target yet: the others go on
                    s.draft.clear()
                    s.req.out.set_finish(FAILED)
                    errors[s.id] = asks.errors[j]
                    continue
                if <int>s.draft.tokens.size() > s.k_cap:
                    s.draft.tokens.resize(s.k_cap)
                if <int>s.draft.tokens.size() >= (s.req.n_min if s.req.n_min > 0 else 1):
                    s.kind = DRAFTED
                    s.proposer = level
                else:
                    s.draft.clear()
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
