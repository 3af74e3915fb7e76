/* Passes over a row of logits for the sampling distribution (_sampling.pyx).

   Why: a row is the whole vocabulary (262k floats for Gemma), and a sampled token
   used to pay a scalar exp and a sort over all of it (~34 ms). These kernels make
   each pass one vectorised sweep: the maximum, an exp-sum, and the dense weights of a
   full-vocabulary distribution with per-block sums for an O(n/B + B) draw. The
   sparse distribution's candidate sets are cut by _candidates.h on the same types.

   Written with GCC/Clang vector extensions: one source that compiles to AVX-512,
   AVX2, SSE or NEON, whichever -march allows (SPECDEC_VL follows it). exp follows
   ggml's ggml_v_expf (the ARM optimized-routines polynomial, max error 1.5 ulp) for
   arguments in [-87, 0]. */
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

/* lanes per vector: the widest the target ISA has (a wider generic vector is lowered
   through memory, about 8x slower) */
#if defined(__AVX512F__)
#define SPECDEC_VL 16
#elif defined(__AVX__)
#define SPECDEC_VL 8
#else
#define SPECDEC_VL 4
#endif
#define SPECDEC_BLOCK 1024 /* tokens per block sum of a dense distribution */

typedef float specdec_vf __attribute__((vector_size(SPECDEC_VL * 4)));
typedef int32_t specdec_vi __attribute__((vector_size(SPECDEC_VL * 4)));

static inline specdec_vf specdec_load(const float * p) {
    specdec_vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline specdec_vf specdec_splat(float x) {
    specdec_vf v;
    for (int k = 0; k < SPECDEC_VL; ++k) v[k] = x;
    return v;
}

/* lanes of a where m is set, else b (m: a comparison's all-ones / zero lanes) */
static inline specdec_vf specdec_select(specdec_vi m, specdec_vf a, specdec_vf b) {
    return (specdec_vf)(((specdec_vi)a & m) | ((specdec_vi)b & ~m));
}

static inline float specdec_hsum(specdec_vf v) {
    float s = 0.0f;
    for (int k = 0; k < SPECDEC_VL; ++k) s += v[k];
    return s;
}

/* exp(x) for x <= 0; below -87 it returns exp(-87) (~1.6e-38): callers mask those */
static inline specdec_vf specdec_vexp(specdec_vf x) {
    const specdec_vf lo = specdec_splat(-87.0f);
    x = specdec_select(x < lo, lo, x);
    const specdec_vf r = specdec_splat(0x1.8p23f);
    const specdec_vf z = x * 0x1.715476p+0f + r;
    const specdec_vf n = z - r;
    const specdec_vf b = x - n * 0x1.62e4p-1f - n * 0x1.7f7d1cp-20f;
    const specdec_vi e = (specdec_vi)z << 23;
    const specdec_vf k = (specdec_vf)(e + 0x3f800000);
    const specdec_vf u = b * b;
    const specdec_vf j = ((0x1.0e4020p-7f * b + 0x1.573e2ep-5f) * u + (0x1.555e66p-3f * b + 0x1.fffdb6p-2f)) * u
                         + 0x1.ffffecp-1f * b;
    return k + k * j;
}

static inline float specdec_expf_neg(float x) {
    return expf(x < -87.0f ? -87.0f : x);
}

/* largest value (NaN never wins); -INFINITY when there is none */
static float specdec_max(const float * x, int n) {
    specdec_vf vm = specdec_splat(-INFINITY);
    int i = 0;
    for (; i + SPECDEC_VL <= n; i += SPECDEC_VL) {
        const specdec_vf v = specdec_load(x + i);
        vm = specdec_select(v > vm, v, vm);
    }
    float m = -INFINITY;
    for (int k = 0; k < SPECDEC_VL; ++k) if (vm[k] > m) m = vm[k];
    for (; i < n; ++i) if (x[i] > m) m = x[i];
    return m;
}

/* sum of exp(x - mx) over x >= floor_ */
static double specdec_exp_sum(const float * x, int n, float mx, float floor_) {
    double z = 0.0;
    int i = 0;
    const specdec_vf vfl = specdec_splat(floor_);
    while (i + SPECDEC_VL <= n) {
        specdec_vf acc = specdec_splat(0.0f);
        const int end = (n - i) / SPECDEC_VL > 64 ? i + 64 * SPECDEC_VL : n - (n - i) % SPECDEC_VL;
        for (; i < end; i += SPECDEC_VL) {
            const specdec_vf v = specdec_load(x + i);
            acc += (specdec_vf)((specdec_vi)specdec_vexp(v - mx) & (v >= vfl));
        }
        z += specdec_hsum(acc);
    }
    for (; i < n; ++i) if (x[i] >= floor_) z += specdec_expf_neg(x[i] - mx);
    return z;
}

/* w[i] = exp((x[i] - mx) * inv_t) for x[i] >= floor_, else 0; blocks[b] = the sum of
   w over block b (SPECDEC_BLOCK tokens); returns the total */
static double specdec_dense(const float * x, int n, float mx, float floor_, float inv_t, float * w,
                            double * blocks) {
    const specdec_vf vfl = specdec_splat(floor_);
    double z = 0.0;
    int i = 0, b = 0;
    while (i < n) {
        const int end = i + SPECDEC_BLOCK < n ? i + SPECDEC_BLOCK : n;
        specdec_vf acc = specdec_splat(0.0f);
        double s = 0.0;
        for (; i + SPECDEC_VL <= end; i += SPECDEC_VL) {
            const specdec_vf v = specdec_load(x + i);
            const specdec_vf e = (specdec_vf)((specdec_vi)specdec_vexp((v - mx) * inv_t) & (v >= vfl));
            memcpy(w + i, &e, sizeof e);
            acc += e;
        }
        for (; i < end; ++i) {
            w[i] = x[i] >= floor_ ? specdec_expf_neg((x[i] - mx) * inv_t) : 0.0f;
            s += w[i];
        }
        s += specdec_hsum(acc);
        blocks[b++] = s;
        z += s;
    }
    return z;
}

/* The id where the running sum of w first exceeds u (0 <= u < the total of blocks),
   scanning block sums first; a u past every sum (rounding) gives the last id with
   weight. Returns -1 when no weight is positive. */
static int specdec_draw(const float * w, int n, const double * blocks, double u) {
    const int nb = (n + SPECDEC_BLOCK - 1) / SPECDEC_BLOCK;
    int b = 0;
    double c = 0.0;
    for (; b < nb; ++b) {
        if (blocks[b] > 0.0 && u < c + blocks[b]) break;
        c += blocks[b] > 0.0 ? blocks[b] : 0.0;
    }
    if (b < nb) {
        const int end = (b + 1) * SPECDEC_BLOCK < n ? (b + 1) * SPECDEC_BLOCK : n;
        for (int i = b * SPECDEC_BLOCK; i < end; ++i) {
            c += w[i];
            if (u < c && w[i] > 0.0f) return i;
        }
        for (int i = end - 1; i >= b * SPECDEC_BLOCK; --i) if (w[i] > 0.0f) return i;
    }
    for (int i = n - 1; i >= 0; --i) if (w[i] > 0.0f) return i;
    return -1;
}
