# cython: language_level=3
# distutils: language = c++
"""Test and debugging hooks of the controller, apart from the production classes.

``CheckedController`` is a :class:`Controller` that can

- ``check``: re-check every greedy token against an independent argmax (numpy over
  the zero-copy logits view), raising ``AssertionError`` on a mismatch;
- ``unsafe_accept_all``: accept every sampled draft (a deliberately wrong rule, so
  the distribution tests can show they detect a broken one);
- ``record``: keep every verified draft (``draft_log``).

``DrivenPolicy`` is a :class:`DraftPolicy` whose round steps tests call from Python.

Only tests and ``Decoder(check=True)`` import this module.
"""
from libc.stdint cimport int32_t

import numpy as np

from ._controller cimport Controller, _Seq
from ._policy cimport DraftPolicy
from ._verify cimport Verifier


cdef class _CheckingVerifier(Verifier):
    cdef bint check, accept_all

    cdef bint _accepts(self, double u, float px, float qx) noexcept:
        return self.accept_all or u < px / qx

    cdef int _on_argmax(self, int row, int32_t y) except -1:
        if not self.check:
            return 0
        ref = int(np.argmax(self.ctx.logits(row)))
        if ref != y:
            raise AssertionError(f"emitted token {y} is not the argmax {ref} of its verify row")
        return 0


cdef class CheckedController(Controller):
    """CheckedController(ctx, drafters=(), *, check=False, unsafe_accept_all=False, record=False, **settings)
--

    A :class:`Controller` with the test hooks above."""
    cdef bint record
    cdef list _log

    def __init__(self, ctx, drafters=(), *, bint check=False, bint unsafe_accept_all=False,
                 bint record=False, **settings):
        super().__init__(ctx, drafters, **settings)
        cdef _CheckingVerifier v = _CheckingVerifier(ctx)
        v.check = check
        v.accept_all = unsafe_accept_all
        v.clock = &self.clock
        self.verifier = v
        self.record = record
        self._log = []

    cdef int _on_verified(self, _Seq s, int pos, int k, int a) except -1:
        if self.record:
            self._log.append((s.id, pos, [s.draft.tokens[i] for i in range(k)], a))
        return 0

    def start(self, prompts, max_tokens, seeds=None):
        self._log = []
        return super().start(prompts, max_tokens, seeds)

    @property
    def draft_log(self) -> list:
        """With ``record=True``: ``(seq, pos, drafts, n_accepted)`` for every verified draft
        since the last ``start``, in order (``pos``: position of the pending token the drafts
        follow)."""
        return list(self._log)


cdef class DrivenPolicy(DraftPolicy):
    """The policy's steps from Python, for tests that drive it by hand."""

    def _py_cap(self) -> int:
        return self.cap()

    def _py_choose(self, int proposed, double t_drafted) -> int:
        return self.choose(proposed, t_drafted)

    def _py_observe(self, int k, int a, double t_verify, double t_drafted=0.0) -> None:
        """A whole round as the controller reports it: the drafter's time for the cap just
        asked (if any), the verification, and the calibration sample."""
        cdef double pe = self.predicted_tokens, pt = self.predicted_time
        if self.last_cap > 0:
            self.observe_draft_time(self.last_cap, t_drafted)
        self.observe(k, a, t_verify)
        if self.last_cap > 0:
            self.observe_round(pe, pt, a + 1, t_drafted + t_verify)

    def _py_observe_round(self, double predicted_tokens, double predicted_time, int tokens,
                          double t) -> None:
        self.observe_round(predicted_tokens, predicted_time, tokens, t)
