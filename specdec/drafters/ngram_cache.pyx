# cython: language_level=3
# distutils: language = c++
"""n-gram cache drafting (llama.cpp's ``ngram-cache``, common/ngram-cache.cpp and
examples/lookup): token counts per n-gram from three caches, checked in order:

* the *context* cache: every 1..4-gram of this request (prompt, accepted tokens
  and the pending token) -> the token that followed it; lax thresholds;
* the *dynamic* cache: the same counts from earlier requests, kept by the drafter
  across ``begin`` calls (llama-lookup merges the context into it at the end of a
  generation); strict thresholds;
* the *static* cache: 2-gram counts from a corpus (``llama-lookup-create``), read
  only; it also re-weights the candidates of the other two.

A draft is built token by token from the longest n-gram that passes its sample
size and majority thresholds, up to the controller's ``n_max``.

Files use llama.cpp's format (common_ngram_cache_save/load): per n-gram, its four
int32 tokens (-1 padded), an int32 count of followers, then (int32 token, int32
count) pairs, native byte order, so caches are interchangeable with llama-lookup,
llama-lookup-create/-merge and llama-server ``--lookup-cache-static/-dynamic``.

Each n-gram keeps its total and most frequent follower, so a lookup is O(1) unless
the static cache re-weights it (then the smaller of the two follower sets is
scanned); an update is O(1) per token and n-gram size. The dynamic cache is bounded
by ``max_entries`` (n-gram, token) pairs, about 120 bytes each: past it, the n-grams
not seen for the most requests go first, down to 3/4 of the bound.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t
from libcpp.string cimport string
from libcpp.vector cimport vector

import os
import tempfile

from ._base cimport Drafter, Draft


cdef extern from "ngram_cache.h" nogil:
    cdef cppclass NgCache "specdec_ngc::Cache":
        int64_t n_pairs
        uint32_t epoch
        void clear()
        void swap(NgCache &)
        size_t n_ngrams()
        void merge(const NgCache &)
        void evict(int64_t)
        int save(const string &)
        int load(const string &, int64_t *)
    void ngc_add_ending_at "specdec_ngc::add_ending_at"(
        NgCache &, const int32_t *, int, int32_t, int, int, int64_t)
    void ngc_draft "specdec_ngc::draft"(
        const int32_t *, int, int32_t, int, int, int, const NgCache &, const NgCache &,
        const NgCache &, int32_t, vector[int32_t] &)


cdef string _path(path) except *:
    return os.fsencode(os.fspath(path))


cdef class NgramCacheDrafter(Drafter):
    """NgramCacheDrafter(static_path=None, *, dynamic_path=None, ngram_min=1, ngram_max=4, max_entries=1048576, update_dynamic=True, name="ngram-cache")
--

    ``static_path``: a static cache (llama-lookup-create) loaded at construction;
    ``dynamic_path``: where ``save()``/``load()`` go by default, loaded at construction
    when the file exists (llama.cpp ``--lookup-cache-dynamic``); ``ngram_min``..
    ``ngram_max`` (1..4, llama.cpp's LLAMA_NGRAM_MIN/MAX): n-gram sizes of the context
    and dynamic caches; ``max_entries``: bound of the dynamic cache in (n-gram, token)
    pairs (the default is about 120 MB at most), None for none; ``update_dynamic``:
    feed finished requests into the dynamic cache. Drafts are as long as the
    controller's ``n_max`` allows (llama.cpp fixes 8)."""
    cdef NgCache dyn, sta
    cdef vector[NgCache] ctx
    cdef vector[int] ctx_upto      # hist positions counted into ctx
    cdef vector[int] merged_upto   # hist positions merged into dyn
    cdef vector[int] pend_pos      # position of the pending token counted into ctx, or -1
    cdef vector[int32_t] pend_tok
    cdef readonly int ngram_min, ngram_max
    cdef readonly object max_entries
    cdef readonly bint update_dynamic
    cdef readonly object static_path, dynamic_path
    cdef int64_t cap

    def __init__(self, static_path=None, *, dynamic_path=None, ngram_min=1, ngram_max=4,
                 max_entries=1 << 20, update_dynamic=True, name="ngram-cache"):
        super().__init__(name)
        ngram_min, ngram_max = int(ngram_min), int(ngram_max)
        if not 1 <= ngram_min <= ngram_max <= 4:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max <= 4, got {ngram_min}, {ngram_max}")
        if max_entries is not None:
            max_entries = int(max_entries)
            if max_entries < 1:
                raise ValueError(f"max_entries must be positive or None, got {max_entries}")
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.max_entries = max_entries
        self.cap = -1 if max_entries is None else max_entries
        self.update_dynamic = bool(update_dynamic)
        self.drafts_past_forced = True     # counts observed tokens only (n_observed)
        self.static_path = static_path or None
        self.dynamic_path = dynamic_path or None
        if self.static_path is not None:
            _load_into(self.sta, self.static_path)
        if self.dynamic_path is not None and os.path.exists(self.dynamic_path):
            self.load(self.dynamic_path)

    cdef int _seq(self, int seq) except -1:
        self._grow(seq)
        cdef size_t n = self.n_hist_seqs()
        if self.ctx.size() < n:
            self.ctx.resize(n)
            self.ctx_upto.resize(n, 0)
            self.merged_upto.resize(n, 0)
            self.pend_pos.resize(n, -1)
            self.pend_tok.resize(n, -1)
        return 0

    # --- hooks ------------------------------------------------------------------------

    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1:
        self._seq(seq)
        self.dyn.epoch += 1
        self._flush_seq(seq)          # the finished request feeds the dynamic cache
        self._evict()
        self.ctx[seq].clear()
        self.ctx_upto[seq] = 0
        self.merged_upto[seq] = 0
        self.pend_pos[seq] = -1
        return 0

    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1:
        self._seq(seq)
        self._sync(seq)
        return 0

    cdef int _reset(self, int seq) except -1:
        """Forget the sequence's context without merging it (the dynamic cache stays)."""
        if seq < <int>self.ctx.size():
            self.ctx[seq].clear()
            self.ctx_upto[seq] = 0
            self.merged_upto[seq] = 0
            self.pend_pos[seq] = -1
        return 0

    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1:
        if n_max <= 0:
            return 0
        self._seq(seq)
        self._sync(seq)
        cdef vector[int32_t] * h = self.hist(seq)
        cdef int H = h.size()
        if self.n_observed(seq) < H:
            # the history ends in tokens lent for this call (a grammar's forced run: see
            # ``Drafter.lend_hist``): they lead the lookup but are not counted
            ngc_draft(h.data(), H, last, n_max, self.ngram_min, self.ngram_max,
                      self.ctx[seq], self.dyn, self.sta, self.n_vocab, out.tokens)
            return 0
        # the pending token is part of the context, as in llama-lookup
        if self.pend_pos[seq] == H and self.pend_tok[seq] != last:
            ngc_add_ending_at(self.ctx[seq], h.data(), H, self.pend_tok[seq],
                              self.ngram_min, self.ngram_max, -1)
            self.pend_pos[seq] = -1
        if self.pend_pos[seq] < 0:
            ngc_add_ending_at(self.ctx[seq], h.data(), H, last, self.ngram_min, self.ngram_max, 1)
            self.pend_pos[seq] = H
            self.pend_tok[seq] = last
        ngc_draft(h.data(), H, last, n_max, self.ngram_min, self.ngram_max,
                  self.ctx[seq], self.dyn, self.sta, self.n_vocab, out.tokens)
        return 0

    cdef int _sync(self, int seq) except -1:
        """Count the newly observed tokens into the context cache; settle the pending
        token counted by propose (kept when it is what arrived, else taken back)."""
        cdef vector[int32_t] * h = self.hist(seq)
        cdef int H = self.n_observed(seq), pos, p = self.pend_pos[seq]
        if p >= 0 and p < H:
            if h[0][p] == self.pend_tok[seq] and self.ctx_upto[seq] == p:
                self.ctx_upto[seq] = p + 1
            else:
                ngc_add_ending_at(self.ctx[seq], h.data(), p, self.pend_tok[seq],
                                  self.ngram_min, self.ngram_max, -1)
            self.pend_pos[seq] = -1
        for pos in range(self.ctx_upto[seq], H):
            ngc_add_ending_at(self.ctx[seq], h.data(), pos, h[0][pos],
                              self.ngram_min, self.ngram_max, 1)
        if H > self.ctx_upto[seq]:
            self.ctx_upto[seq] = H
        return 0

    cdef int _flush_seq(self, int seq) except -1:
        if not self.update_dynamic:
            return 0
        cdef vector[int32_t] * h = self.hist(seq)
        cdef int pos
        for pos in range(self.merged_upto[seq], self.ctx_upto[seq]):
            ngc_add_ending_at(self.dyn, h.data(), pos, h[0][pos], self.ngram_min, self.ngram_max, 1)
        if self.ctx_upto[seq] > self.merged_upto[seq]:
            self.merged_upto[seq] = self.ctx_upto[seq]
        return 0

    cdef void _evict(self) noexcept:
        # down to 3/4 of the bound, so that eviction does not run on every request
        if self.cap >= 0 and self.dyn.n_pairs > self.cap:
            self.dyn.evict(self.cap * 3 // 4)

    # --- persistence ------------------------------------------------------------------

    def flush(self):
        """Merge what the running requests have seen so far into the dynamic cache
        (``begin`` does this for a sequence's previous request)."""
        cdef int s
        self.dyn.epoch += 1
        for s in range(<int>self.ctx.size()):
            self._flush_seq(s)
        self._evict()

    def save(self, path=None):
        """Write the dynamic cache (after ``flush``) in llama.cpp's format."""
        path = path if path is not None else self.dynamic_path
        if path is None:
            raise ValueError("no path given and no dynamic_path set")
        self.flush()
        cdef int err = self.dyn.save(_path(path))
        if err:
            raise OSError(err, os.strerror(err), os.fspath(path))

    def load(self, path=None, *, merge=False):
        """Replace (or with ``merge=True`` add to) the dynamic cache from a llama.cpp
        ngram-cache file; on error the cache is unchanged."""
        path = path if path is not None else self.dynamic_path
        if path is None:
            raise ValueError("no path given and no dynamic_path set")
        cdef NgCache tmp
        _load_into(tmp, path)
        if merge:
            self.dyn.epoch += 1
            self.dyn.merge(tmp)
        else:
            self.dyn.swap(tmp)        # loaded n-grams count as the oldest
        self._evict()

    def clear(self):
        """Empty the dynamic cache (the static cache and running contexts stay)."""
        self.dyn.clear()

    def forget_text(self):
        """Empty the dynamic cache, and leave what the running requests have seen so far
        out of it (their contexts stay)."""
        cdef size_t s
        for s in range(self.ctx.size()):
            self.merged_upto[s] = self.ctx_upto[s]
        self.dyn.clear()

    def get_state(self):
        """The dynamic cache after ``flush``, as the bytes of a llama.cpp ngram-cache file."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "dynamic.bin")
            self.save(path)
            with open(path, "rb") as f:
                return f.read()

    def set_state(self, state):
        """Replace the dynamic cache by one ``get_state`` returned (on error it is unchanged)."""
        if not isinstance(state, (bytes, bytearray, memoryview)):
            raise TypeError(f"ngram-cache state is bytes (from get_state), got {type(state).__name__}")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "dynamic.bin")
            with open(path, "wb") as f:
                f.write(state)
            self.load(path)

    def stats(self) -> dict:
        """Sizes of the caches: n-grams and (n-gram, token) entries."""
        cdef int64_t ctx_pairs = 0
        cdef size_t i
        for i in range(self.ctx.size()):
            ctx_pairs += self.ctx[i].n_pairs
        return {"dynamic_ngrams": self.dyn.n_ngrams(), "dynamic_entries": self.dyn.n_pairs,
                "static_ngrams": self.sta.n_ngrams(), "static_entries": self.sta.n_pairs,
                "context_entries": ctx_pairs}


cdef int _load_into(NgCache & c, path) except -1:
    cdef int64_t bad = 0
    cdef int rc = c.load(_path(path), &bad)
    if rc == -1:
        raise ValueError(f"{os.fspath(path)!r} is not a llama.cpp ngram-cache file "
                         f"(bad record at byte {bad})")
    if rc:
        raise OSError(rc, os.strerror(rc), os.fspath(path))
    return 0

