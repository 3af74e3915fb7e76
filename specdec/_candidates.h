/* The candidate set of a sparse sampling distribution (_sampling.pyx), found without
   sorting the vocabulary.

   Why: top-k and top-p keep a few tokens of a 262k-token row. Sorting the row, or the
   thousands of tokens above a coarse threshold, cost about ten times greedy's argmax per
   token. As llama.cpp's sampler chain does, the set is cut by a partial selection:

   - top-k: one pass keeps the tokens above a running threshold (the k-th best so far),
     an nth_element compacting the buffer when it fills;
   - top-p: the pass that sums the row's mass collects the tokens above a guessed
     threshold; a quickselect on mass then finds the smallest top set that reaches
     p of it, sorting only the last few candidates.

   One order everywhere: a larger logit first, equal logits by lower id (the rule the
   tests' numpy reference and the old full sort follow), so ties at a cut are decided
   as a stable sort of the vocabulary would decide them. */
#pragma once

#include <algorithm>
#include <vector>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "_logit_kernels.h"

struct specdec_cand {
    float x;      /* the logit */
    int32_t id;
    double w;     /* exp(x - max) (temperature 1), once computed */
};

static inline bool specdec_before(const specdec_cand & a, const specdec_cand & b) {
    return a.x > b.x || (a.x == b.x && a.id < b.id);
}

#define SPECDEC_SPAN (4 * SPECDEC_VL)   /* tokens per test of a pass that collects */

/* whether any lane of a comparison's mask is set: a mask test where the ISA has one
   (the generic OR of 16 lanes costs as much as the pass's arithmetic) */
static inline int specdec_any(specdec_vi m) {
#if defined(__AVX512F__) && SPECDEC_VL == 16
    __m512i v;
    memcpy(&v, &m, sizeof v);
    return _mm512_test_epi32_mask(v, v) != 0;
#elif defined(__AVX__) && SPECDEC_VL == 8
    __m256 a;
    memcpy(&a, &m, sizeof a);
    return _mm256_movemask_ps(a) != 0;
#else
    int any = 0;
    for (int k = 0; k < SPECDEC_VL; ++k) any |= m[k];
    return any;
#endif
}

/* lane-wise maximum; a NaN lane takes the other operand's value, so a NaN never hides a
   token of its span */
/* Whether any of x[0..SPECDEC_SPAN) is >= t (a NaN never is): a span is tested once */
static inline int specdec_span_any_ge(const float * x, specdec_vf t) {
    return specdec_any((specdec_load(x) >= t) | (specdec_load(x + SPECDEC_VL) >= t)
                       | (specdec_load(x + 2 * SPECDEC_VL) >= t) | (specdec_load(x + 3 * SPECDEC_VL) >= t));
}

/* Appends the tokens of x[i0..i1) in [lo, hi) (> lo when strict) to c: the rare path of
   a pass, kept out of line so the pass's loop stays in registers */
__attribute__((noinline)) static void specdec_append(const float * x, int i0, int i1, float lo,
                                                     bool strict, float hi,
                                                     std::vector<specdec_cand> & c) {
    for (int i = i0; i < i1; ++i)
        if ((x[i] > lo || (!strict && x[i] == lo)) && x[i] < hi) c.push_back(specdec_cand{x[i], i, 0.0});
}

/* The k best tokens of x[0..n) (by specdec_before) among those >= floor_, into c, in no
   particular order; fewer when fewer reach floor_. One pass: a token enters the buffer
   only above the k-th best seen so far; ids come in increasing order, so a later token
   equal to that k-th one ranks after it and stays out. */
static void specdec_top_k(const float * x, int n, int k, float floor_,
                          std::vector<specdec_cand> & c) {
    const size_t cap = (size_t)(4 * k > 2048 ? 4 * k : 2048);
    c.clear();
    float theta = floor_;
    bool strict = false;   /* >= floor_ until the first cut, then > the k-th best */
    specdec_vf vt = specdec_splat(theta);
    int i = 0;
    for (; i + SPECDEC_SPAN <= n; i += SPECDEC_SPAN) {
        if (!specdec_span_any_ge(x + i, vt)) continue;
        specdec_append(x, i, i + SPECDEC_SPAN, theta, strict, INFINITY, c);
        if (c.size() >= cap) {
            std::nth_element(c.begin(), c.begin() + (k - 1), c.end(), specdec_before);
            c.resize(k);
            theta = c[k - 1].x;   /* the k - 1 before it rank ahead: none is smaller */
            strict = true;
            vt = specdec_splat(theta);
        }
    }
    specdec_append(x, i, n, theta, strict, INFINITY, c);
    if (c.size() > (size_t)k) {
        std::nth_element(c.begin(), c.begin() + (k - 1), c.end(), specdec_before);
        c.resize(k);
    }
}

/* The sum of exp(x - mx) over x >= floor_ (as specdec_exp_sum), and the tokens
   x >= theta appended to c, in one pass. */
static double specdec_mass_collect(const float * x, int n, float mx, float floor_, float theta,
                                   std::vector<specdec_cand> & c) {
    double z = 0.0;
    int i = 0;
    const specdec_vf vfl = specdec_splat(floor_), vt = specdec_splat(theta);
    while (i + SPECDEC_SPAN <= n) {
        specdec_vf acc = specdec_splat(0.0f);
        /* float lanes summed over at most 1024 tokens at a time, then in double */
        const int end = (n - i) / SPECDEC_SPAN > 16 ? i + 16 * SPECDEC_SPAN : n - (n - i) % SPECDEC_SPAN;
        for (; i < end; i += SPECDEC_SPAN) {
            for (int j = 0; j < SPECDEC_SPAN; j += SPECDEC_VL) {
                const specdec_vf v = specdec_load(x + i + j);
                acc += (specdec_vf)((specdec_vi)specdec_vexp(v - mx) & (v >= vfl));
            }
            if (specdec_span_any_ge(x + i, vt))
                specdec_append(x, i, i + SPECDEC_SPAN, theta, false, INFINITY, c);
        }
        z += specdec_hsum(acc);
    }
    for (; i < n; ++i) {
        if (x[i] >= floor_) z += specdec_expf_neg(x[i] - mx);
        if (x[i] >= theta) c.push_back(specdec_cand{x[i], i, 0.0});
    }
    return z;
}

/* The tokens lo <= x < hi appended to c (a collection widened below an earlier lo). */
static void specdec_collect_band(const float * x, int n, float lo, float hi,
                                 std::vector<specdec_cand> & c) {
    const specdec_vf vlo = specdec_splat(lo);
    int i = 0;
    for (; i + SPECDEC_SPAN <= n; i += SPECDEC_SPAN)
        if (specdec_span_any_ge(x + i, vlo))
            specdec_append(x, i, i + SPECDEC_SPAN, lo, false, hi, c);
    specdec_append(x, i, n, lo, false, hi, c);
}

/* w = exp(x - mx) for each candidate, with the vectorised exp the row's mass was summed
   with (so a candidate set and the row agree on every token's weight); returns their sum. */
static double specdec_weigh(specdec_cand * c, int m, float mx) {
    double s = 0.0;
    float buf[SPECDEC_VL];
    for (int i = 0; i < m; i += SPECDEC_VL) {
        const int e = m - i < SPECDEC_VL ? m - i : SPECDEC_VL;
        for (int l = 0; l < SPECDEC_VL; ++l) buf[l] = l < e ? c[i + l].x - mx : 0.0f;
        specdec_vf w = specdec_vexp(specdec_load(buf));
        for (int l = 0; l < e; ++l) {
            c[i + l].w = w[l];
            s += w[l];
        }
    }
    return s;
}

/* Reorders c[0..m) so that its first r entries are the smallest top set (by
   specdec_before) whose weight w reaches need, and returns r; -1 when all of c does not
   reach it. Quickselect on mass: each partition keeps the side the cut is in, so the
   work is O(m) and only the last few candidates are sorted. */
static int specdec_nucleus(specdec_cand * c, int m, double need) {
    int lo = 0, hi = m;
    double acc = 0.0;   /* the weight of c[0..lo), all of it kept */
    while (hi - lo > 24) {
        /* median of three by order, moved to hi - 1 */
        const int mid = lo + (hi - lo) / 2;
        if (specdec_before(c[mid], c[lo])) std::swap(c[mid], c[lo]);
        if (specdec_before(c[hi - 1], c[lo])) std::swap(c[hi - 1], c[lo]);
        if (specdec_before(c[mid], c[hi - 1])) std::swap(c[mid], c[hi - 1]);
        const specdec_cand p = c[hi - 1];
        int a = lo;
        double left = 0.0;
        for (int i = lo; i < hi - 1; ++i) {
            if (specdec_before(c[i], p)) {
                left += c[i].w;
                std::swap(c[i], c[a++]);
            }
        }
        std::swap(c[a], c[hi - 1]);
        if (acc + left >= need) {
            hi = a;
        } else if (acc + left + c[a].w >= need) {
            return a + 1;
        } else {
            acc += left + c[a].w;
            lo = a + 1;
        }
    }
    std::sort(c + lo, c + hi, specdec_before);
    for (int i = lo; i < hi; ++i) {
        acc += c[i].w;
        if (acc >= need) return i + 1;
    }
    return -1;
}
