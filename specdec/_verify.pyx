# cython: language_level=3
# distutils: language = c++
"""Verification: which of a draft's tokens the target keeps, and the token after them.

Glossary (after vLLM's ``rejection_sampler.py``):

- *draft tokens* ``d1..dk``: proposed by a drafter for the positions after the pending
  token ``last``; the verify batch holds ``last, d1..dk`` for one sequence from batch
  row ``row0``.
- *target logits / p*: the target's logits at row ``row0 + i`` give ``p``, its
  distribution for the token after ``d_i`` (``d_0 = last``), after the request's
  top-k / top-p / min-p / temperature.
- *draft probabilities / q*: the drafter's distribution for ``d_i`` (sparse, per
  position); a drafter without one counts as certain (``q(d_i) = 1``, one-hot).
- *accepted*: ``a``, the length of the kept prefix ``d1..da``.
- *recovered token*: after a rejection at position ``a``, a token drawn from
  ``norm(max(0, p - q))``, which keeps the output distribution exactly ``p``.
- *bonus token*: when all ``k`` drafts are accepted, the token drawn from ``p`` at
  row ``row0 + k``.

Greedy verification keeps drafts while each equals the argmax of its row (``y`` is the
first argmax that differs, or the bonus argmax). Sampled verification accepts ``d_i``
with probability ``min(1, p(d_i) / q(d_i))`` (Leviathan et al. 2023, Chen et al.
2023), so speculative output is distributed exactly as plain sampling.

With the lazy LM head a row's logits are computed when verification reaches it
(``ready``): a rejected draft does not pay for the rows after it. The greedy sequences of a
decode that hold a grammar, greedy and sampled, are verified together (``lockstep``): a row's
mask comes first, and the rows that need the whole head share its passes.

Penalties and ``logit_bias`` (``pen``, set by the controller per sequence) transform row
``row0 + i`` with the history up to it, the output plus ``d1..di``, before argmax or the
distribution is taken, and are undone right after (see ``_penalty.pyx``).
"""
from libc.stdint cimport int32_t, uint32_t

from ._core cimport Context
from ._llama cimport sd_mask_count
from ._sampling cimport SamplingParams, Rng, Distribution, argmax
from ._penalty cimport Penalty
from ._timing cimport Clock, lap, T_HEAD, T_VERIFY
from ._grammar cimport GrammarState
from .drafters._base cimport Draft
from ._seq cimport _Seq


# a grammar's row with at most n_vocab / SPARSE_HEAD allowed tokens gets only their logits
# (a dot product each, against a pass over the whole head: with gemma's 262k vocabulary
# up to 16k tokens, about 1/16 of a pass's reads); 0: off, a grammar's rows are computed
# whole and masked after (``_checks.sparse_head``: the tests' and benchmarks' comparison)
cdef int SPARSE_HEAD = 16
# the sequences of a decode under a grammar are verified together (``Verifier.lockstep``);
# off: one after the other (``_checks.lockstep``: the tests' and benchmarks' comparison)
cdef bint LOCKSTEP = True


cdef bint sparse_rows(list seqs) except -1:
    """Whether a decode of ``seqs`` holds rows a grammar masks that the lazy head would
    serve as their allowed tokens' logits (``Context.set_lazy_head(grammar=True)``)."""
    cdef _Seq s
    if SPARSE_HEAD <= 0:
        return False
    for s in seqs:
        if s.req.grammar is not None:
            return True
    return False


cdef bint set_lockstep(bint on) noexcept:
    """Set ``LOCKSTEP``; returns the value it had."""
    global LOCKSTEP
    cdef bint old = LOCKSTEP
    LOCKSTEP = on
    return old


cdef int set_sparse_head(int n) noexcept:
    """Set ``SPARSE_HEAD``; returns the value it had."""
    global SPARSE_HEAD
    cdef int old = SPARSE_HEAD
    SPARSE_HEAD = n
    return old


cdef class Verifier:
    """Verifier(ctx)
--

    Verification of one sequence's rows of the last target decode (see the module
    docstring). The controller sets ``clock`` to its own so head passes are timed."""

    def __init__(self, Context ctx not None):
        self.ctx = ctx
        self.n_vocab = ctx.model.n_vocab
        self.dist = Distribution()
        self.clock = NULL

    cdef float * row_logits(self, int row) except NULL:
        """The logits of batch ``row`` as verification sees them: masked by the sequence's
        grammar (in place; its state is the one after the tokens before the row).

        Under a grammar the mask comes first. With the lazy LM head, a row that allows at
        most ``n_vocab / SPARSE_HEAD`` tokens (a JSON key, punctuation, digits, an enum's
        tail) gets only their logits, one dot product each (``Context.masked_logits_c``);
        another gets the whole row, computed with the rest of the verification's rows
        (``_ready_rows``), then masked. Either way the allowed tokens' logits are the same
        bits, the others -inf."""
        cdef float * lg = NULL
        cdef const uint32_t * w
        if self.grammar is not None:
            w = self.grammar.bits_c()
            if SPARSE_HEAD > 0 and not self.ctx.logits_ready_c(row):
                if self.clock != NULL:
                    lap(self.clock, T_VERIFY)
                if sd_mask_count(w, self.n_vocab) * SPARSE_HEAD <= self.n_vocab:
                    lg = self.ctx.masked_logits_c(row, w)
                else:
                    self._ready_rows(row)
                if self.clock != NULL:
                    lap(self.clock, T_HEAD)
            if lg == NULL:
                lg = self.ctx.logits_c(row)
                if lg != NULL:
                    self.grammar.apply_c(lg)
        else:
            lg = self.ctx.logits_c(row)
        if lg == NULL:
            raise RuntimeError(f"no logits at batch row {row}")
        return lg

    cdef void _ready_rows(self, int row) noexcept nogil:
        """Under a grammar, the whole logits of ``row`` (not computed yet), with the rows after
        it up to the verification's last (``v_end``) as ``ready`` takes them: two rows in the
        first pass, the rest in a second (a row of those that allows few tokens is then
        computed whole: text such as a copied string runs over several rows)."""
        cdef int end = max(self.v_end, row + 1)
        cdef int c = min(2, end - row) if self.v_passes == 0 else end - row
        self.v_passes += 1
        self.ctx.prepare_logits_c(row, c)

    cdef int32_t sample(self, int row, bint greedy, const SamplingParams & sp, Rng rng,
                        const int32_t * before=NULL, int n_before=0) except -1:
        """The target's token at ``row`` (argmax, or a draw from ``p``); ``before``: the
        draft tokens between the output and this row (for penalties). The grammar, if any,
        goes on with it."""
        cdef float * lg = self.row_logits(row)
        cdef int32_t y
        if self.pen is not None:
            self.pen.apply(lg, before, n_before)
        try:
            if greedy:
                y = argmax(lg, self.n_vocab)
                self._on_argmax(row, y)
            else:
                self.dist.from_logits(lg, self.n_vocab, sp)
                y = self.dist.sample(rng)
        finally:
            if self.pen is not None:
                self.pen.restore(lg)
        if self.grammar is not None:
            self.grammar.advance_c(y)
        return y

    cdef int greedy(self, int row0, Draft draft, int k, int32_t * y) except -1:
        """Accept while ``d_i`` equals the argmax of row ``row0 + i - 1``; returns ``a``. (The
        controller verifies a sequence under a grammar with ``lockstep``, unless ``LOCKSTEP``
        is off: then its rows are computed as their masks allow, ``row_logits``.)"""
        cdef SamplingParams sp
        return self._one_by_one(row0, draft, k, True, sp, None, y)

    cdef int rejection(self, int row0, Draft draft, int k, const SamplingParams & sp, Rng rng,
                       int32_t * y) except -1:
        """Rejection sampling; returns ``a`` and sets ``y`` (recovered or bonus token)."""
        return self._one_by_one(row0, draft, k, False, sp, rng, y)

    cdef int _one_by_one(self, int row0, Draft draft, int k, bint greedy,
                         const SamplingParams & sp, Rng rng, int32_t * y) except -1:
        """One sequence's verification, row by row (``_row``), its rows computed as ``ready``
        takes them (under a grammar: as their masks allow, ``row_logits``); returns ``a``."""
        cdef int a = 0, n_ready = 0
        cdef bint grammar = self.grammar is not None and SPARSE_HEAD > 0
        self.v_end, self.v_passes = row0 + k + 1, 0
        try:
            while True:
                if not grammar:
                    n_ready = self.ready(row0, a, k, n_ready)
                if not self._row(row0, draft, k, a, greedy, sp, rng, y):
                    return a
                a += 1
        finally:
            self.v_end = 0

    cdef bint _row(self, int row0, Draft draft, int k, int a, bint greedy,
                   const SamplingParams & sp, Rng rng, int32_t * y) except -1:
        """Verify row ``row0 + a`` (``d1..da`` kept): True when ``d_{a+1}`` is kept too, else
        False with ``y`` the token after ``d_a``; the grammar, if any, goes on with the token
        kept. Greedy: the argmax, kept while it equals the draft. Sampled: ``d_{a+1}`` accepted
        with probability ``min(1, p / q)``, else ``y`` drawn from the residual; after ``k``
        kept, the bonus drawn from ``p``. A sequence's draws come from its own ``rng`` in row
        order, so its output is the same whichever sequences are verified beside it."""
        cdef int32_t x
        cdef float px, qx, one = 1.0
        if greedy or a == k:
            y[0] = self.sample(row0 + a, greedy, sp, rng, draft.tokens.data(), a)
            return a < k and draft.tokens[a] == y[0]
        self._distribution(row0 + a, sp, draft.tokens.data(), a)
        x = draft.tokens[a]
        px = self.dist.prob_of(x)
        if self.grammar is not None:
            qx = self._mask_q(draft, a)
        else:
            qx = self._q(draft, a, x)
        if self._accepts(rng.uniform(), px, qx):
            if self.grammar is not None:
                self.grammar.advance_c(x)
            return True
        if self.grammar is not None:
            y[0] = self.dist.sample_residual(rng, self.q_ids.data(), self.q_probs.data(),
                                             self.q_ids.size())
            self.grammar.advance_c(y[0])
        elif draft.has_probs:
            y[0] = self.dist.sample_residual(
                rng, draft.q_ids.data() + draft.q_off[a], draft.q_probs.data() + draft.q_off[a],
                draft.q_off[a + 1] - draft.q_off[a])
        else:
            y[0] = self.dist.sample_residual(rng, &x, &one, 1)
        return False

    cdef int _distribution(self, int row, const SamplingParams & sp, const int32_t * before,
                           int n_before) except -1:
        """``dist`` := the target's distribution at ``row`` (masked by the grammar, penalised
        for its history)."""
        cdef float * lg = self.row_logits(row)
        if self.pen is None:
            return self.dist.from_logits(lg, self.n_vocab, sp)
        self.pen.apply(lg, before, n_before)
        try:
            return self.dist.from_logits(lg, self.n_vocab, sp)
        finally:
            self.pen.restore(lg)

    cdef inline int ready(self, int row0, int a, int k, int n_ready) noexcept nogil:
        """Have the logits of verify row ``a`` computed; returns how many rows are.

        With the lazy LM head (``Context(lazy_logits=True)``) the first pass computes
        two rows, which costs about one (a pass reads the whole head once; a second
        row rides along in cache), and a second pass the rest once both were accepted:
        an early rejection pays for one pass, a long run for two instead of k+1 rows.
        Without the lazy head this is a no-op.
        """
        if a < n_ready:
            return n_ready
        cdef int c = min(2, k + 1) if n_ready == 0 else k + 1 - n_ready
        if self.clock != NULL:
            lap(self.clock, T_VERIFY)
        self.ctx.prepare_logits_c(row0 + n_ready, c)
        if self.clock != NULL:
            lap(self.clock, T_HEAD)
        return n_ready + c

    cdef float _q(self, Draft draft, int pos, int32_t x) noexcept nogil:
        cdef int j
        if not draft.has_probs:
            return 1.0
        for j in range(draft.q_off[pos], draft.q_off[pos + 1]):
            if draft.q_ids[j] == x:
                return draft.q_probs[j]
        return 1.0

    cdef float _mask_q(self, Draft draft, int pos) except? -1:
        """The draft's distribution at ``pos`` under the grammar's last mask, renormalised
        (a draft cut at the grammar's first refusal is drawn from it), into ``q_ids`` /
        ``q_probs``; returns q of the drafted token (0: the grammar refuses it)."""
        cdef int j
        cdef int32_t x = draft.tokens[pos]
        cdef double z = 0.0
        self.q_ids.clear()
        self.q_probs.clear()
        if not draft.has_probs:
            if self.grammar.allowed_c(x):
                self.q_ids.push_back(x)
                self.q_probs.push_back(1.0)
                return 1.0
            return 0.0
        for j in range(draft.q_off[pos], draft.q_off[pos + 1]):
            if self.grammar.allowed_c(draft.q_ids[j]):
                self.q_ids.push_back(draft.q_ids[j])
                self.q_probs.push_back(draft.q_probs[j])
                z += draft.q_probs[j]
        cdef float qx = 0.0
        for j in range(<int>self.q_ids.size()):
            self.q_probs[j] = self.q_probs[j] / z
            if self.q_ids[j] == x:
                qx = self.q_probs[j]
        if qx == 0.0 and self.grammar.allowed_c(x):
            # a drafted token its sparse q does not list counts as certain (``_q``)
            self.q_ids.clear()
            self.q_probs.clear()
            self.q_ids.push_back(x)
            self.q_probs.push_back(1.0)
            return 1.0
        return qx

    cdef bint _accepts(self, double u, float px, float qx) noexcept:
        return u < px / qx

    cdef int _on_argmax(self, int row, int32_t y) except -1:
        return 0

    cdef int prefetch(self, list seqs) except -1:
        """With the lazy LM head, the rows the verification of every sequence of ``seqs`` (all
        in the last decode) will read, in two passes over the head for the whole batch
        instead of one or two per sequence: the first two rows of each, then the rest of
        the greedy ones whose first two drafts the target agrees with (``ready`` would ask
        for them next)."""
        cdef _Seq s
        cdef int i, n_vocab = self.n_vocab
        cdef vector[int] rows
        if not self.ctx._lazy:
            return 0
        for s in seqs:
            if s.req.grammar is not None and SPARSE_HEAD > 0:
                continue      # their rows wait for their masks (``lockstep``, ``row_logits``)
            for i in range(min(2, s.k + 1)):
                rows.push_back(s.row0 + i)
        self.ctx.prepare_logits_rows_c(rows)
        rows.clear()
        for s in seqs:
            if (s.req.greedy and s.k >= 2 and (s.req.grammar is None or SPARSE_HEAD == 0)
                    and argmax(self.ctx.logits_c(s.row0), n_vocab) == s.draft.tokens[0]
                    and argmax(self.ctx.logits_c(s.row0 + 1), n_vocab) == s.draft.tokens[1]):
                for i in range(2, s.k + 1):
                    rows.push_back(s.row0 + i)
        self.ctx.prepare_logits_rows_c(rows)
        return 0

    cdef int lockstep(self, list seqs) except -1:
        """Verification of the sequences of ``seqs`` (all in the last decode) that hold a
        grammar, greedy and sampled, in lockstep; each gets ``a`` and ``y`` (``verified``).

        One by one, each sequence's rows would take passes over the head of their own: at
        concurrency 4 a plain step made four, and a speculative round up to eight, each
        reading the whole weight for a row or two. In lockstep every sequence still verifying
        classes its next row by its mask (``bits_c``, kept for the read): a row that allows
        few tokens gets their logits at once (``masked_logits_c``), another joins the step's
        one pass over the head, with the rows after it as ``ready`` takes them (two rows at a
        sequence's first pass, the rest of its draft at the next) as long as they need the
        whole head too (``GrammarState.whole_ahead``: their masks, the drafts taken on);
        then each verifies that row (``_row``: the masked argmax, or a rejection-sampling
        step drawn from its own ``rng``) and goes on while the draft is kept. A rejection
        ends a sequence's rows, and the passes of a round are the most any sequence needs,
        not their sum. The rows are the same bits however they are grouped, and each
        sequence takes its draws in the same order, so the tokens are what ``greedy`` and
        ``rejection`` give."""
        cdef _Seq s
        cdef list todo = []
        cdef int j, i, n, row, end, c, live
        cdef int32_t y
        cdef const uint32_t * w
        cdef vector[int] rows, a, asked
        for s in seqs:
            s.verified = False
            if LOCKSTEP and s.req.grammar is not None:
                todo.append(s)
        n = live = len(todo)
        if n == 0:
            return 0
        a.assign(n, 0)
        asked.assign(n, 0)
        while live > 0:
            rows.clear()
            for j in range(n):
                s = <_Seq> todo[j]
                if s.verified:
                    continue
                row = s.row0 + a[j]
                if self.ctx.logits_ready_c(row):
                    continue
                w = s.req.grammar.bits_c()
                if SPARSE_HEAD > 0 and sd_mask_count(w, self.n_vocab) * SPARSE_HEAD <= self.n_vocab:
                    self._lap(T_VERIFY)
                    self.ctx.masked_logits_c(row, w)
                    self._lap(T_HEAD)
                    continue
                end = s.row0 + s.k + 1
                c = min(2, end - row) if asked[j] == 0 else end - row
                asked[j] += 1
                # the rows after it that ride along are those that need the whole head too
                # (one that allows few would get them alone, cheaper)
                c = 1 + s.req.grammar.whole_ahead(s.draft.tokens.data() + a[j], c - 1,
                                                  SPARSE_HEAD)
                for i in range(c):
                    rows.push_back(row + i)
            if rows.size():
                self._lap(T_VERIFY)
                self.ctx.prepare_logits_rows_c(rows)
                self._lap(T_HEAD)
            for j in range(n):
                s = <_Seq> todo[j]
                if s.verified:
                    continue
                self.pen = s.req.pen
                self.grammar = s.req.grammar
                if self._row(s.row0, s.draft, s.k, a[j], s.req.greedy, s.req.sp, s.req.rng, &y):
                    a[j] += 1
                    continue
                s.a = a[j]
                s.y = y
                s.verified = True
                live -= 1
        return 0

    cdef void _lap(self, int part) noexcept nogil:
        if self.clock != NULL:
            lap(self.clock, part)
