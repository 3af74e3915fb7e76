# cython: language_level=3
# distutils: language = c++
"""Suffix decoding (Oliaro et al., "SuffixDecoding", 2024; Arctic Inference): model-free
drafts from frequency-counted suffix trees.

Two trees are kept: one per sequence over the request's prompt and accepted tokens,
grown as tokens are observed, and one global tree over the generations of previous
requests and user documents (``add_corpus``), bounded by ``max_corpus_tokens`` and
evicting the oldest sequence first. A draft matches the longest suffix of the
history plus the pending token (at most ``max_depth`` tokens) that has been seen
with a continuation, then follows the most frequent continuation while the
product of the empirical continuation probabilities stays at or above
``min_prob``, so repetitive text gets long drafts and ambiguous text short ones or
none. Each tree proposes a draft; the one with the higher expected number of
accepted tokens (the sum of the path probabilities) wins.

The index is ``_suffix_tree.SuffixTree``.
"""
from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

import math
import numbers

import numpy as np

from .._core cimport Context
from ._base cimport Drafter, Draft
from ._suffix_tree cimport SuffixTree


DEFAULT_MIN_PROB = 0.1


cdef class SuffixDrafter(Drafter):
    """SuffixDrafter(max_depth=64, *, min_prob=None, spec_factor=1.0, spec_offset=0.0, max_corpus_tokens=100_000, name="suffix")
--

    Suffix decoding.

    ``max_depth`` (64): the longest context matched; the trees index suffixes of up to
    ``max_depth + 1`` tokens. ``min_prob``: stop drafting when the estimated
    probability of the whole draft falls below it; this drafter's ``p_min`` (None: the
    ``Decoder``'s ``p_min`` when set, else 0.1), or below the round's confidence floor when
    higher (the adaptive policy's ``p_stop``: in a batch, what a verify row must be kept with
    to pay). ``spec_factor`` (1.0) and ``spec_offset`` (0.0): at most
    ``spec_factor * match_length + spec_offset`` tokens, so a short match, which says
    little, drafts little (Arctic Inference's ``max_spec_factor``/``max_spec_offset``).
    ``max_corpus_tokens`` (100000): size of the global corpus of earlier generations
    and ``add_corpus`` documents, oldest evicted first; 0 turns it off.

    Drafts are returned as plain tokens (one-hot draft distributions). The empirical
    frequencies are not valid as ``q`` for rejection sampling: the drafter does not
    sample its token from them but takes the most frequent one, and the match length,
    the stopping rule and the choice between the two trees all depend on the counts,
    so the token's real distribution given the context is a point mass. Accepting
    with ``min(1, p/q)`` for a q that is not the proposal's distribution would bias
    the output; with one-hot ``q`` sampled verification stays exact (accept with
    p(token), else sample from p without it).
    """
    def __init__(self, max_depth=64, *, min_prob=None, spec_factor=1.0, spec_offset=0.0,
                 max_corpus_tokens=100_000, name="suffix"):
        super().__init__(name)
        max_depth = int(max_depth)
        if not 1 <= max_depth <= 1024:
            raise ValueError(f"max_depth must be in 1..1024, got {max_depth}")
        for k, v in (("spec_factor", spec_factor), ("spec_offset", spec_offset)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{k} must be a finite number >= 0, got {v!r}")
        try:
            self._set_p_min(min_prob, DEFAULT_MIN_PROB)
        except ValueError:
            raise ValueError(f"min_prob must be a number in [0, 1], got {min_prob!r}") from None
        if isinstance(max_corpus_tokens, bool) or not isinstance(max_corpus_tokens, numbers.Integral) \
                or max_corpus_tokens < 0:
            raise ValueError(f"max_corpus_tokens must be an int >= 0, got {max_corpus_tokens!r}")
        self.max_depth = max_depth
        self.spec_factor = spec_factor
        self.spec_offset = spec_offset
        self.max_corpus_tokens = max_corpus_tokens
        self.corpus = SuffixTree(max_depth + 1)
        self.corpus_max_tok = -1
        self.drafts_past_forced = True     # reads history + pending token only
        self.local = []

    @property
    def min_prob(self):
        """The stopping probability: this drafter's ``p_min``."""
        return self.p_min

    # --- the hooks -----------------------------------------------------------------------

    cdef int bind_c(self, Context target, int n_seq) except -1:
        Drafter.bind_c(self, target, n_seq)
        if self.corpus_max_tok >= self.n_vocab:
            raise ValueError(f"the corpus of drafter {self.name!r} has token id {self.corpus_max_tok}, "
                             f"outside this model's vocabulary of {self.n_vocab}")
        return 0

    cdef SuffixTree _local(self, int seq):
        while len(self.local) <= seq:
            t = SuffixTree(self.max_depth + 1)
            (<SuffixTree>t).start_seq()
            self.local.append(t)
        if <int>self.gen_start.size() <= seq:
            self.gen_start.resize(seq + 1, 0)
        return <SuffixTree>self.local[seq]

    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1:
        self._commit(seq)
        cdef SuffixTree t = self._local(seq)
        t.clear()
        t.start_seq()
        self.gen_start[seq] = n
        return 0

    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1:
        cdef SuffixTree t = self._local(seq)
        cdef int i
        for i in range(n):
            t.append(toks[i])
        return 0

    cdef int _reset(self, int seq) except -1:
        self._commit(seq)
        if seq < len(self.local):
            t = self._local(seq)
            (<SuffixTree>t).clear()
            (<SuffixTree>t).start_seq()
            self.gen_start[seq] = 0
        return 0

    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1:
        if n_max <= 0 or seq < 0:
            return 0
        # context: the last max_depth - 1 accepted tokens and the pending one
        self.ctx.clear()
        cdef vector[int32_t] * h
        cdef int i, n0
        if seq < self.n_hist_seqs():
            h = self.hist(seq)
            for i in range(max(0, <int>h.size() - (self.max_depth - 1)), <int>h.size()):
                self.ctx.push_back(h[0][i])
        self.ctx.push_back(last)
        n0 = self.ctx.size()
        cdef double sa = 0.0, sb = 0.0
        # the round's confidence floor (the adaptive policy's, in a batch a row's price) when
        # higher: the path probability is the whole draft's, as the floor's is
        cdef double p_min = max(self.p_min, self.p_stop)
        self.draft_a.clear()
        self.draft_b.clear()
        if seq < len(self.local):
            sa = (<SuffixTree>self.local[seq]).draft(self.ctx, self.max_depth, n_max, p_min,
                                                self.spec_factor, self.spec_offset, self.draft_a)
            self.ctx.resize(n0)
        if self.corpus.n_tokens > 0:
            sb = self.corpus.draft(self.ctx, self.max_depth, n_max, p_min,
                                   self.spec_factor, self.spec_offset, self.draft_b)
        if sb > sa:
            out.tokens = self.draft_b
        else:
            out.tokens = self.draft_a
        return 0

    # --- the global corpus ---------------------------------------------------------------

    cdef int _commit(self, int seq) except -1:
        """Add the generation of ``seq``'s last request to the corpus (once)."""
        if seq < 0 or seq >= self.n_hist_seqs() or seq >= <int>self.gen_start.size():
            return 0
        cdef vector[int32_t] * h = self.hist(seq)
        cdef int start = self.gen_start[seq]
        if <int>h.size() - start >= 2:
            self._add_c(h.data() + start, <int>h.size() - start)
        self.gen_start[seq] = h.size()
        return 0

    cdef void _add_c(self, const int32_t * toks, int64_t n) noexcept:
        if self.max_corpus_tokens <= 0 or n < 2:
            return
        if n > self.max_corpus_tokens:
            toks += n - self.max_corpus_tokens
            n = self.max_corpus_tokens
        while self.corpus.n_tokens + n > self.max_corpus_tokens:
            self.corpus.pop_front()
        self.corpus.add_seq(toks, <int>n)
        cdef int64_t i
        for i in range(n):
            if toks[i] > self.corpus_max_tok:
                self.corpus_max_tok = toks[i]

    def add_corpus(self, docs):
        """Add documents (token id lists, or text when bound to a model) to the global
        corpus, each as its own sequence, evicting the oldest as needed."""
        if isinstance(docs, (str, bytes)) or (hasattr(docs, "__len__") and len(docs)
                                              and isinstance(docs[0], numbers.Integral)):
            docs = [docs]
        cdef vector[int32_t] v
        lim = self.n_vocab if self.target is not None else 0x7FFFFFFF
        for d in docs:
            if isinstance(d, (str, bytes)):
                if self.target is None:
                    raise TypeError("text documents need a bound model to tokenize them; "
                                    "pass token ids or add them after binding")
                d = self.target.model.tokenize(d, add_special=False)
            v.clear()
            for t in d:
                if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < lim:
                    raise ValueError(f"corpus token {t!r} is not a token id in [0, {lim})")
                v.push_back(t)
            self._add_c(v.data(), v.size())

    def finish(self, int seq=0):
        """Add ``seq``'s generation so far to the corpus now (``begin``/``reset`` do it anyway)."""
        self._commit(seq)

    def forget_text(self):
        """Empty the corpus, and leave the running requests' generations out of it."""
        cdef int s
        for s in range(min(self.n_hist_seqs(), <int>self.gen_start.size())):
            self.gen_start[s] = self.hist(s).size()
        self.corpus.clear()
        self.corpus_max_tok = -1

    def get_state(self):
        """The corpus (earlier generations and documents, oldest first) as bytes: int32
        sequence count, the lengths, then the tokens."""
        cdef size_t k
        seqs = [np.asarray(<vector[int32_t]> self.corpus.seqs[k], dtype=np.int32)
                for k in range(self.corpus.seqs.size())]
        head = np.array([len(seqs)] + [len(q) for q in seqs], dtype=np.int32)
        return b"".join([head.tobytes()] + [q.tobytes() for q in seqs])

    def set_state(self, state):
        """Replace the corpus by one ``get_state`` returned."""
        if not isinstance(state, (bytes, bytearray, memoryview)):
            raise TypeError(f"suffix state is bytes (from get_state), got {type(state).__name__}")
        a = np.frombuffer(state, dtype=np.int32) if len(state) % 4 == 0 else np.empty(0, np.int32)
        n_seqs = int(a[0]) if len(a) else -1
        lens = a[1:1 + n_seqs] if n_seqs >= 0 else a[:0]
        if n_seqs < 0 or len(lens) != n_seqs or (lens < 0).any() \
                or len(a) != 1 + n_seqs + int(lens.sum(dtype=np.int64)):
            raise ValueError("not a suffix drafter state (from get_state)")
        toks = a[1 + n_seqs:]
        lim = self.n_vocab if self.target is not None else 0x7FFFFFFF
        if len(toks) and (toks.min() < 0 or toks.max() >= lim):
            raise ValueError(f"suffix drafter state has token ids outside [0, {lim})")
        self.corpus.clear()
        self.corpus_max_tok = -1
        cdef const int32_t[::1] mv
        cdef int64_t off = 0
        for n in lens.tolist():
            if n:
                mv = np.ascontiguousarray(toks[off:off + n])
                self._add_c(&mv[0], n)
            off += n

    @property
    def corpus_tokens(self) -> int:
        return self.corpus.n_tokens

    @property
    def corpus_sequences(self) -> int:
        return self.corpus.seqs.size()

    def tree_nodes(self, int seq=-1) -> int:
        """Live nodes of ``seq``'s tree, or of the corpus tree for ``seq=-1``."""
        return self._tree(seq).n_nodes

    cdef SuffixTree _tree(self, int seq):
        """The tree of ``seq``, or the corpus tree for ``seq=-1``."""
        if seq < 0:
            return self.corpus
        if seq >= len(self.local):
            raise IndexError(f"no sequence {seq}")
        return <SuffixTree>self.local[seq]
