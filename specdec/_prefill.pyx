# cython: language_level=3
# distutils: language = c++
"""A request's prompt into the target: the join's start, the chunks, the first token.

Apart from the round (``_controller.pyx``) because a prompt goes in on a path of its own,
between rounds: ``start`` sets a joined sequence up (its prompt, the part of it that prefix
reuse kept, its drafters begun on it); ``chunks`` decodes the next chunks of several
prompts in one batch (chunked prefill: prompt tails that arrive together cost one decode, a
decode's fixed cost being that of several rows); after a prompt's last chunk ``prompt_in``
samples its first token. Rounds leave a sequence out while its prompt goes in
(``_Seq.prefilling``). The controller owns the slot: where these raise, it leaves it.
"""
from libc.stdint cimport int32_t
from libcpp.vector cimport vector

from ._core cimport Context, Batch
from ._timing cimport Clock, now
from ._verify cimport Verifier, sparse_rows
from ._seq cimport _Seq, _SeqCounters, emit
from ._rollback cimport Rollback
from ._prefix_reuse cimport PrefixReuse
from .drafters._base cimport Drafter


cdef class Prefill:
    """Prefill(ctx, batch, exact, rollback, prefix, totals)
--

    The prompt path of one controller, with the parts of it that it uses (its verifier, which
    a test driver may replace, comes with each call)."""

    def __init__(self, Context ctx not None, Batch batch not None, bint exact,
                 Rollback rollback not None, PrefixReuse prefix not None,
                 _SeqCounters totals not None):
        self.ctx = ctx
        self.batch = batch
        self.exact = exact
        self.rollback = rollback
        self.prefix = prefix
        self.totals = totals

    cdef int start(self, _Seq s, const vector[int32_t] & toks, int c, double t0) except -1:
        """``s`` joined with prompt ``toks``, of which its slot keeps the first ``c`` (prefix
        reuse, since ``t0``): its prompt is to go in, its drafters begin on it."""
        cdef int n = toks.size()
        s.active = True
        s.prefilling = True
        s.mem.prompt = toks
        s.mem.n_filled = c
        s.cnt.n_prompt = n
        s.cnt.n_decoded = n - c
        self.totals.n_prompt += n
        self.totals.n_decoded += n - c
        cdef Drafter dr
        for dr in s.req.drafters:
            dr.begin_c(s.id, toks.data(), n)
            if c > 0:
                dr.observe_c(s.id, toks.data(), c, -1)
        s.cnt.t_prompt = now() - t0
        self.totals.t_prompt += s.cnt.t_prompt
        return 0

    cdef int chunks(self, list ss, int budget, Verifier verifier) except -1:
        """Decode the next chunks of the prompts of ``ss`` in one batch (in order, together at
        most ``n_batch`` tokens or ``budget``); after a prompt's last chunk, sample its first
        token with ``verifier``. The prompt time is shared by rows."""
        cdef double t0 = now()
        cdef _Seq s
        cdef int n, i0, i, m, row, total = 0, cap = self.ctx.n_batch
        cdef bint grammar = False, pad = False
        cdef vector[int] m_of, row_of
        if budget > 0:
            cap = min(cap, budget)
        self.batch.clear_c()
        for s in ss:
            n = s.mem.prompt.size()
            i0 = s.mem.n_filled
            m = min(cap - total, n - i0)
            if self.exact and n - i0 - m == 1 and m > 2:
                m -= 1      # no 1-token chunk at the end
            if m <= 0:
                break
            m_of.push_back(m)
            row_of.push_back(self.batch.b.n_tokens)
            for i in range(m):
                self.batch.add_c(s.mem.prompt[i0 + i], i0 + i, s.id, i0 + i == n - 1)
            # the last chunk's output row is the first a grammar masks
            grammar = grammar or (i0 + m == n and sparse_rows([s]))
            total += m
        # a one-token chunk (a one-token prompt) alone: decode it with a throw-away second
        # row, where the memory can drop it; a target rolled back by checkpoints cannot, and
        # decodes it alone (as every exact-mode run of that prompt does)
        cdef _Seq s0 = <_Seq> ss[0]
        if self.exact and total == 1 and self.rollback.drops_rows():
            pad = True
            self.batch.add_c(s0.mem.prompt[s0.mem.n_filled], s0.mem.n_filled + 1, s0.id, False)
        self.ctx.decode_c(self.batch, grammar)
        if pad:
            if not self.ctx.seq_rm_c(s0.id, s0.mem.n_filled + 1, -1):
                raise RuntimeError("could not drop the padding row")
        cdef Drafter d
        cdef int j
        for j in range(<int>m_of.size()):
            s = <_Seq> ss[j]
            m, row = m_of[j], row_of[j]
            for d in s.req.drafters:
                d.observe_c(s.id, s.mem.prompt.data() + s.mem.n_filled, m, row)
            s.mem.n_filled += m
            if s.mem.n_filled == <int>s.mem.prompt.size():
                self.prompt_in(s, row + m - 1, verifier)
        t0 = (now() - t0) / max(total, 1)
        for j in range(<int>m_of.size()):
            s = <_Seq> ss[j]
            s.cnt.t_prompt += t0 * m_of[j]
            self.totals.t_prompt += t0 * m_of[j]
        return 0

    cdef int prompt_in(self, _Seq s, int row, Verifier verifier) except -1:
        """``s``'s prompt is all in (its last token at batch ``row``): its first token."""
        s.mem.tokens.assign(s.mem.prompt.begin(), s.mem.prompt.end())
        s.mem.n_past = s.mem.prompt.size()
        s.mem.prompt.clear()
        s.prefilling = False
        self.prefix.save_window(s)
        verifier.pen = s.req.pen
        verifier.grammar = s.req.grammar
        # prompt time, not the rounds': the verifier's laps of the round's clock (under a
        # grammar) would count the time since the last round as verification
        cdef Clock * clock = verifier.clock
        verifier.clock = NULL
        try:
            s.last = verifier.sample(row, s.req.greedy, s.req.sp, s.req.rng)
        finally:
            verifier.clock = clock
        emit(s, self.ctx, s.last, row)
        return 0
