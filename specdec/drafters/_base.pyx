# cython: language_level=3
# distutils: language = c++
"""The drafter base class: one interface for built-in Cython drafters and user Python drafters.

Lifecycle (llama.cpp's ``common_speculative`` begin/draft/accept, vLLM's proposers):

* ``begin(seq, prompt_tokens)``: a new request on sequence ``seq`` (the prompt is
  given up front for drafters that index it; it is observed again as it is decoded);
* ``observe(seq, tokens)``: every token that enters the target's memory: the prompt
  chunks as they are decoded, then each round's accepted run;
* ``propose(seq, last_token, n_max) -> tokens`` (or ``(tokens, probs)``): the draft;
* ``accept(seq, n_accepted)``: how many of the last draft the target kept;
* ``reset(seq)``: forget the sequence.

Built-ins override the ``*_c`` hooks so the controller never enters Python for
them. A Python subclass overrides the plain methods; the base ``*_c`` hooks call
them and check what comes back, so a faulty drafter raises ``DrafterError``
before the target sees its output.
"""
from libc.stdint cimport int32_t
from libcpp.vector cimport vector
from .._core cimport Context, TargetView

import math
import numbers

import numpy as np


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


cdef class Drafter:
    """Drafter(name=None)
--

    Base of every drafter. Subclass it in Python and override ``propose``."""

    def __init__(self, name=None):
        self.name = name

    # --- C hooks: built-ins override these -------------------------------------------

    cdef int bind_c(self, Context target, int n_seq) except -1:
        # works even when a Python subclass forgot to call Drafter.__init__
        if not self.name:
            self.name = getattr(type(self), "drafter_name", None) or type(self).__name__
        t = type(self)
        # Python overrides of the optional hooks are called once per round, never per token
        self._py_begin = t.begin is not Drafter.begin
        self._py_observe = t.observe is not Drafter.observe
        self._py_accept = t.accept is not Drafter.accept
        self._py_reset = t.reset is not Drafter.reset
        self._target = target
        self.target = TargetView.__new__(TargetView)
        self.target._ctx = target
        self.n_vocab = target.n_vocab
        self.hist.resize(n_seq)
        return 0

    cdef int begin_c(self, int seq, const int32_t * toks, int n) except -1:
        self._grow(seq)
        self.hist[seq].clear()
        if self._py_begin:
            self._call("begin", seq, [toks[i] for i in range(n)])
        return 0

    cdef int observe_c(self, int seq, const int32_t * toks, int n, int row0) except -1:
        self._grow(seq)
        cdef int i
        for i in range(n):
            self.hist[seq].push_back(toks[i])
        if self._py_observe:
            self._call("observe", seq, [toks[i] for i in range(n)])
        return 0

    cdef int propose_c(self, int seq, int32_t last, int n_max, Draft out) except -1:
        res = self._call("propose", seq, int(last), int(n_max))
        _fill_draft(out, res, n_max, self.n_vocab, self.name)
        return 0

    cdef int accept_c(self, int seq, int n_accepted) except -1:
        if self._py_accept:
            self._call("accept", seq, n_accepted)
        return 0

    cdef int reset_c(self, int seq) except -1:
        if 0 <= seq < <int>self.hist.size():
            self.hist[seq].clear()
        if self._py_reset:
            self._call("reset", seq)
        return 0

    cdef int _grow(self, int seq) except -1:
        if seq < 0:
            raise ValueError(f"sequence id {seq} is negative")
        if seq >= <int>self.hist.size():
            self.hist.resize(seq + 1)
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

    def begin(self, seq, prompt_tokens):
        """A new request starts on ``seq`` with these prompt tokens."""

    def observe(self, seq, tokens):
        """``tokens`` were accepted into the target for ``seq``."""

    def propose(self, seq, last_token, n_max):
        """Up to ``n_max`` draft tokens following ``last_token``; ``[]`` for none.

        May return ``(tokens, probs)`` where ``probs[i]`` is the draft distribution
        of token i (a dense array over the vocabulary, or a ``{token: p}`` dict)
        for sampled verification; without it a draft counts as certain (one-hot).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement propose()")

    def accept(self, seq, n_accepted):
        """The target kept the first ``n_accepted`` tokens of the last draft."""

    def reset(self, seq):
        """Forget everything about ``seq``."""

    def history(self, int seq) -> list:
        """The tokens in the target's memory for ``seq``: the prompt and the accepted tokens.
        The pending token (``last_token`` of ``propose``) is not among them yet."""
        if not 0 <= seq < <int>self.hist.size():
            return []
        return [self.hist[seq][i] for i in range(self.hist[seq].size())]


cdef _fill_draft(Draft out, res, int n_max, int n_vocab, str name):
    """Check a Python drafter's answer and copy it into ``out``."""
    out.clear()
    probs = None
    if res is None:
        return
    if isinstance(res, tuple) and len(res) == 2 and not isinstance(res[0], numbers.Integral):
        res, probs = res
    if isinstance(res, (str, bytes)) or not hasattr(res, "__len__"):
        raise DrafterError(f"drafter {name!r} must return a sequence of token ids, "
                           f"got {type(res).__name__}")
    try:
        len(res)
        if probs is not None:
            len(probs)
    except TypeError as e:   # a 0-d array, an object with a broken __len__
        raise DrafterError(f"drafter {name!r} returned an unsized answer: {e}") from None
    if len(res) > n_max:
        raise DrafterError(f"drafter {name!r} returned {len(res)} tokens, more than n_max={n_max}")
    cdef int32_t t
    for x in res:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise DrafterError(f"drafter {name!r} returned a non-integer token {x!r}")
        if x < 0 or x >= n_vocab:
            raise DrafterError(f"drafter {name!r} returned token id {x} outside [0, {n_vocab})")
        t = x
        out.tokens.push_back(t)
    if probs is None:
        return
    if len(probs) != len(res):
        raise DrafterError(f"drafter {name!r} returned {len(probs)} distributions for "
                           f"{len(res)} tokens")
    cdef int i
    for i, q in enumerate(probs):
        if isinstance(q, dict):
            items = list(q.items())
        else:
            try:
                arr = np.asarray(q, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError) as e:
                raise DrafterError(f"drafter {name!r}: distribution {i} is not an array of "
                                   f"numbers: {e}") from None
            if arr.shape[0] != n_vocab:
                raise DrafterError(f"drafter {name!r}: distribution {i} has {arr.shape[0]} "
                                   f"entries, expected {n_vocab}")
            nz = np.flatnonzero(arr)
            items = list(zip(nz.tolist(), arr[nz].tolist()))
        total = 0.0
        for tok, p in items:
            if isinstance(tok, bool) or not isinstance(tok, numbers.Integral) or not 0 <= tok < n_vocab:
                raise DrafterError(f"drafter {name!r}: distribution {i} has bad token id {tok!r}")
            if not isinstance(p, numbers.Real) or not math.isfinite(p) or p < 0:
                raise DrafterError(f"drafter {name!r}: distribution {i} has probability {p!r}")
            total += p
        if not total > 0:
            raise DrafterError(f"drafter {name!r}: distribution {i} is all zero")
        for tok, p in items:
            if p > 0:
                out.q_ids.push_back(tok)
                out.q_probs.push_back(p / total)
        out.q_off.push_back(out.q_ids.size())
    out.has_probs = True
    # the draft token must have non-zero draft probability: it was drawn from q
    for i in range(<int>out.tokens.size()):
        found = False
        for j in range(out.q_off[i], out.q_off[i + 1]):
            if out.q_ids[j] == out.tokens[i]:
                found = True
                break
        if not found:
            raise DrafterError(f"drafter {name!r}: token {out.tokens[i]} at position {i} has "
                               "zero draft probability")


def check_draft(res, int n_max, int n_vocab, str name="drafter"):
    """Check a Python drafter's answer as the controller does; raises ``DrafterError``."""
    _fill_draft(Draft(), res, n_max, n_vocab, name)


# Python entry points to the C hooks, for tools and tests that drive a drafter by hand
def run_begin(Drafter d not None, int seq, prompt_tokens):
    cdef vector[int32_t] v = [int(t) for t in prompt_tokens]
    d._grow(seq)
    d.begin_c(seq, v.data(), v.size())


def run_observe(Drafter d not None, int seq, tokens, int row0=-1):
    cdef vector[int32_t] v = [int(t) for t in tokens]
    d._grow(seq)
    d.observe_c(seq, v.data(), v.size(), row0)


def run_propose(Drafter d not None, int seq, int last, int n_max) -> list:
    cdef Draft out = Draft()
    d.propose_c(seq, last, n_max, out)
    return out.token_list


def run_accept(Drafter d not None, int seq, int n_accepted):
    d.accept_c(seq, n_accepted)
