// The n-gram caches of the ngram-cache drafter (llama.cpp's common/ngram-cache.cpp):
// counts per n-gram, thresholds, llama.cpp's file format, and the draft loop.
// Declared to Cython in ngram_cache.pyx; everything is inline in namespace specdec_ngc.
#pragma once

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
            // counted in bytes: a record cut anywhere, even inside its first int32, is bad
            size_t got = std::fread(head, 1, sizeof(head), f);
            if (got == 0 && std::feof(f)) break;
            if (got != sizeof(head)) { rc = -1; break; }
            NGram g;
            int k = 0;
            while (k < NG_MAX && head[k] >= 0) { g.t[k] = head[k]; ++k; }
            bool valid = k >= 1 && head[NG_MAX] > 0;
            for (int i = k; i < NG_MAX; ++i) { g.t[i] = -1; valid = valid && head[i] == -1; }
            if (!valid) { rc = -1; break; }
            off += (NG_MAX + 1) * sizeof(int32_t);
            for (int32_t i = 0; i < head[NG_MAX]; ++i) {
                if (std::fread(pair, 1, sizeof(pair), f) != sizeof(pair)
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
