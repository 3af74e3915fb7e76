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
(``ready``): a rejected draft does not pay for the rows after it.

Penalties and ``logit_bias`` (``pen``, set by the controller per sequence) transform row
``row0 + i`` with the history up to it, the output plus ``d1..di``, before argmax or the
distribution is taken, and are undone right after (see ``_penalty.pyx``).
"""
from libc.stdint cimport int32_t

from ._core cimport Context
from ._sampling cimport SamplingParams, Rng, Distribution, argmax
from ._penalty cimport Penalty
from ._timing cimport Clock, lap, T_HEAD, T_VERIFY
from ._grammar cimport GrammarState
from .drafters._base cimport Draft
from ._seq cimport _Seq


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
        grammar (in place; its state is the one after the tokens before the row)."""
        cdef float * lg = self.ctx.logits_c(row)
        if lg == NULL:
            raise RuntimeError(f"no logits at batch row {row}")
        if self.grammar is not None:
            self.grammar.mask_c(lg)
        return lg

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
        """Accept while ``d_i`` equals the argmax of row ``row0 + i - 1``; returns ``a``."""
        cdef int a = 0, n_ready = 0
        cdef SamplingParams sp
        while True:
            n_ready = self.ready(row0, a, k, n_ready)
            y[0] = self.sample(row0 + a, True, sp, None, draft.tokens.data(), a)
            if a < k and draft.tokens[a] == y[0]:
                a += 1
                continue
            return a

    cdef int rejection(self, int row0, Draft draft, int k, const SamplingParams & sp, Rng rng,
                       int32_t * y) except -1:
        """Rejection sampling; returns ``a`` and sets ``y`` (recovered or bonus token)."""
        cdef int a = 0, n_ready = 0
        cdef int32_t x
        cdef float px, qx, one = 1.0
        while a < k:
            n_ready = self.ready(row0, a, k, n_ready)
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
                a += 1
                continue
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
            return a
        self.ready(row0, k, k, n_ready)
        y[0] = self.sample(row0 + k, False, sp, rng, draft.tokens.data(), k)
        return a

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
            for i in range(min(2, s.k + 1)):
                rows.push_back(s.row0 + i)
        self.ctx.prepare_logits_rows_c(rows)
        rows.clear()
        for s in seqs:
            if (s.req.greedy and s.k >= 2
                    and argmax(self.ctx.logits_c(s.row0), n_vocab) == s.draft.tokens[0]
                    and argmax(self.ctx.logits_c(s.row0 + 1), n_vocab) == s.draft.tokens[1]):
                for i in range(2, s.k + 1):
                    rows.push_back(s.row0 + i)
        self.ctx.prepare_logits_rows_c(rows)
        return 0
