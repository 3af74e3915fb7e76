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

from ._base cimport Drafter, Draft
from .registry import register


cdef extern from * nogil:
    """
    #include <algorithm>
    #include <cerrno>
    #include <climits>
    #include <cstdint>
    #include <map>
    #include <memory>
    #include <cstdio>
    #include <string>
    #include <unordered_map>
    #include <utility>
    #include <vector>

    namespace specdec_ngc {

    enum { NG_MAX = 4, NG_STATIC = 2 };   // LLAMA_NGRAM_MAX, LLAMA_NGRAM_STATIC

    // thresholds below which a draft stops, by n-gram size (common/ngram-cache.cpp)
    static const int MIN_SAMPLE_LAX[NG_MAX]    = { 2,  2,  1,  1};
    static const int MIN_PERCENT_LAX[NG_MAX]   = {66, 50, 50, 50};
    static const int MIN_SAMPLE_STRICT[NG_MAX] = { 4,  3,  2,  2};
    static const int MIN_PERCENT_STRICT[NG_MAX]= {75, 66, 66, 66};

    struct NGram {                 // common_ngram: tokens, -1 (LLAMA_TOKEN_NULL) padded
        int32_t t[NG_MAX];
        bool operator==(const NGram & o) const {
            return t[0] == o.t[0] && t[1] == o.t[1] && t[2] == o.t[2] && t[3] == o.t[3];
        }
    };

    struct NGramHash {
        size_t operator()(const NGram & g) const {
            uint64_t h = 0x9E3779B97F4A7C15ULL;
            for (int i = 0; i < NG_MAX; ++i) {
                h = (h ^ (uint32_t) g.t[i]) * 0xFF51AFD7ED558CCDULL;
                h ^= h >> 29;
            }
            return (size_t) h;
        }
    };

    // followers of one n-gram: most n-grams have one or two, so a short vector
    // (no per-token node) until SMALL of them, a hash map past that
    struct Part {
        enum { SMALL = 12 };
        typedef std::pair<int32_t, int32_t> TC;       // token, count
        std::vector<TC> v;
        std::unique_ptr<std::unordered_map<int32_t, int32_t>> big;
        int64_t sum = 0;
        int32_t max_tok = -1;
        int32_t max_cnt = 0;
        uint32_t epoch = 0;        // the cache's epoch when a count last grew

        size_t size() const { return big ? big->size() : v.size(); }
        bool empty() const { return size() == 0; }

        int32_t * find(int32_t tok) {
            if (big) { auto it = big->find(tok); return it == big->end() ? nullptr : &it->second; }
            for (auto & tc : v) if (tc.first == tok) return &tc.second;
            return nullptr;
        }
        const int32_t * find(int32_t tok) const { return const_cast<Part *>(this)->find(tok); }

        void insert(int32_t tok, int32_t cnt) {
            if (big) { big->emplace(tok, cnt); return; }
            v.emplace_back(tok, cnt);
            if (v.size() > SMALL) {
                big.reset(new std::unordered_map<int32_t, int32_t>(v.begin(), v.end()));
                std::vector<TC>().swap(v);
            }
        }

        void erase(int32_t tok) {
            if (big) { big->erase(tok); return; }
            for (size_t i = 0; i < v.size(); ++i) {
                if (v[i].first == tok) { v[i] = v.back(); v.pop_back(); return; }
            }
        }

        template <class F> void each(F f) const {
            if (big) { for (const auto & kv : *big) f(kv.first, kv.second); }
            else { for (const auto & tc : v) f(tc.first, tc.second); }
        }

        void refresh() {
            sum = 0; max_tok = -1; max_cnt = 0;
            each([this](int32_t t, int32_t c) {
                sum += c;
                if (c > max_cnt) { max_cnt = c; max_tok = t; }
            });
        }
    };

    typedef std::unordered_map<NGram, Part, NGramHash> Map;

    struct Cache {
        Map map;
        int64_t n_pairs = 0;       // (n-gram, token) entries: the memory that grows
        uint32_t epoch = 0;        // bumped by the owner per merged request

        void clear() { map.clear(); n_pairs = 0; }
        void swap(Cache & o) { map.swap(o.map); std::swap(n_pairs, o.n_pairs); }
        size_t n_ngrams() const { return map.size(); }

        // count `tok` after `g` `delta` more times (fewer when negative); on a tie the
        // token seen last becomes the favourite (llama.cpp: hash-map order, which
        // also tends to favour the newer token)
        void add(const NGram & g, int32_t tok, int64_t delta) {
            if (delta > 0) {
                Part & p = map[g];
                int32_t * cnt = p.find(tok);
                int64_t c;
                if (cnt == nullptr) {
                    c = std::min<int64_t>(delta, INT32_MAX);
                    p.insert(tok, (int32_t) c);
                    ++n_pairs;
                } else {
                    c = std::min<int64_t>((int64_t) *cnt + delta, INT32_MAX);
                    delta = c - *cnt;
                    *cnt = (int32_t) c;
                }
                p.sum += delta;
                p.epoch = epoch;
                if (c >= p.max_cnt) { p.max_cnt = (int32_t) c; p.max_tok = tok; }
                return;
            }
            auto pit = map.find(g);
            if (pit == map.end()) return;
            Part & p = pit->second;
            int32_t * cnt = p.find(tok);
            if (cnt == nullptr) return;
            int64_t c = (int64_t) *cnt + delta;
            if (c <= 0) { p.erase(tok); --n_pairs; } else { *cnt = (int32_t) c; }
            if (p.empty()) { map.erase(pit); return; }
            p.refresh();
        }

        void merge(const Cache & o) {
            for (const auto & gp : o.map) {
                gp.second.each([&](int32_t t, int32_t c) { add(gp.first, t, c); });
            }
        }

        // drop n-grams until at most `target` pairs are left: those of the oldest
        // epochs first; in the epoch that crosses the target, single samples first
        void evict(int64_t target) {
            if (n_pairs <= target) return;
            std::map<uint32_t, int64_t> per_epoch;
            for (const auto & gp : map) per_epoch[gp.second.epoch] += (int64_t) gp.second.size();
            int64_t left = n_pairs;
            bool whole = false;
            uint32_t cut = 0, partial = 0;
            for (const auto & e : per_epoch) {
                if (left - e.second < target) { partial = e.first; break; }
                left -= e.second; cut = e.first; whole = true;
            }
            auto drop = [&](auto keep) {
                for (auto it = map.begin(); it != map.end() && n_pairs > target;) {
                    if (keep(it->second)) { ++it; continue; }
                    n_pairs -= (int64_t) it->second.size();
                    it = map.erase(it);
                }
            };
            if (whole) drop([&](const Part & p) { return p.epoch > cut; });
            drop([&](const Part & p) { return p.epoch != partial || p.sum > 1; });
            drop([&](const Part & p) { return p.epoch != partial; });
        }

        // common_ngram_cache_save; written to a temporary file, then renamed
        int save(const std::string & path) const {
            std::string tmp = path + ".tmp";
            FILE * f = std::fopen(tmp.c_str(), "wb");
            if (!f) return errno ? errno : EIO;
            bool ok = true;
            std::vector<int32_t> buf;
            for (const auto & gp : map) {
                buf.clear();
                buf.insert(buf.end(), gp.first.t, gp.first.t + NG_MAX);
                buf.push_back((int32_t) gp.second.size());
                gp.second.each([&](int32_t t, int32_t c) { buf.push_back(t); buf.push_back(c); });
                if (std::fwrite(buf.data(), sizeof(int32_t), buf.size(), f) != buf.size()) {
                    ok = false;
                    break;
                }
            }
            int err = 0;
            if (!ok) err = errno ? errno : EIO;
            if (std::fclose(f) != 0 && !err) err = errno ? errno : EIO;
            if (!err && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno ? errno : EIO;
            if (err) std::remove(tmp.c_str());
            return err;
        }

        // common_ngram_cache_load, with every record checked instead of asserted.
        // Returns 0, an errno for I/O errors, or -1 for a malformed file (*bad: its offset).
        int load(const std::string & path, int64_t * bad) {
            FILE * f = std::fopen(path.c_str(), "rb");
            if (!f) return errno ? errno : ENOENT;
            Cache out;
            int32_t head[NG_MAX + 1], pair[2];
            int64_t off = 0;
            int rc = 0;
            for (;;) {
                size_t got = std::fread(head, sizeof(int32_t), NG_MAX + 1, f);
                if (got == 0 && std::feof(f)) break;
                if (got != NG_MAX + 1) { rc = -1; break; }
                NGram g;
                int k = 0;
                while (k < NG_MAX && head[k] >= 0) { g.t[k] = head[k]; ++k; }
                bool valid = k >= 1 && head[NG_MAX] > 0;
                for (int i = k; i < NG_MAX; ++i) { g.t[i] = -1; valid = valid && head[i] == -1; }
                if (!valid) { rc = -1; break; }
                off += (NG_MAX + 1) * sizeof(int32_t);
                for (int32_t i = 0; i < head[NG_MAX]; ++i) {
                    if (std::fread(pair, sizeof(int32_t), 2, f) != 2
                            || pair[0] < 0 || pair[1] <= 0) {
                        rc = -1; break;
                    }
                    out.add(g, pair[0], pair[1]);
                    off += 2 * sizeof(int32_t);
                }
                if (rc) break;
            }
            if (rc == 0 && std::ferror(f)) rc = errno ? errno : EIO;
            std::fclose(f);
            if (rc) { *bad = off; return rc; }
            swap(out);
            return 0;
        }
    };

    // count the n-grams h[pos-k:pos] (k = kmin..kmax) -> tok
    static void add_ending_at(Cache & c, const int32_t * h, int pos, int32_t tok,
                              int kmin, int kmax, int64_t delta) {
        for (int k = kmin; k <= kmax && pos - k >= 0; ++k) {
            NGram g;
            for (int i = 0; i < NG_MAX; ++i) g.t[i] = i < k ? h[pos - k + i] : -1;
            c.add(g, tok, delta);
        }
    }

    // followers of the largest n-gram in `grams` (ascending sizes) that pass the
    // thresholds; candidates are weighted by the static cache (100 * count, else 1)
    static int32_t try_primary(const Cache & c, const NGram * grams, const int * sizes, int n,
                               const Part * ps, const int * min_sample, const int * min_pct) {
        for (int i = n - 1; i >= 0; --i) {
            auto it = c.map.find(grams[i]);
            if (it == c.map.end()) continue;
            const Part & p = it->second;
            const int s = sizes[i] - 1;
            if (p.sum < min_sample[s]) continue;
            int32_t best = p.max_tok;
            int64_t best_cnt = p.max_cnt, best_w = p.max_cnt;
            if (ps != nullptr && !ps->empty()) {
                // only tokens the static cache knows can outweigh the plain favourite
                const int32_t * sc = ps->find(best);
                if (sc != nullptr) best_w = best_cnt * 100 * *sc;
                auto consider = [&](int32_t t, int64_t cp, int64_t cs) {
                    int64_t w = cp * 100 * cs;
                    if (w > best_w) { best_w = w; best = t; best_cnt = cp; }
                };
                if (ps->size() < p.size()) {
                    ps->each([&](int32_t t, int32_t cs) {
                        const int32_t * cp = p.find(t);
                        if (cp != nullptr) consider(t, *cp, cs);
                    });
                } else {
                    p.each([&](int32_t t, int32_t cp) {
                        const int32_t * cs = ps->find(t);
                        if (cs != nullptr) consider(t, cp, *cs);
                    });
                }
            }
            if (100 * best_cnt < (int64_t) min_pct[s] * p.sum) continue;
            return best;
        }
        return -1;
    }

    static int32_t try_static(const Part * ps) {
        if (ps == nullptr) return -1;
        if (ps->sum < MIN_SAMPLE_LAX[NG_STATIC - 1]) return -1;
        if (100 * (int64_t) ps->max_cnt < (int64_t) MIN_PERCENT_LAX[NG_STATIC - 1] * ps->sum) {
            return -1;
        }
        return ps->max_tok;
    }

    // common_ngram_cache_draft over the sequence h[0:H] + last + out; appends to out
    static void draft(const int32_t * h, int H, int32_t last, int n_draft, int kmin, int kmax,
                      const Cache & ctx, const Cache & dyn, const Cache & sta, int32_t n_vocab,
                      std::vector<int32_t> & out) {
        if (H + 1 < NG_STATIC) return;
        NGram grams[NG_MAX];
        int sizes[NG_MAX];
        while ((int) out.size() < n_draft) {
            const int total = H + 1 + (int) out.size();
            auto tok = [&](int i) -> int32_t {
                return i < H ? h[i] : (i == H ? last : out[i - H - 1]);
            };
            NGram gs;
            for (int i = 0; i < NG_MAX; ++i) {
                gs.t[i] = i < NG_STATIC ? tok(total - NG_STATIC + i) : -1;
            }
            const Part * ps = nullptr;
            if (!sta.map.empty()) {
                auto it = sta.map.find(gs);
                if (it != sta.map.end()) ps = &it->second;
            }
            int n = 0;
            for (int k = kmin; k <= kmax && k <= total; ++k) {
                for (int i = 0; i < NG_MAX; ++i) grams[n].t[i] = i < k ? tok(total - k + i) : -1;
                sizes[n++] = k;
            }
            int32_t t = try_primary(ctx, grams, sizes, n, ps, MIN_SAMPLE_LAX, MIN_PERCENT_LAX);
            if (t < 0) {
                t = try_primary(dyn, grams, sizes, n, ps, MIN_SAMPLE_STRICT, MIN_PERCENT_STRICT);
            }
            if (t < 0) t = try_static(ps);
            if (t < 0 || (n_vocab > 0 && t >= n_vocab)) break;
            out.push_back(t);
        }
    }

    }  // namespace specdec_ngc
    """
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
        self.static_path = static_path or None
        self.dynamic_path = dynamic_path or None
        if self.static_path is not None:
            _load_into(self.sta, self.static_path)
        if self.dynamic_path is not None and os.path.exists(self.dynamic_path):
            self.load(self.dynamic_path)

    cdef int _seq(self, int seq) except -1:
        self._grow(seq)
        cdef size_t n = self.hist.size()
        if self.ctx.size() < n:
            self.ctx.resize(n)
            self.ctx_upto.resize(n, 0)
            self.merged_upto.resize(n, 0)
            self.pend_pos.resize(n, -1)
            self.pend_tok.resize(n, -1)
        return 0

    # --- hooks ------------------------------------------------------------------------

    cdef int begin_c(self, int seq, const int32_t * toks, int n) except -1:
        self._seq(seq)
        self.dyn.epoch += 1
        self._flush_seq(seq)          # the finished request feeds the dynamic cache
        self._evict()
        self.ctx[seq].clear()
        self.ctx_upto[seq] = 0
        self.merged_upto[seq] = 0
        self.pend_pos[seq] = -1
        Drafter.begin_c(self, seq, toks, n)
        return 0

    cdef int observe_c(self, int seq, const int32_t * toks, int n, int row0) except -1:
        Drafter.observe_c(self, seq, toks, n, row0)
        self._seq(seq)
        self._sync(seq)
        return 0

    cdef int reset_c(self, int seq) except -1:
        """Forget the sequence's context without merging it (the dynamic cache stays)."""
        Drafter.reset_c(self, seq)
        if seq < <int>self.ctx.size():
            self.ctx[seq].clear()
            self.ctx_upto[seq] = 0
            self.merged_upto[seq] = 0
            self.pend_pos[seq] = -1
        return 0

    cdef int propose_c(self, int seq, int32_t last, int n_max, Draft out) except -1:
        out.clear()
        if n_max <= 0:
            return 0
        self._seq(seq)
        self._sync(seq)
        cdef vector[int32_t] * h = &self.hist[seq]
        cdef int H = h.size()
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

    cdef void _sync(self, int seq) noexcept:
        """Count the newly observed tokens into the context cache; settle the pending
        token counted by propose (kept when it is what arrived, else taken back)."""
        cdef vector[int32_t] * h = &self.hist[seq]
        cdef int H = h.size(), pos, p = self.pend_pos[seq]
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

    cdef void _flush_seq(self, int seq) noexcept:
        if not self.update_dynamic:
            return
        cdef vector[int32_t] * h = &self.hist[seq]
        cdef int pos
        for pos in range(self.merged_upto[seq], self.ctx_upto[seq]):
            ngc_add_ending_at(self.dyn, h.data(), pos, h[0][pos], self.ngram_min, self.ngram_max, 1)
        if self.ctx_upto[seq] > self.merged_upto[seq]:
            self.merged_upto[seq] = self.ctx_upto[seq]

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


register("ngram-cache")(NgramCacheDrafter)
