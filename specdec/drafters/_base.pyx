# cython: language_level=3
# distutils: language = c++
"""The drafter base class: one interface for built-in Cython drafters and user Python drafters.

One cdef class, ``Drafter``, whose C hooks each carry the dispatch rule and the grammar's
lent history, with what its hooks take and give (``Draft``, ``Asks``, ``TokenHistory``) beside
it; the hooks' answer parsing lives apart (``_answer.pxi``), and so do the Python entry points
to the hooks (``_run.pyx``).

Lifecycle (llama.cpp's ``common_speculative`` begin/draft/accept, vLLM's proposers):

* ``begin(seq, prompt_tokens)``: a new request on sequence ``seq`` (the prompt is
  given up front for drafters that index it; it is observed again as it is decoded).
  ``history(seq)`` still holds the previous request here, and is empty afterwards;
* ``observe(seq, tokens)``: every token that enters the target's memory: the prompt
  chunks as they are decoded, then each round's accepted run (already in ``history``);
* ``propose(seq, last_token, n_max) -> tokens`` (or ``(tokens, probs)``): the draft;
* ``propose_batch(seqs, last_tokens, n_maxs) -> [answer, ...]``: the drafts of every
  sequence of a round that asks this drafter, in one call (the controller calls this,
  once per round). The default asks ``propose`` for each in turn; a drafter with a model
  of its own drafts them all with one decode per draft step (one row per sequence);
* ``accept(seq, n_accepted)``: how many of the last draft the target kept (of a
  built-in drafter's proposal drafted past a grammar's forced run, its own tokens after
  the run: see ``lend_hist``);
* ``reset(seq)``: forget the sequence.

The rest of the contract, each with a default here, is what the Decoder asks of every
drafter (it never probes for attributes):

* ``configure(spec)``: the decoder's draft settings, before ``bind``: ``n_max`` always,
  ``p_min`` unless the drafter was given its own;
* ``needs_mtp_hidden``: the target must keep its MTP hidden state for every row;
* ``rollback_depth``: how many tokens of a round the target must be able to take back;
* ``has_model`` / ``n_gpu_layers``: the drafter loads a model of its own, placed so;
* ``forget_text()``: drop what was kept of earlier requests' text;
* ``get_state()`` / ``set_state(state)``: what persists across requests (None: nothing);
* ``close()``: free what the drafter holds now rather than at garbage collection.

**Dispatch rule: a Python override is always honoured.** The controller calls the C
hooks (``begin_c`` ... ``reset_c``), which only this class defines. Each checks once, at
construction and again at ``bind``, whether the object's class overrides the plain
Python method (``begin``, ``observe``, ``propose``, ``propose_batch``, ``accept``,
``reset``); if it does, the hook calls the override (and checks what ``propose`` and
``propose_batch`` return), else it runs the drafter's C implementation (``_begin`` ...
``_reset``) without entering Python. A ``propose`` override without a ``propose_batch``
one is asked once per sequence (the batch hook then loops over it). The
plain methods of the base run that C implementation, so an override of a built-in
may call ``super().propose(...)`` and change its answer. A built-in drafter without
Python overrides therefore costs no Python in a round.
"""
from libc.stdint cimport int32_t
from libc.stdlib cimport free, malloc
from libcpp.vector cimport vector
from cpython.buffer cimport PyBUF_WRITABLE, PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES
from .._core cimport Context, Model, TargetView

import math
import os
import numbers

import numpy as np

from ..placement import draft_options


class DrafterError(RuntimeError):
    """A drafter failed or returned something unusable; the decoder stays usable."""


cdef class Draft:
    cdef void clear(self) noexcept nogil:
        self.tokens.clear()
        self.q_ids.clear()
        self.q_probs.clear()
        self.q_off.clear()
        self.q_off.push_back(0)
        self.has_probs = False

    def __init__(self):
        self.clear()

    @property
    def token_list(self):
        return [self.tokens[i] for i in range(self.tokens.size())]

    def answer(self):
        """The draft as ``propose`` returns it: tokens, or ``(tokens, probs)`` with one
        ``{token: p}`` dict per token."""
        toks = self.token_list
        if not self.has_probs:
            return toks
        probs = [{self.q_ids[j]: self.q_probs[j] for j in range(self.q_off[i], self.q_off[i + 1])}
                 for i in range(<int>self.tokens.size())]
        return toks, probs


cdef class Asks:
    """The sequences of one round that ask one drafter for a draft (``propose_batch_c``)."""

    def __cinit__(self):
        self.drafts = []
        self.errors = []

    cdef int n(self) noexcept:
        return self.seq.size()

    cdef int clear(self) except -1:
        self.seq.clear()
        self.last.clear()
        self.n_max.clear()
        self.p_stop.clear()
        self.drafts = []
        self.errors = []
        self.t_sync = 0.0
        return 0

    cdef int add(self, int seq, int32_t last, int n_max, double p_stop, Draft out) except -1:
        self.seq.push_back(seq)
        self.last.push_back(last)
        self.n_max.push_back(n_max)
        self.p_stop.push_back(p_stop)
        self.drafts.append(out)
        self.errors.append(None)
        return 0

    cdef int fail(self, int j, object e) except -1:
        """Ask ``j`` failed with ``e``: raised, or kept for the controller (``isolate``)."""
        if not self.isolate:
            raise e
        (<Draft> self.drafts[j]).clear()
        self.errors[j] = e
        return 0


cdef int32_t _NO_TOKENS = 0


cdef class TokenHistory:
    """A sequence's tokens. ``Drafter.history`` hands out read-only numpy views of them
    without copying; while a view is alive the drafter never moves or overwrites the
    tokens it shows (it continues in a new buffer instead), so a view stays valid and
    unchanged: a snapshot of the history when it was taken."""

    def __len__(self):
        return self.v.size()

    def __getbuffer__(self, Py_buffer * buf, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("a drafter's history is read-only")
        cdef Py_ssize_t * dims = <Py_ssize_t *> malloc(2 * sizeof(Py_ssize_t))
        if dims == NULL:
            raise MemoryError()
        dims[0] = self.v.size()
        dims[1] = sizeof(int32_t)
        buf.buf = <void *> (self.v.data() if self.v.size() else &_NO_TOKENS)
        buf.obj = self
        buf.len = dims[0] * sizeof(int32_t)
        buf.readonly = 1
        buf.itemsize = sizeof(int32_t)
        buf.format = NULL
        if flags & PyBUF_FORMAT:
            buf.format = b"i"
        buf.ndim = 1
        buf.shape = dims if flags & PyBUF_ND else NULL
        buf.strides = dims + 1 if (flags & PyBUF_STRIDES) == PyBUF_STRIDES else NULL
        buf.suboffsets = NULL
        buf.internal = dims
        self.n_exports += 1

    def __releasebuffer__(self, Py_buffer * buf):
        free(buf.internal)
        self.n_exports -= 1


cdef inline double _p_value(value, str what) except -1:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be a number in [0, 1], got {value!r}")
    return float(value)


cdef class Drafter:
    """Drafter(name=None)
--

    Base of every drafter. Subclass it in Python and override ``propose``."""

    def __cinit__(self, *args, **kwargs):
        self._hists = []
        self.observe_row = -1
        self._bind_hooks()

    def __init__(self, name=None):
        self.name = name

    cdef int _set_p_min(self, value, double default) except -1:
        """A drafter's own ``p_min`` (None: ``default`` until ``configure`` brings the
        decoder's). The one rule for every drafter with a probability threshold."""
        self._p_min_given = value is not None
        self.p_min = default if value is None else _p_value(value, "p_min")
        return 0

    cdef int _bind_hooks(self) except -1:
        t = type(self)
        self._py_begin = t.begin is not Drafter.begin
        self._py_observe = t.observe is not Drafter.observe
        self._py_propose = t.propose is not Drafter.propose
        self._py_accept = t.accept is not Drafter.accept
        self._py_reset = t.reset is not Drafter.reset
        self._py_propose_batch = t.propose_batch is not Drafter.propose_batch
        return 0

    # --- the history -------------------------------------------------------------------

    cdef int _grow(self, int seq) except -1:
        if seq < 0:
            raise ValueError(f"sequence id {seq} is negative")
        while len(self._hists) <= seq:
            self._hists.append(TokenHistory())
        return 0

    cdef vector[int32_t] * hist(self, int seq) except NULL:
        """The tokens of ``seq`` (grown on demand); valid until the next hook call."""
        self._grow(seq)
        return &(<TokenHistory> self._hists[seq]).v

    cdef int n_hist_seqs(self) noexcept:
        return len(self._hists)

    cdef int _clear_hist(self, int seq) except -1:
        self._grow(seq)
        cdef TokenHistory th = <TokenHistory> self._hists[seq]
        if th.n_exports:
            self._hists[seq] = TokenHistory()     # the views keep the old tokens
        else:
            th.v.clear()
        return 0

    cdef int _append_hist(self, int seq, const int32_t * toks, int n) except -1:
        self._grow(seq)
        cdef TokenHistory th = <TokenHistory> self._hists[seq], fresh
        if th.n_exports and th.v.size() + n > th.v.capacity():
            # a view shows the current buffer: continue in a new one rather than move it
            fresh = TokenHistory()
            fresh.v.reserve(2 * (th.v.size() + n))
            fresh.v.assign(th.v.begin(), th.v.end())
            self._hists[seq] = fresh
            th = fresh
        th.v.insert(th.v.end(), toks, toks + n)
        return 0

    cdef int lend_hist(self, int seq, int32_t last, const int32_t * forced, int n) except -1:
        """For one propose call past a grammar's forced run (``_propose.pyx``): the history
        ends in the pending token ``last`` and ``forced[0..n-1]``, tokens not observed yet
        (``n_observed`` leaves them out) until ``take_back_hist``."""
        self._append_hist(seq, &last, 1)
        self._append_hist(seq, forced, n)
        (<TokenHistory> self._hists[seq]).n_lent += n + 1
        return 0

    cdef int take_back_hist(self, int seq) except -1:
        """The history as it was before ``lend_hist``. A view taken meanwhile may show the
        lent tokens: the history then continues in a new buffer, so that the view never
        shows the tokens observed in their place."""
        cdef TokenHistory th = <TokenHistory> self._hists[seq], fresh
        cdef size_t n = th.v.size() - th.n_lent
        th.n_lent = 0
        if th.n_exports:
            fresh = TokenHistory()
            fresh.v.reserve(th.v.capacity())
            fresh.v.assign(th.v.begin(), th.v.begin() + n)
            self._hists[seq] = fresh
        else:
            th.v.resize(n)
        return 0

    cdef int n_observed(self, int seq) except -1:
        """The tokens of ``seq``'s history that were observed: a drafter that indexes its
        history while it proposes indexes these, not those lent for the call."""
        self._grow(seq)
        cdef TokenHistory th = <TokenHistory> self._hists[seq]
        return th.v.size() - th.n_lent

    # --- C hooks: the controller calls these (the dispatch rule lives here) -------------

    cdef int bind_c(self, Context target, int n_seq) except -1:
        # works even when a Python subclass forgot to call Drafter.__init__
        if not self.name:
            self.name = getattr(type(self), "drafter_name", None) or type(self).__name__
        self._bind_hooks()
        self._target = target
        self.target = TargetView.__new__(TargetView)
        self.target._ctx = target
        self.n_vocab = target.n_vocab
        if n_seq > 0:
            self._grow(n_seq - 1)
        return 0

    cdef Model own_model(self, object source, Model target, bint load_mtp=False):
        """The drafter's own model (a draft, an MTP head file): ``source`` itself when it is
        loaded already, else that GGUF placed as the target is unless the drafter's
        ``n_gpu_layers`` (llama.cpp's ``-ngld``) says otherwise, with the target's weight
        layout (exact mode needs both unrepacked)."""
        if isinstance(source, Model):
            return source
        opts = draft_options(target.placement, self.n_gpu_layers)
        if load_mtp:
            opts["load_mtp"] = True
        return Model(os.fspath(source), use_extra_bufts=target.use_extra_bufts, **opts)

    cdef int begin_c(self, int seq, const int32_t * toks, int n) except -1:
        self._grow(seq)
        if self._py_begin:
            self._call("begin", seq, [toks[i] for i in range(n)])
        else:
            self._begin(seq, toks, n)
        self._clear_hist(seq)
        return 0

    cdef int observe_c(self, int seq, const int32_t * toks, int n, int row0) except -1:
        self._append_hist(seq, toks, n)
        self.observe_row = row0
        try:
            if self._py_observe:
                self._call("observe", seq, [toks[i] for i in range(n)])
            else:
                self._observe(seq, toks, n, row0)
        finally:
            self.observe_row = -1
        return 0

    cdef int propose_c(self, int seq, int32_t last, int n_max, Draft out) except -1:
        if self._py_propose:
            res = self._call("propose", seq, int(last), int(n_max))
            _fill_draft(out, res, n_max, self.n_vocab, self.name)
        else:
            out.clear()
            self._propose(seq, last, n_max, out)
        return 0

    cdef int propose_batch_c(self, Asks asks) except -1:
        """Every ask's draft into its ``Draft``: a Python ``propose_batch`` override if there
        is one, else a ``propose`` override per ask, else the C ``_propose_batch``."""
        cdef int j, n = asks.n()
        cdef Draft out
        for out in asks.drafts:
            out.clear()
        if n == 0:
            return 0
        if self._py_propose_batch:
            try:
                res = self._call("propose_batch", [asks.seq[j] for j in range(n)],
                                 [int(asks.last[j]) for j in range(n)],
                                 [asks.n_max[j] for j in range(n)])
                if isinstance(res, (str, bytes)) or not hasattr(res, "__len__") \
                        or len(res) != n:
                    raise DrafterError(f"drafter {self.name!r}: propose_batch must return one "
                                       f"answer per sequence ({n}), got {res!r:.80}")
                for j in range(n):
                    _fill_draft(<Draft> asks.drafts[j], res[j], asks.n_max[j], self.n_vocab,
                                self.name)
            except Exception as e:
                for j in range(n):
                    asks.fail(j, e)
        elif self._py_propose:
            for j in range(n):
                self.p_stop = asks.p_stop[j]
                self.t_sync = 0.0
                try:
                    self.propose_c(asks.seq[j], asks.last[j], asks.n_max[j],
                                   <Draft> asks.drafts[j])
                except Exception as e:
                    asks.fail(j, e)
                asks.t_sync += self.t_sync
        else:
            self.t_sync = 0.0
            try:
                self._propose_batch(asks)
            except Exception as e:
                for j in range(n):
                    if asks.errors[j] is None:
                        asks.fail(j, e)
            asks.t_sync += self.t_sync
        return 0

    cdef int accept_c(self, int seq, int n_accepted) except -1:
        if self._py_accept:
            self._call("accept", seq, n_accepted)
        else:
            self._accept(seq, n_accepted)
        return 0

    cdef int reset_c(self, int seq) except -1:
        if seq < 0:
            return 0
        if self._py_reset:
            self._call("reset", seq)
        else:
            self._reset(seq)
        if seq < len(self._hists):
            self._clear_hist(seq)
        return 0

    # --- C implementations: built-ins override these ----------------------------------

    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1:
        return 0

    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1:
        return 0

    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1:
        raise NotImplementedError(f"{type(self).__name__} must implement propose()")

    cdef int _propose_batch(self, Asks asks) except -1:
        """The default: ``_propose`` for each ask in turn (an error fails its own ask only,
        under ``isolate``). Drafters with a model draft every ask in one decode per step."""
        cdef int j
        cdef double t_sync = 0.0
        for j in range(asks.n()):
            self.p_stop = asks.p_stop[j]
            self.t_sync = 0.0
            try:
                self._propose(asks.seq[j], asks.last[j], asks.n_max[j], <Draft> asks.drafts[j])
            except Exception as e:
                asks.fail(j, e)
            t_sync += self.t_sync
        self.t_sync = t_sync
        return 0

    cdef int _accept(self, int seq, int n_accepted) except -1:
        return 0

    cdef int _reset(self, int seq) except -1:
        return 0

    def _call(self, str method, *args):
        try:
            return getattr(self, method)(*args)
        except DrafterError:
            raise
        except Exception as e:
            raise DrafterError(f"drafter {self.name!r} raised in {method}(): "
                               f"{type(e).__name__}: {e}") from e

    # --- Python API ------------------------------------------------------------------

    def bind(self, target, int n_seq=1):
        """Attach to the target before ``begin`` (the Decoder does this, with a read-only
        :class:`TargetView`; a :class:`Context` is accepted too). ``self.target`` is
        the view either way: a drafter reads the target, the controller changes it."""
        cdef Context ctx
        if isinstance(target, TargetView):
            ctx = (<TargetView>target)._ctx
        elif isinstance(target, Context):
            ctx = target
        else:
            raise TypeError(f"bind() takes the target Context or its TargetView, got "
                            f"{type(target).__name__}")
        self.bind_c(ctx, n_seq)

    def configure(self, spec):
        """Take the decoder's draft settings (a ``SpecConfig``), before ``bind``: ``n_max``
        always, ``p_min`` unless the drafter was given its own (a decoder's ``p_min`` of 0
        leaves the drafter's default)."""
        self.n_max = spec.n_max
        if not self._p_min_given and spec.p_min > 0:
            self.p_min = _p_value(spec.p_min, "p_min")

    @property
    def needs_mtp_hidden(self):
        """Whether the target must keep its MTP hidden state for every row it decodes."""
        return False

    @property
    def rollback_depth(self):
        """Tokens of one round the target must be able to take back: the longest draft."""
        return self.n_max

    @property
    def has_model(self):
        """Whether the drafter loads a model of its own (placed by ``n_gpu_layers``)."""
        return False

    def forget_text(self):
        """Drop what was kept of earlier requests' text (a corpus, a dynamic cache), so
        the next request drafts from its own text only; learnt statistics may stay."""

    def get_state(self):
        """What the drafter keeps across requests, as an object ``set_state`` takes back
        (bytes for the built-ins); None when it keeps nothing."""
        return None

    def set_state(self, state):
        """Restore what ``get_state`` returned."""
        if state is not None:
            raise ValueError(f"drafter {self.name!r} keeps no state across requests")

    def close(self):
        """Free what the drafter holds (contexts, threads) now; it cannot draft afterwards."""

    # the hooks: a Python override replaces the C implementation, which these run

    def begin(self, seq, prompt_tokens):
        """A new request starts on ``seq`` with these prompt tokens."""
        cdef vector[int32_t] v = [int(t) for t in prompt_tokens]
        self._grow(seq)
        self._begin(seq, v.data(), v.size())

    def observe(self, seq, tokens):
        """``tokens`` were accepted into the target for ``seq`` (``history`` has them)."""
        cdef vector[int32_t] v = [int(t) for t in tokens]
        self._grow(seq)
        self._observe(seq, v.data(), v.size(), self.observe_row)

    def propose(self, seq, last_token, n_max):
        """Up to ``n_max`` draft tokens following ``last_token``; ``[]`` for none.

        May return ``(tokens, probs)`` where ``probs[i]`` is the draft distribution
        of token i (a dense array over the vocabulary, or a ``{token: p}`` dict)
        for sampled verification; without it a draft counts as certain (one-hot).
        """
        cdef Draft out = Draft()
        self._grow(seq)
        self.p_stop = 0.0       # no round: no confidence floor of a policy (a round's would linger)
        self._propose(seq, last_token, n_max, out)
        return out.answer()

    def propose_batch(self, seqs, last_tokens, n_maxs):
        """The drafts of ``seqs`` (one round's sequences that ask this drafter), each
        following its ``last_tokens[i]`` and at most ``n_maxs[i]`` long: a list with one
        answer per sequence, as ``propose`` returns it. The base drafts them as the
        drafter's C implementation does (one decode per draft step for all of them, for the
        drafters with a model); an override may call it and change the answers."""
        if not len(seqs) == len(last_tokens) == len(n_maxs):
            raise ValueError(f"propose_batch takes one last token and one n_max per sequence: "
                             f"{len(seqs)} sequences, {len(last_tokens)} tokens, "
                             f"{len(n_maxs)} caps")
        cdef Asks asks = Asks()
        cdef int j
        for j in range(len(seqs)):
            self._grow(seqs[j])
            asks.add(seqs[j], last_tokens[j], n_maxs[j], 0.0, Draft())
        if self._py_propose:        # a Python propose: asked for each (and checked)
            for j in range(asks.n()):
                self.propose_c(asks.seq[j], asks.last[j], asks.n_max[j], <Draft> asks.drafts[j])
        else:
            self._propose_batch(asks)
        return [(<Draft> d).answer() for d in asks.drafts]

    def accept(self, seq, n_accepted):
        """The target kept the first ``n_accepted`` tokens of the last draft."""
        self._accept(seq, n_accepted)

    def reset(self, seq):
        """Forget everything about ``seq``."""
        self._reset(seq)

    def history(self, int seq):
        """The tokens in the target's memory for ``seq`` (the prompt and the accepted
        tokens) as a read-only int32 numpy view, without a copy. The pending token
        (``last_token`` of ``propose``) is not among them yet. The view is a snapshot:
        call ``history`` again for the tokens observed since."""
        if not 0 <= seq < len(self._hists):
            return np.empty(0, dtype=np.int32)
        return np.frombuffer(self._hists[seq], dtype=np.int32)


include "_answer.pxi"

