# cython: language_level=3
# distutils: language = c++
"""Test and debugging hooks of the controller, apart from the production classes.

``DrivenController`` is a :class:`Controller` that tests drive the way a benchmark would:
request settings given once to the constructor, ``start`` a request per prompt on the
first slots, ``run`` the rounds to the end, ``stats()`` of those requests together.
Decoder and Engine join and step requests themselves and need none of it.

``CheckedController`` is a ``DrivenController`` that can

- ``check``: re-check every greedy token against an independent argmax (numpy over
  the zero-copy logits view), raising ``AssertionError`` on a mismatch;
- ``unsafe_accept_all``: accept every sampled draft (a deliberately wrong rule, so
  the distribution tests can show they detect a broken one);
- ``record``: keep every verified draft (``draft_log``).

``DrivenPolicy`` is a :class:`DraftPolicy` whose round steps tests call from Python;
``HeldPolicy`` one that holds every round plain (its cap 0), as the adaptive policy holds
its plain rounds and the batch's floor the rounds where drafting does not pay;
``UnpaidPolicy`` one whose nearly free drafter never pays and was right before, so that its
rounds' caps depend on no measured time.

``sparse_head(n)`` sets how few tokens a grammar's row must allow to get only their logits
(``_verify.SPARSE_HEAD``; 0: every row whole, masked after), for the tests' and the
benchmarks' comparison of the two; it returns the value it replaced. ``lockstep(on)`` sets
whether the sequences of a decode under a grammar are verified together
(``_verify.LOCKSTEP``, ``Verifier.lockstep``) or one after the other; it returns the
value it replaced.

``row_floor(on)`` sets whether a row's price in a batch is the confidence floor of the
drafters that know their draft's probability (``_round_budget.row_floor``), or only the
policy's is; it returns the value it replaced.

``shared_request_probe(on)`` sets whether a new request restarts its policy's probe
schedule for every sequence sharing it (the old behaviour) instead of probing its own
sequence alone (``_round_budget.wanted``); it returns the value it replaced.

``steady_rows(mode)`` sets whether controllers built after it hold a lone sequence's verify
rows to one shape (``_steady_rows``: 1 always, 0 never, -1 where the target is on a CUDA
device); it returns the mode it replaced.

``expected_tokens(on)`` sets whether a model-drafted batch's rounds count their sequences'
expected accepted drafts or their draw (``_batch_length``); it returns the value it replaced.

Only tests and ``Decoder(check=True)`` import this module.
"""
from libc.stdint cimport int32_t

import numpy as np

from ._controller cimport Controller
from ._controller import new_policy
from ._seq cimport _Seq
from ._policy cimport DraftPolicy
from ._timing cimport N_PARTS
from ._verify cimport Verifier, set_sparse_head, set_lockstep
from ._steady_rows cimport set_steady
from ._batch_length cimport set_expected_tokens
from ._round_budget cimport set_row_floor, set_shared_request_probe


def sparse_head(int n):
    """Set ``_verify.SPARSE_HEAD`` to ``n`` (see the module's docstring); the old value."""
    if n < 0:
        raise ValueError("sparse_head takes n >= 0")
    return set_sparse_head(n)


def lockstep(bint on):
    """Set ``_verify.LOCKSTEP`` to ``on`` (see the module's docstring); the old value."""
    return set_lockstep(on)


def row_floor(bint on):
    """Set ``_round_budget.ROW_FLOOR`` to ``on`` (see the module's docstring); the old value."""
    return set_row_floor(on)


def shared_request_probe(bint on):
    """Set ``_round_budget.SHARED_REQUEST_PROBE`` to ``on`` (see the module's docstring); the
    old value."""
    return set_shared_request_probe(on)


def expected_tokens(bint on):
    """Set ``_batch_length.EXPECTED_TOKENS`` to ``on`` (see the module's docstring); the old
    value."""
    return set_expected_tokens(on)


def steady_rows(int mode):
    """Set ``_steady_rows.STEADY`` to ``mode`` (see the module's docstring); the old mode."""
    if mode not in (-1, 0, 1):
        raise ValueError("steady_rows takes -1 (auto), 0 or 1")
    return set_steady(mode)


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


cdef class DrivenController(Controller):
    """DrivenController(ctx, drafters=(), *, n_max=0, n_min=0, adaptive=False, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, stop=(), exact=False, policy=None, n_ctx_seq=0, isolate=False)
--

    A :class:`Controller` whose request settings (``n_max`` .. ``stop``, ``policy``) are
    the defaults of ``start``."""
    cdef dict defaults
    cdef list started       # the sequences of the last ``start`` (``stats()`` sums them)

    def __init__(self, ctx, drafters=(), *, int n_max=0, int n_min=0, bint adaptive=False,
                 float temperature=0.0, int top_k=0, float top_p=1.0, float min_p=0.0, stop=(),
                 bint exact=False, DraftPolicy policy=None, int n_ctx_seq=0, bint isolate=False):
        super().__init__(ctx, drafters, n_max=n_max, exact=exact, n_ctx_seq=n_ctx_seq,
                         isolate=isolate)
        if not self.drafters:
            n_max = 0
        stops = [stop] if isinstance(stop, (str, bytes)) else list(stop)
        self.defaults = dict(
            n_max=n_max, n_min=n_min, temperature=temperature, top_k=top_k, top_p=top_p,
            min_p=min_p, stop=[s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in stops],
            policy=policy if policy is not None and policy.n_max == n_max
            and policy.adaptive == adaptive else new_policy(n_max, adaptive))
        self.started = []

    def start(self, prompts, max_tokens, seeds=None):
        """Begin one request per prompt on sequences 0..n-1 with the constructor's settings
        (every slot is cleared first; the counters of ``stats()`` restart)."""
        assert 0 < len(prompts) <= len(self.seqs)
        if isinstance(max_tokens, int):
            max_tokens = [max_tokens] * len(prompts)
        seeds = [0] * len(prompts) if seeds is None else list(seeds)
        for i in range(len(self.seqs)):
            self.leave(i)
        self.reset_stats()
        d = self.defaults
        for i, p in enumerate(prompts):
            self.join(i, p, max_tokens=max_tokens[i], seed=seeds[i],
                      temperature=d["temperature"], top_k=d["top_k"], top_p=d["top_p"],
                      min_p=d["min_p"], stop=d["stop"], n_max=d["n_max"], n_min=d["n_min"],
                      policy=d["policy"])
        self.started = self.seqs[:len(prompts)]

    def run(self):
        """Rounds until every sequence has finished."""
        while self.step() > 0:
            pass

    def reset_stats(self):
        """Restart the totals of ``stats()``."""
        cdef int i
        self.totals.clear()
        for i in range(N_PARTS):
            self.clock.part[i] = 0.0

    def stats(self, seq=None) -> dict:
        """Counters as plain Python values: of request ``seq``, or (None) the totals since the
        last ``start`` / ``reset_stats`` over the sequences ``start`` began."""
        if seq is not None:
            return Controller.stats(self, seq)
        cdef _Seq s
        cdef long long n_gen = 0
        for s in self.started:
            n_gen += s.req.out.n_tokens
        out = self.totals.stats(n_gen, len(self.started), self.clock.part)
        out["n_prompt"] = sum((<_Seq> s).cnt.n_prompt for s in self.started)
        out["n_prompt_decoded"] = sum((<_Seq> s).cnt.n_decoded for s in self.started)
        return out

    def is_prefilling(self, int seq) -> bool:
        return self._seq(seq).prefilling

    @property
    def n_sequences(self) -> int:
        return len(self.started)

    @property
    def policy(self) -> DraftPolicy:
        """The default draft-length policy (pass it to the next controller to keep what it learnt)."""
        return self.defaults["policy"]

    @property
    def policy_state(self) -> dict:
        """The default policy's estimates (acceptance per position, verify and draft times)."""
        return self.defaults["policy"].state()


cdef class CheckedController(DrivenController):
    """CheckedController(ctx, drafters=(), *, check=False, unsafe_accept_all=False, record=False, **settings)
--

    A :class:`DrivenController` with the test hooks above."""
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


cdef class HeldPolicy(DraftPolicy):
    """HeldPolicy(n_max)
--

    Every round plain: the drafter is never asked (cap 0)."""

    cdef int cap(self, long round_id=-1) noexcept:
        self.last_cap = 0
        return 0


cdef class UnpaidPolicy(DraftPolicy):
    """UnpaidPolicy(n_max)
--

    An adaptive policy whose drafter, nearly free and right before, never pays, whatever is
    measured: each new request is owed a probe of its own (``probes_new_requests``), and its
    own schedule probes nothing for 1000 rounds (unless restarted: the old behaviour of
    ``shared_request_probe``). The caps of its rounds depend on no time."""

    def __init__(self, int n_max):
        super().__init__(n_max, True)
        self.n_alpha[1] = self.s_alpha[1] = 4.0     # right before
        self.n_drafts_seen = 8
        self.probe_gap = 1000

    cdef int _best_cap(self, double * gain) noexcept:
        gain[0] = 0.5
        return 0

    cdef bint _drafting_nearly_free(self) noexcept:
        return True


cdef class DrivenPolicy(DraftPolicy):
    """The policy's steps from Python, for tests that drive it by hand."""

    def _py_cap(self, long round_id=-1) -> int:
        return self.cap(round_id)

    def _py_choose(self, int proposed, double t_drafted) -> int:
        return self.choose(proposed, t_drafted)

    def _py_observe(self, int k, int a, double t_verify, double t_drafted=0.0,
                    double t_caught=0.0) -> None:
        """A whole round as the controller reports it: the drafter's time for the cap just
        asked (if any; ``t_caught`` its catch-up), the verification, and the calibration
        sample."""
        cdef double pe = self.predicted_tokens, pt = self.predicted_time
        if self.last_cap > 0:
            self.observe_draft_time(self.last_cap, t_drafted)
        self.observe(k, a, t_verify)
        if self.last_cap > 0:
            self.observe_round(pe, pt, a + 1, t_drafted + t_verify, t_caught)

    def _py_observe_round(self, double predicted_tokens, double predicted_time, int tokens,
                          double t) -> None:
        self.observe_round(predicted_tokens, predicted_time, tokens, t)
