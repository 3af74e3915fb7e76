# cython: language_level=3
# distutils: language = c++
"""n-gram map drafting (llama.cpp's ``ngram-map-k`` and ``ngram-map-k4v``,
common/ngram-map.cpp): a map from each key n-gram of the history to the m-gram
that followed it, with feedback on how much of that m-gram the target accepted.

The key is the last ``n - 1`` accepted tokens plus the pending token. A key that
occurred before (with a whole m-gram after it) proposes that m-gram:

* ``ngram-map`` (llama.cpp ``ngram-map-k``): the m-gram after the key's first
  indexed occurrence (llama.cpp's order: the latest one in the prompt, else the
  earliest one generated), so the feedback always concerns the same continuation;
* ``ngram-map-k4v``: up to four distinct m-grams are counted per key and the most
  frequent one is proposed when it occurred at least twice as often as all the
  others together.

Either way the key needs ``min_hits`` earlier occurrences, and a proposal is cut to
the number of tokens the target accepted the last time this continuation was
proposed (``m`` until then; llama.cpp's ``n_accepted`` per value). A draft that
the controller's ``n_max`` cut short and the target took whole leaves that number
as it was: it says nothing about the tokens left out.

Where llama.cpp scans the history linearly behind a 2^18-slot hash table, every
position is indexed once into an exact hash map, with a chain of earlier
occurrences per key, so updates and lookups cost O(n) per token (n is the fixed
key length) and memory stays proportional to the history. Across requests on the
same sequence the map keeps what lies in the common prefix of the old history and
the new prompt (llama.cpp keeps it when the new prompt extends the history), so
the acceptance feedback survives in a chat that resends its conversation.
"""
from libc.stdint cimport int16_t, int32_t, uint16_t, uint64_t
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, preincrement as inc

from ._base cimport Drafter, Draft


cdef enum:
    N_VALUES = 4              # llama.cpp COMMON_NGRAM_MAX_VALUES
    MAX_VALUE_COUNT = 16380   # llama.cpp COMMON_NGRAM_MAX_VALUE_COUNT


cdef struct Entry:
    int32_t first           # first indexed occurrence: the key at hist[first:first + n]
    int32_t latest          # latest indexed occurrence (head of the chain in prev)
    int32_t count           # indexed occurrences (the "hits")
    int32_t chunk           # indexing pass that set ``first``
    int32_t stat_idx        # occurrences <= stat_idx are counted in value_num (k4v)
    int32_t value_idx[N_VALUES]   # start of each tracked m-gram in hist, -1 when unused
    uint16_t value_num[N_VALUES]  # occurrences of that m-gram after the key
    int16_t n_acc[N_VALUES]       # tokens accepted when it was last proposed (m before)


cdef inline uint64_t _mix(uint64_t h, int32_t t) noexcept nogil:
    h ^= <uint64_t>(<unsigned int>t) + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2)
    return h * 0xFF51AFD7ED558CCDULL


cdef inline uint64_t _hash(const int32_t * a, int n) noexcept nogil:
    cdef uint64_t h = 0
    cdef int i
    for i in range(n):
        h = _mix(h, a[i])
    return h


cdef inline bint _same(const int32_t * a, const int32_t * b, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if a[i] != b[i]:
            return False
    return True


cdef class _MapSeq:
    cdef unordered_map[uint64_t, Entry] keys
    cdef vector[int32_t] prev       # prev[j]: previous indexed occurrence of the key at j, or -1
    cdef int indexed                # positions 0..indexed are in the map (-1: none)
    cdef int size_last_begin        # prompt length of the current request
    cdef int passes                 # indexing passes so far (chunk ids)
    cdef vector[int32_t] key        # scratch: the current key
    cdef vector[int32_t] occ        # scratch: occurrences to count
    # the last proposal, for accept()
    cdef bint has_last
    cdef uint64_t last_key
    cdef int last_slot, last_len
    cdef bint last_cut              # shortened by the controller's n_max, not by feedback

    def __cinit__(self):
        self.indexed = -1


cdef class NgramMapDrafter(Drafter):
    """NgramMapDrafter(n=12, m=48, *, min_hits=1, k4v=False, name=None)
--

    ``n``: key length; ``m``: length of the proposed m-gram; ``min_hits``: earlier
    occurrences the key needs; ``k4v``: count up to four m-grams per key and propose
    the dominant one (llama.cpp ``ngram-map-k4v``) instead of the first one seen.
    Defaults are llama.cpp's (common.h ``common_params_speculative_ngram_map``)."""
    cdef readonly int n, m, min_hits
    cdef readonly bint k4v
    cdef list seqs

    def __init__(self, n=12, m=48, *, min_hits=1, k4v=False, name=None):
        super().__init__(name or ("ngram-map-k4v" if k4v else "ngram-map"))
        n, m, min_hits = int(n), int(m), int(min_hits)
        # llama.cpp's own limits (common/arg.cpp)
        if not 1 <= n <= 1024:
            raise ValueError(f"key length n must be in 1..1024, got {n}")
        if not 1 <= m <= 1024:
            raise ValueError(f"m-gram length m must be in 1..1024, got {m}")
        if min_hits < 1:
            raise ValueError(f"min_hits must be at least 1, got {min_hits}")
        self.n, self.m, self.min_hits, self.k4v = n, m, min_hits, bool(k4v)
        self.seqs = []
        self.drafts_past_forced = True     # indexes observed tokens only (n_observed)

    cdef _MapSeq _seq(self, int seq):
        while len(self.seqs) <= seq:
            self.seqs.append(_MapSeq())
        return <_MapSeq> self.seqs[seq]

    # --- hooks ------------------------------------------------------------------------

    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1:
        cdef _MapSeq st = self._seq(seq)
        cdef vector[int32_t] * h = self.hist(seq)
        cdef int p = 0, lim = min(<int>h.size(), n)
        while p < lim and h[0][p] == toks[p]:
            p += 1
        # keep the positions whose key and m-gram lie in the common prefix
        self._truncate(st, p - self.n - self.m - 1)
        st.size_last_begin = n
        st.has_last = False
        return 0

    cdef int _reset(self, int seq) except -1:
        if seq < len(self.seqs):
            self.seqs[seq] = _MapSeq()
        return 0

    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1:
        if n_max <= 0:
            return 0
        cdef _MapSeq st = self._seq(seq)
        st.has_last = False
        cdef vector[int32_t] * h = self.hist(seq)
        cdef int L = h.size(), n = self.n, m = self.m, i
        if L < 2 * n + m:      # llama.cpp's minimum history
            return 0
        # the key ends the history, lent tokens included (a grammar's forced run: see
        # ``Drafter.lend_hist``); only observed tokens are indexed, so every m-gram copied
        # is one the target wrote or read
        self._index(st, h, self.n_observed(seq) - n - m - 1)
        st.key.clear()
        for i in range(L - n + 1, L):
            st.key.push_back(h[0][i])
        st.key.push_back(last)
        cdef uint64_t kh = _hash(st.key.data(), n)
        cdef unordered_map[uint64_t, Entry].iterator it = st.keys.find(kh)
        if it == st.keys.end():
            return 0
        cdef Entry * e = &deref(it).second
        if e.count < self.min_hits or not _same(h.data() + e.first, st.key.data(), n):
            return 0
        cdef int slot = 0, src = e.first + n, v
        cdef int max_occur = 0, sum_occur = 0
        if self.k4v:
            self._count_values(st, e, h)
            for v in range(N_VALUES):
                if e.value_num[v] > max_occur:
                    max_occur = e.value_num[v]
                    slot = v
            for v in range(N_VALUES):
                if v != slot:
                    sum_occur += e.value_num[v]
            if max_occur == 0 or (sum_occur > 0 and max_occur < 2 * sum_occur):
                return 0      # no value clearly dominates
            src = e.value_idx[slot]
        cdef int cap = min(m, <int>e.n_acc[slot])
        cdef int k = min(cap, n_max)
        if k <= 0:
            return 0
        for i in range(k):
            out.tokens.push_back(h[0][src + i])
        st.has_last = True
        st.last_key = kh
        st.last_slot = slot
        st.last_len = k
        st.last_cut = k < cap
        return 0

    cdef int _accept(self, int seq, int n_accepted) except -1:
        if seq >= len(self.seqs):
            return 0
        cdef _MapSeq st = <_MapSeq> self.seqs[seq]
        if not st.has_last:
            return 0
        st.has_last = False
        # a draft cut by n_max and taken whole says nothing about the tokens left out
        if st.last_cut and n_accepted >= st.last_len:
            return 0
        cdef unordered_map[uint64_t, Entry].iterator it = st.keys.find(st.last_key)
        if it != st.keys.end():
            deref(it).second.n_acc[st.last_slot] = <int16_t> max(0, min(n_accepted, self.m))
        return 0

    # --- the index --------------------------------------------------------------------

    cdef void _index(self, _MapSeq st, vector[int32_t] * h, int limit) noexcept:
        """Index the keys starting at positions indexed+1..limit (each has a whole
        m-gram after it). llama.cpp fills its table in descending order per pass,
        first writer wins, prompt before generation; ascending with "the last writer
        of the same pass wins" leaves the same ``first`` and builds the chains in order."""
        if limit <= st.indexed:
            return
        cdef int n = self.n, j, v
        cdef int p_end = st.size_last_begin - n - self.m - 1   # llama.cpp's prompt range
        cdef int chunk_prompt = 2 * st.passes, chunk_gen = chunk_prompt + 1, chunk
        cdef uint64_t kh
        cdef unordered_map[uint64_t, Entry].iterator it
        cdef Entry e
        cdef Entry * pe
        st.passes += 1
        for j in range(st.indexed + 1, limit + 1):
            chunk = chunk_prompt if j <= p_end else chunk_gen
            kh = _hash(h.data() + j, n)
            it = st.keys.find(kh)
            if it == st.keys.end():
                e.first = j
                e.latest = j
                e.count = 1
                e.chunk = chunk
                e.stat_idx = -1
                for v in range(N_VALUES):
                    e.value_idx[v] = -1
                    e.value_num[v] = 0
                    e.n_acc[v] = <int16_t> self.m
                st.keys[kh] = e
                st.prev.push_back(-1)
            else:
                pe = &deref(it).second
                st.prev.push_back(pe.latest)
                pe.latest = j
                pe.count += 1
                if pe.chunk == chunk:
                    pe.first = j
        st.indexed = limit

    cdef void _count_values(self, _MapSeq st, Entry * e, vector[int32_t] * h) noexcept:
        """Fold the occurrences after ``stat_idx`` into the value statistics, oldest
        first, so the first four distinct m-grams get the slots (as in llama.cpp)."""
        cdef int n = self.n, m = self.m, pos, i, v, slot, vstart
        cdef const int32_t * d = h.data()
        st.occ.clear()
        pos = e.latest
        while pos > e.stat_idx:
            st.occ.push_back(pos)
            pos = st.prev[pos]
        for i in range(<int>st.occ.size() - 1, -1, -1):
            pos = st.occ[i]
            if not _same(d + pos, d + e.first, n):
                continue      # a 64-bit hash collision: another key
            vstart = pos + n
            slot = -1
            for v in range(N_VALUES):
                if e.value_idx[v] < 0:
                    e.value_idx[v] = vstart
                    e.value_num[v] = 0
                    e.n_acc[v] = <int16_t> m
                    slot = v
                    break
                if _same(d + vstart, d + e.value_idx[v], m):
                    slot = v
                    break
            if slot >= 0 and e.value_num[slot] < MAX_VALUE_COUNT:
                e.value_num[slot] += 1
        e.stat_idx = e.latest

    cdef void _truncate(self, _MapSeq st, int keep) noexcept:
        """Forget every occurrence after position ``keep`` (all when negative)."""
        if keep >= st.indexed:
            return
        if keep < 0:
            st.keys.clear()
            st.prev.clear()
            st.indexed = -1
            return
        cdef unordered_map[uint64_t, Entry].iterator it = st.keys.begin()
        cdef Entry * e
        cdef int pos, v, w
        while it != st.keys.end():
            e = &deref(it).second
            if e.first > keep:
                it = st.keys.erase(it)
                continue
            pos = e.latest
            while pos > keep:
                pos = st.prev[pos]
                e.count -= 1
            e.latest = pos
            if e.stat_idx > keep:
                # recount from scratch; values first seen in the prefix keep their feedback
                e.stat_idx = -1
                w = 0
                for v in range(N_VALUES):
                    if 0 <= e.value_idx[v] and e.value_idx[v] - self.n <= keep:
                        e.value_idx[w] = e.value_idx[v]
                        e.n_acc[w] = e.n_acc[v]
                        w += 1
                for v in range(N_VALUES):
                    e.value_num[v] = 0
                    if v >= w:
                        e.value_idx[v] = -1
                        e.n_acc[v] = <int16_t> self.m
            inc(it)
        st.prev.resize(keep + 1)
        st.indexed = keep

    # --- introspection ----------------------------------------------------------------

    def n_keys(self, int seq=0) -> int:
        """Distinct key n-grams indexed for ``seq`` (memory grows with the history only)."""
        if not 0 <= seq < len(self.seqs):
            return 0
        return (<_MapSeq> self.seqs[seq]).keys.size()


cdef class NgramMapK4VDrafter(NgramMapDrafter):
    """NgramMapK4VDrafter(n=12, m=48, *, min_hits=1, name="ngram-map-k4v")
--

    llama.cpp ``ngram-map-k4v``: the dominant one of up to four m-grams per key."""

    def __init__(self, n=12, m=48, *, min_hits=1, name="ngram-map-k4v"):
        super().__init__(n, m, min_hits=min_hits, k4v=True, name=name)

