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
from .drafters._base cimport Draft


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

    cdef int32_t sample(self, int row, bint greedy, const SamplingParams & sp, Rng rng,
                        const int32_t * before=NULL, int n_before=0) except -1:
        """The target's token at ``row`` (argmax, or a draw from ``p``); ``before``: the
        draft tokens between the output and this row (for penalties)."""
        cdef float * lg = self.ctx.logits_c(row)
        if lg == NULL:
            raise RuntimeError(f"no logits at batch row {row}")
        cdef int32_t y
        if self.pen is not None:
            self.pen.apply(lg, before, n_before)
        try:
            if greedy:
                y = argmax(lg, self.n_vocab)
                self._on_argmax(row, y)
                return y
            self.dist.from_logits(lg, self.n_vocab, sp)
            return self.dist.sample(rng)
        finally:
            if self.pen is not None:
                self.pen.restore(lg)

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
            qx = self._q(draft, a, x)
            if self._accepts(rng.uniform(), px, qx):
                a += 1
                continue
            if draft.has_probs:
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
        """``dist`` := the target's distribution at ``row`` (penalised for its history)."""
        cdef float * lg = self.ctx.logits_c(row)
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

    cdef bint _accepts(self, double u, float px, float qx) noexcept:
        return u < px / qx

    cdef int _on_argmax(self, int row, int32_t y) except -1:
        return 0
