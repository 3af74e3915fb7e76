# cython: language_level=3
# distutils: language = c++
"""Prompt lookup (llama.cpp's ``ngram-simple``): copy what followed the last
occurrence of the current n-gram in the prompt or the generation.

The key is the last ``n - 1`` accepted tokens plus the pending token. Where
llama.cpp scans the history backwards every round, a hash map from each n-gram
to the position after its latest occurrence makes a lookup O(1). With
``n_min_key`` shorter keys are tried when the full key has never been seen.

Of the key's occurrences, the one whose preceding text matches the current context
longest is followed (the latest among equals), as LZ77's longest-match search does:
a short key recurs all over code (``self.``, ``    def``), and its latest occurrence is
seldom the passage being repeated, where a long verbatim match usually is (llama.cpp's
default reaches that by a 12-token key, which finds nothing until 12 tokens repeat).
Each key length keeps a chain from every occurrence to the previous one with the same
key (``prev``), walked newest first for up to ``CHAIN`` occurrences, each match measured
back up to ``MAX_MATCH`` tokens.
"""
from libc.stdint cimport int32_t, uint64_t
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref

from .._core cimport Context
from ._base cimport Drafter, Draft


cdef inline uint64_t _mix(uint64_t h, int32_t t) noexcept nogil:
    h ^= <uint64_t>(<unsigned int>t) + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2)
    return h * 0xFF51AFD7ED558CCDULL


DEF CHAIN = 256          # occurrences of a key compared per proposal, newest first
DEF MAX_MATCH = 256      # a match this long ends the search


cdef class _SeqIndex:
    # one map per key length: hash of the n-gram -> index in hist just after it
    cdef vector[unordered_map[uint64_t, int32_t]] maps
    # per key length: prev[k][e] = the index after the previous occurrence of the k-gram
    # that ends at hist[e - 1] (-1: none)
    cdef vector[vector[int32_t]] prev
    cdef int indexed     # hist entries already indexed


cdef class NgramDrafter(Drafter):
    """NgramDrafter(n=3, *, n_min_key=None, name="ngram")
--

    ``n``: key length; ``n_min_key``: shortest fallback key; proposals follow the
    occurrence of the key with the longest match of the text before it (the latest among
    equals), as far as the history goes, up to the controller's ``n_max``."""
    cdef readonly int n
    cdef readonly int n_min_key
    cdef list index

    def __init__(self, n=3, *, n_min_key=None, name="ngram"):
        super().__init__(name)
        n = int(n)
        if not 1 <= n <= 16:
            raise ValueError(f"n-gram key length must be in 1..16, got {n}")
        self.n = n
        self.n_min_key = n if n_min_key is None else int(n_min_key)
        if not 1 <= self.n_min_key <= n:
            raise ValueError(f"n_min_key must be in 1..{n}, got {n_min_key}")
        self.index = []
        self.drafts_past_forced = True     # reads history + pending token only

    cdef _SeqIndex _idx(self, int seq):
        while len(self.index) <= seq:
            ix = _SeqIndex()
            (<_SeqIndex>ix).maps.resize(self.n + 1)
            (<_SeqIndex>ix).prev.resize(self.n + 1)
            self.index.append(ix)
        return <_SeqIndex> self.index[seq]

    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1:
        cdef _SeqIndex ix = self._idx(seq)
        cdef int k
        for k in range(self.n + 1):
            ix.maps[k].clear()
            ix.prev[k].clear()
        ix.indexed = 0
        return 0

    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1:
        self._index_upto(seq, self._idx(seq))
        return 0

    cdef int _reset(self, int seq) except -1:
        if seq < len(self.index):
            self.index[seq] = None
            self.index[seq] = _SeqIndex()
            (<_SeqIndex>self.index[seq]).maps.resize(self.n + 1)
            (<_SeqIndex>self.index[seq]).prev.resize(self.n + 1)
        return 0

    cdef int _index_upto(self, int seq, _SeqIndex ix) except -1:
        # every n-gram ending at hist[e - 1] maps to e (the token after it)
        cdef vector[int32_t] * h = self.hist(seq)
        cdef int total = h.size(), e, k, j
        cdef uint64_t key
        cdef unordered_map[uint64_t, int32_t].iterator it
        for k in range(self.n_min_key, self.n + 1):
            ix.prev[k].resize(total, -1)
        # e == total has no continuation yet: it is indexed once a token follows
        for e in range(max(ix.indexed + 1, 1), total):
            key = 0
            for k in range(1, self.n + 1):
                j = e - k
                if j < 0:
                    break
                key = _mix(key, h[0][j])
                if k >= self.n_min_key:
                    it = ix.maps[k].find(key)
                    if it == ix.maps[k].end():
                        ix.maps[k][key] = e
                    else:
                        ix.prev[k][e] = deref(it).second
                        deref(it).second = e
        if total - 1 > ix.indexed:
            ix.indexed = total - 1
        return 0

    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1:
        if seq >= len(self.index) or n_max <= 0:
            return 0
        cdef _SeqIndex ix = <_SeqIndex> self.index[seq]
        cdef vector[int32_t] * h = self.hist(seq)
        cdef int total = h.size(), k, j, start = -1, i
        cdef uint64_t key = _mix(0, last)
        cdef unordered_map[uint64_t, int32_t].iterator it
        # keys are built newest-first: last, hist[-1], hist[-2], ...
        cdef vector[uint64_t] keys
        keys.push_back(key)
        for k in range(2, self.n + 1):
            j = total - (k - 1)
            if j < 0:
                break
            key = _mix(key, h[0][j])
            keys.push_back(key)
        for k in range(<int>keys.size(), self.n_min_key - 1, -1):
            if k < 1:
                break
            it = ix.maps[k].find(keys[k - 1])
            if it != ix.maps[k].end():
                start = _longest_match(h[0], ix.prev[k], deref(it).second, last, k)
                if start >= 0:
                    break
        if start < 0:
            return 0
        for i in range(n_max):
            if start + i >= total:
                break
            out.tokens.push_back(h[0][start + i])
        return 0



cdef int _longest_match(const vector[int32_t] & h, const vector[int32_t] & prev, int e,
                        int32_t last, int k) noexcept:
    """Of the occurrences on the chain from ``e`` (the index after the latest one), the one
    whose preceding tokens match the context (``last``, then the history backwards) longest;
    the latest among equals; -1 if none matches the ``k`` tokens of its key (a hash collision)."""
    cdef int total = h.size(), best = -1, best_m = k - 1, m, j, n = 0
    cdef int32_t want
    while e >= 0 and n < CHAIN:
        n += 1
        m = 0
        # context token j back: ``last`` (j = 0), then hist[total - j]; occurrence: hist[e-1-j]
        while m < MAX_MATCH and e - 1 - m >= 0:
            want = last if m == 0 else h[total - m]
            if h[e - 1 - m] != want:
                break
            m += 1
            if total - m < 0:
                break
        if m > best_m:
            best_m = m
            best = e
            if m >= MAX_MATCH:
                break
        e = prev[e] if e < <int>prev.size() else -1
    return best
