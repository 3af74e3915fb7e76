// Lazy LM head for a target context: the verify decode stops after the final norm, and the
// logits of a row are computed only when the controller reaches it.
//
// Why: on a small-trunk, big-vocabulary model (Gemma 3 270M: 640 wide, 262k tokens) the LM
// head is most of a decode, and llama.cpp computes it for every output row of a verify batch
// with tinyBLAS, which on this CPU costs ~4 ms per row. Greedy verification stops at the first
// rejected draft, so the rows after it are wasted; and the rows it does need can share one
// pass over the weights: each weight row is read once and dotted with every hidden row while
// it sits in L1.
//
// Exactness: every logit is ggml's own ``vec_dot`` of the weight row with the hidden row
// quantized by ggml's own ``from_float`` of the weight's ``vec_dot_type``: the very code path
// llama.cpp takes for a one-row LM head (tinyBLAS refuses fewer than two rows), so a row's
// logits are bit-identical to those of a plain one-token decode of the same hidden state.
//
// How: llama.cpp's scheduler calls ``cb_eval`` for every graph node. We ask for the node
// named ``result_norm`` and return false after it, which ends the graph there (the scheduler's
// documented early exit). The weight comes from the ``result_output`` node of a normal decode
// (the first one), checked to be a plain MUL_MAT of the norm by a host, non-repacked weight.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define SD_FUSED_Q8_0 1
// A Q8_0 weight row against up to SD_FUSED_ROWS hidden rows at once: the same instructions,
// in the same order, as ggml's x86 ggml_vec_dot_q8_0_q8_0 (arch/x86/quants.c, same ISA macros)
// for each pair, so each logit is bit-identical; the weight block is loaded, its absolute
// value and scale computed once for all rows. Checked against vec_dot at first use.
#define SD_FUSED_ROWS 8
struct sd_block_q8_0 { uint16_t d; int8_t qs[32]; };
static_assert(sizeof(sd_block_q8_0) == 34, "block_q8_0 layout");

static inline float sd_hsum_float_8(const __m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

static inline __m256 sd_mul_sum_i8_pairs_float(const __m256i x, const __m256i ax, const __m256i y) {
#if __AVXVNNIINT8__
    (void) ax;
    return _mm256_cvtepi32_ps(_mm256_dpbssd_epi32(_mm256_setzero_si256(), x, y));
#else
    const __m256i sy = _mm256_sign_epi8(y, x);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy));
#elif defined(__AVXVNNI__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy));
#else
    const __m256i dot = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot));
#endif
#endif
}

// out[j][v] for v in [v0, v1), j < NR; ys[j] are Q8_0 rows of nb blocks, yd their scales as
// fp32 (fp16 -> fp32 is exact, so converting once changes no bit). NR is a template argument
// so that the accumulators stay in registers.
template <int NR>
static void sd_fused_q8_0_n(const char * w, size_t w_row, int64_t v0, int64_t v1, int nb,
                            const void * const * ys, const float * yd, float * const * out) {
    for (int64_t v = v0; v < v1; ++v) {
        const sd_block_q8_0 * x = (const sd_block_q8_0 *) (w + (size_t) v * w_row);
        __m256 acc[NR];
        for (int j = 0; j < NR; ++j) acc[j] = _mm256_setzero_ps();
        for (int ib = 0; ib < nb; ++ib) {
            const float xd = _cvtsh_ss(x[ib].d);
            const __m256i qx = _mm256_loadu_si256((const __m256i *) x[ib].qs);
            const __m256i ax = _mm256_sign_epi8(qx, qx);
            for (int j = 0; j < NR; ++j) {
                const sd_block_q8_0 * y = (const sd_block_q8_0 *) ys[j] + ib;
                const __m256 d = _mm256_set1_ps(xd * yd[(size_t) j * nb + ib]);
                const __m256i qy = _mm256_loadu_si256((const __m256i *) y->qs);
                acc[j] = _mm256_fmadd_ps(d, sd_mul_sum_i8_pairs_float(qx, ax, qy), acc[j]);
            }
        }
        for (int j = 0; j < NR; ++j) out[j][v] = sd_hsum_float_8(acc[j]);
    }
}

// the fp32 scales of nr Q8_0 rows of n values (yd[j * (n / 32) + ib]), read once per pass
static void sd_q8_0_scales(const void * const * ys, int nr, int n, float * yd) {
    const int nb = n / 32;
    for (int j = 0; j < nr; ++j)
        for (int ib = 0; ib < nb; ++ib) yd[(size_t) j * nb + ib] = _cvtsh_ss(((const sd_block_q8_0 *) ys[j])[ib].d);
}

// f(std::integral_constant<int, c>) for c = min(max(n, 1), 8): a run-time count of rows (or of
// pairs) handed to a kernel whose count is a template argument (its accumulators in registers)
template <typename F>
static inline void sd_rows_dispatch(int n, F && f) {
    switch (n) {
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 7: f(std::integral_constant<int, 7>{}); break;
        default: f(std::integral_constant<int, 8>{}); break;
    }
}

// out[j][v] for v in [v0, v1), j < nr (nr <= SD_FUSED_ROWS); ys[j] are Q8_0 rows of n
// values, yd their scales (sd_q8_0_scales)
static void sd_fused_q8_0(const char * w, size_t w_row, int64_t v0, int64_t v1, int n,
                          const void * const * ys, const float * yd, float * const * out, int nr) {
    const int nb = n / 32;
    sd_rows_dispatch(nr, [&](auto k) { sd_fused_q8_0_n<decltype(k)::value>(w, w_row, v0, v1, nb, ys, yd, out); });
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && !__AVXVNNIINT8__
// Two hidden rows per 512-bit register: the low half does row j's arithmetic and the high
// half row j+1's, each exactly as the 256-bit kernel above (the same per-lane dpbusd of
// |x| and y signed by x, the same fp32 scale products, the same fmadd chain, the same final
// sum of 8), so each logit keeps vec_dot's bits, and a weight block is loaded, its |x| and
// sign taken, once for 2 * NP rows. Where 512-bit vectors run at full width (Intel Xeons),
// a pass over many rows takes about half the 256-bit kernel's instructions.
#define SD_FUSED_PAIRS 1
template <int NP>
static void sd_fused_q8_0_pairs_n(const char * w, size_t w_row, int64_t v0, int64_t v1, int nb,
                                  const void * const * ys, const float * ydp, float * const * out) {
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t v = v0; v < v1; ++v) {
        const sd_block_q8_0 * x = (const sd_block_q8_0 *) (w + (size_t) v * w_row);
        __m512 acc[NP];
        for (int p = 0; p < NP; ++p) acc[p] = _mm512_setzero_ps();
        for (int ib = 0; ib < nb; ++ib) {
            const __m512 xd = _mm512_set1_ps(_cvtsh_ss(x[ib].d));
            const __m512i qx = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) x[ib].qs));
            const __m512i ax = _mm512_abs_epi8(qx);
            const __mmask64 neg = _mm512_movepi8_mask(qx);
            for (int p = 0; p < NP; ++p) {
                const sd_block_q8_0 * y0 = (const sd_block_q8_0 *) ys[2 * p] + ib;
                const sd_block_q8_0 * y1 = (const sd_block_q8_0 *) ys[2 * p + 1] + ib;
                const __m512i qy = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) y0->qs)),
                    _mm256_loadu_si256((const __m256i *) y1->qs), 1);
                // y signed by x: -y where x < 0 (where x == 0, |x| is 0 and so is the product)
                const __m512i sy = _mm512_mask_sub_epi8(qy, neg, zero, qy);
                const __m512 d = _mm512_mul_ps(xd, _mm512_loadu_ps(ydp + ((size_t) p * nb + ib) * 16));
                acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, ax, sy)), acc[p]);
            }
        }
        for (int p = 0; p < NP; ++p) {
            out[2 * p][v] = sd_hsum_float_8(_mm512_castps512_ps256(acc[p]));
            out[2 * p + 1][v] = sd_hsum_float_8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p]), 1)));
        }
    }
}

// the pair kernel's scales: ydp[p * nb + ib] holds row 2p's scale of block ib in its low
// half and row 2p+1's in its high half, 16 floats each (yd as sd_q8_0_scales gives them)
static void sd_q8_0_pair_scales(const float * yd, int nr, int nb, float * ydp) {
    for (int p = 0; p < nr / 2; ++p)
        for (int ib = 0; ib < nb; ++ib)
            for (int l = 0; l < 16; ++l)
                ydp[((size_t) p * nb + ib) * 16 + l] = yd[(size_t) (2 * p + l / 8) * nb + ib];
}

// out[j][v] for v in [v0, v1), j < nr (nr <= 2 * SD_FUSED_ROWS): the pairs of rows with the
// pair kernel, an odd last row with the 256-bit one; ydp: sd_q8_0_pair_scales of the rows
static void sd_fused_q8_0_pairs(const char * w, size_t w_row, int64_t v0, int64_t v1, int n,
                                const void * const * ys, const float * yd, const float * ydp,
                                float * const * out, int nr) {
    const int nb = n / 32;
    if (nr >= 2)
        sd_rows_dispatch(nr / 2, [&](auto k) { sd_fused_q8_0_pairs_n<decltype(k)::value>(w, w_row, v0, v1, nb, ys, ydp, out); });
    if (nr % 2) {
        const int j = nr - 1;
        sd_fused_q8_0_n<1>(w, w_row, v0, v1, nb, ys + j, yd + (size_t) j * nb, out + j);
    }
}
#define SD_GROUP_ROWS (2 * SD_FUSED_ROWS)
#else
#define SD_GROUP_ROWS SD_FUSED_ROWS
#endif

// Weight rows per tile of a fused pass over more than SD_GROUP_ROWS hidden rows: each group
// of hidden rows passes over the tile while it sits in L2 (128 rows of Gemma's 640-wide
// Q8_0 head: 87 KB, within the smallest L2 of current x86 cores), so the head is read from
// memory once per pass, not once per group: a 17-row verify read Gemma's 178 MB head 3 times.
#define SD_HEAD_TILE 128

// the scales a pass's groups read: yd (sd_q8_0_scales), and for the pair kernel ydp, the
// pairs of each group of SD_GROUP_ROWS rows (sd_q8_0_pair_scales)
struct sd_fused_scales {
    std::vector<float> yd;
#ifdef SD_FUSED_PAIRS
    std::vector<float> ydp;
#endif
    void set(const void * const * ys, int nr, int n) {
        const int nb = n / 32;
        yd.resize((size_t) nr * nb);
        sd_q8_0_scales(ys, nr, n, yd.data());
#ifdef SD_FUSED_PAIRS
        ydp.resize((size_t) (nr / 2) * nb * 16);     // group j0's pairs from pair j0 / 2
        for (int j0 = 0; j0 < nr; j0 += SD_GROUP_ROWS) {
            const int c = nr - j0 < SD_GROUP_ROWS ? nr - j0 : SD_GROUP_ROWS;
            sd_q8_0_pair_scales(yd.data() + (size_t) j0 * nb, c, nb, ydp.data() + (size_t) (j0 / 2) * nb * 16);
        }
#endif
    }
};

// out[j][v] for v in [v0, v1) and rows j0 .. j0 + c - 1 of a pass (c <= SD_GROUP_ROWS, j0 a
// multiple of it), whose scales are sc
static void sd_fused_group(const char * w, size_t w_row, int64_t v0, int64_t v1, int n,
                           const void * const * ys, const sd_fused_scales & sc, float * const * out,
                           int j0, int c) {
    const int nb = n / 32;
#ifdef SD_FUSED_PAIRS
    sd_fused_q8_0_pairs(w, w_row, v0, v1, n, ys + j0, sc.yd.data() + (size_t) j0 * nb,
                        sc.ydp.data() + (size_t) (j0 / 2) * nb * 16, out + j0, c);
#else
    sd_fused_q8_0(w, w_row, v0, v1, n, ys + j0, sc.yd.data() + (size_t) j0 * nb, out + j0, c);
#endif
}
#endif

struct sd_lm_head {
    // set by the owner
    bool enabled = false;   // stop decodes at the norm when we can
    bool batch_invariant = false;   // exact mode: serve only where llama.cpp's head agrees
    bool active = false;    // this decode: stop at the norm (set before each llama_decode)
    bool grammar = false;   // while not enabled, still serve decodes that hold a grammar's
                            // rows (the owner sets active for them): see Context.set_lazy_head
    int upto = 0;           // while not enabled, still serve decodes of at most this many
                            // output rows (where the lazy head is the faster one for them)
    int n_threads = 1;
    // discovered from the first normal decode: 0 unknown, 1 usable, -1 unusable
    int state = 0;
    const char * why = "";  // why unusable
    const ggml_tensor * norm_seen = nullptr;
    const char * w_data = nullptr;
    size_t w_row = 0;       // bytes per weight row
    int64_t n_embd = 0, n_vocab = 0;
    ggml_from_float_t from_float = nullptr;
    ggml_vec_dot_t vec_dot = nullptr;
    size_t q_row = 0;       // bytes per quantized hidden row
    int fused = 0;          // fused Q8_0 kernel: 0 untested, 1 bit-identical to vec_dot, -1 off
    bool is_q8_0 = false;
    // outputs of the last active decode
    int n_rows = 0;         // hidden rows captured
    bool captured = false;
    std::vector<float> hidden;      // n_rows x n_embd
    std::vector<uint8_t> q;         // n_rows x q_row
    std::vector<float> logits;      // n_rows x n_vocab
    std::vector<uint8_t> done;      // per row: logits computed
    long long n_masked = 0;         // rows computed for a grammar's allowed tokens only
    long long n_passes = 0;         // passes over the whole head (each reads every weight row)
    long long n_whole = 0;          // rows those passes computed
};

static inline void sd_lm_head_disable(sd_lm_head * h, const char * why) {
    h->state = -1;
    h->why = why;
}

// Exact mode: the decodes the lazy head cannot serve (KV streams per sequence, a batch over
// n_ubatch) keep llama.cpp's own head, whose kernel for 2 rows or more depends on the weight
// type (tinyBLAS takes F32, F16, Q8_0, Q4_0, ...; K-quants stay on vec_dot) and may round
// differently from the per-row vec_dot here, so the same row's logits would depend on how it
// was batched. The lazy head then serves a batch-invariant context only if ggml's batched
// matmul (reference kernels, as the context runs) gives its bits on some of the weight rows.
static bool sd_lm_head_matches_batched(const sd_lm_head * h, ggml_type type) {
    const int64_t m = h->n_vocab < 64 ? h->n_vocab : 64;
    const int nr = 3;
    const size_t w_bytes = (size_t) m * h->w_row;
    const size_t need = w_bytes + (size_t) nr * (h->n_embd + m) * sizeof(float) +
                        8 * ggml_tensor_overhead() + ggml_graph_overhead() + 1024;
    ggml_init_params ip = { need, nullptr, false };
    ggml_context * g = ggml_init(ip);
    if (g == nullptr) return false;
    ggml_tensor * w = ggml_new_tensor_2d(g, type, h->n_embd, m);
    ggml_tensor * x = ggml_new_tensor_2d(g, GGML_TYPE_F32, h->n_embd, nr);
    bool same = w->nb[1] == h->w_row;
    if (same) {
        memcpy(w->data, h->w_data, w_bytes);
        float * xd = (float *) x->data;
        uint32_t r = 12345;
        for (int64_t i = 0; i < nr * h->n_embd; ++i) {
            r = r * 1664525u + 1013904223u;
            xd[i] = (float) ((int32_t) (r >> 8) - (1 << 23)) / (float) (1 << 22);
        }
        ggml_tensor * y = ggml_mul_mat(g, w, x);
        ggml_cgraph * gf = ggml_new_graph(g);
        ggml_build_forward_expand(gf, y);
        ggml_backend_t cpu = ggml_backend_cpu_init();
        same = cpu != nullptr;
        if (same) {
            ggml_backend_cpu_set_use_ref(cpu, true);
            ggml_backend_cpu_set_n_threads(cpu, 1);
            same = ggml_backend_graph_compute(cpu, gf) == GGML_STATUS_SUCCESS;
            ggml_backend_free(cpu);
        }
        std::vector<uint8_t> q(h->q_row);
        for (int j = 0; same && j < nr; ++j) {
            const float * xj = xd + (size_t) j * h->n_embd;
            if (h->from_float) h->from_float(xj, q.data(), h->n_embd);
            const void * xv = h->from_float ? (const void *) q.data() : (const void *) xj;
            const float * yj = (const float *) y->data + (size_t) j * m;
            for (int64_t v = 0; same && v < m; ++v) {
                float o;
                h->vec_dot((int) h->n_embd, &o, 0, h->w_data + (size_t) v * h->w_row, 0, xv, 0, 1);
                same = memcmp(&o, &yj[v], sizeof(float)) == 0;
            }
        }
    }
    ggml_free(g);
    return same;
}

static void sd_lm_head_discover(sd_lm_head * h, const ggml_tensor * t) {
    if (t->op != GGML_OP_MUL_MAT) return sd_lm_head_disable(h, "the LM head is not a plain matmul (softcap, scale or LoRA)");
    const ggml_tensor * w = t->src[0];
    const ggml_tensor * x = t->src[1];
    if (h->norm_seen == nullptr || x != h->norm_seen) return sd_lm_head_disable(h, "the LM head does not read result_norm");
    if (x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x)) return sd_lm_head_disable(h, "result_norm is not contiguous F32");
    if (w->buffer == nullptr || !ggml_backend_buffer_is_host(w->buffer) || w->extra != nullptr || w->data == nullptr)
        return sd_lm_head_disable(h, "the output weight is not a plain host tensor (GPU or repacked)");
    if (w->ne[2] != 1 || w->ne[3] != 1 || w->nb[0] != ggml_type_size(w->type)) return sd_lm_head_disable(h, "the output weight is not 2-D");
    const ggml_type_traits_cpu * tw = ggml_get_type_traits_cpu(w->type);
    if (tw == nullptr || tw->vec_dot == nullptr) return sd_lm_head_disable(h, "no CPU dot product for the output weight's type");
    const ggml_type_traits_cpu * tq = ggml_get_type_traits_cpu(tw->vec_dot_type);
    if (tw->vec_dot_type != GGML_TYPE_F32 && (tq == nullptr || tq->from_float == nullptr))
        return sd_lm_head_disable(h, "no CPU quantizer for the output weight's dot type");
    if (w->ne[0] % ggml_blck_size(w->type) != 0 || w->ne[0] % ggml_blck_size(tw->vec_dot_type) != 0)
        return sd_lm_head_disable(h, "the embedding width is not a whole number of blocks");
    h->w_data = (const char *) w->data;
    h->w_row = w->nb[1];
    h->n_embd = w->ne[0];
    h->n_vocab = w->ne[1];
    h->vec_dot = tw->vec_dot;
    h->from_float = tw->vec_dot_type == GGML_TYPE_F32 ? nullptr : tq->from_float;
    h->q_row = ggml_row_size(tw->vec_dot_type, w->ne[0]);
    h->is_q8_0 = w->type == GGML_TYPE_Q8_0 && tw->vec_dot_type == GGML_TYPE_Q8_0;
    if (h->batch_invariant && !sd_lm_head_matches_batched(h, w->type))
        return sd_lm_head_disable(h, "exact mode: llama.cpp's head for 2+ rows rounds differently for this weight type");
    h->state = 1;
}

// whether any decode may stop at the norm: on for all, for a grammar's rows, or for short ones
static inline bool sd_lm_head_wanted(const sd_lm_head * h) {
    return h->enabled || h->grammar || h->upto > 0;
}

// the scheduler's eval callback (ggml_backend_sched_eval_callback)
static bool sd_lm_head_cb(ggml_tensor * t, bool ask, void * user_data) {
    sd_lm_head * h = (sd_lm_head *) user_data;
    // (off but serving a grammar's rows, the first decode finds the weight all the same)
    if (!sd_lm_head_wanted(h) || h->state < 0) return false;
    if (ask) {
        if (h->state == 0) {
            if (strcmp(t->name, "result_norm") == 0) h->norm_seen = t;
            else if (strcmp(t->name, "result_output") == 0) sd_lm_head_discover(h, t);
            return false;
        }
        return h->active && strcmp(t->name, "result_norm") == 0;
    }
    // result_norm is computed: keep its rows, end the graph here
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->ne[0] != h->n_embd || h->captured ||
        t->buffer == nullptr || !ggml_backend_buffer_is_host(t->buffer)) {
        return true;  // not what we expect: let the graph run on (the owner sees captured == false)
    }
    const int rows = (int) (t->ne[1] * t->ne[2] * t->ne[3]);
    h->hidden.resize((size_t) rows * h->n_embd);
    memcpy(h->hidden.data(), t->data, (size_t) rows * h->n_embd * sizeof(float));
    h->n_rows = rows;
    h->captured = true;
    return false;
}

// logits of the given rows that are not done yet, in one pass over the weights
static void sd_lm_head_compute_rows(sd_lm_head * h, const int * want, int n_want) {
    std::vector<int> rows;
    for (int i = 0; i < n_want; ++i) {
        const int r = want[i];
        if (r >= 0 && r < h->n_rows && !h->done[r]) {
            h->done[r] = 2;     // listed (a row asked twice is computed once)
            rows.push_back(r);
        }
    }
    if (rows.empty()) return;
    h->n_passes += 1;
    h->n_whole += (long long) rows.size();
    const int64_t n_embd = h->n_embd, n_vocab = h->n_vocab;
    const size_t q_row = h->q_row;
    for (int r : rows) {
        const float * x = h->hidden.data() + (size_t) r * n_embd;
        if (h->from_float) h->from_float(x, h->q.data() + (size_t) r * q_row, n_embd);
    }
    const int nr = (int) rows.size();
    std::vector<const void *> xs(nr);
    std::vector<float *> outs(nr);
    for (int j = 0; j < nr; ++j) {
        xs[j] = h->from_float ? (const void *) (h->q.data() + (size_t) rows[j] * q_row)
                              : (const void *) (h->hidden.data() + (size_t) rows[j] * n_embd);
        outs[j] = h->logits.data() + (size_t) rows[j] * n_vocab;
    }
    auto vec_dot_rows = [&](int64_t v0, int64_t v1) {
        for (int64_t v = v0; v < v1; ++v) {
            const void * wr = h->w_data + (size_t) v * h->w_row;
            for (int j = 0; j < nr; ++j) {
                h->vec_dot((int) n_embd, outs[j] + v, 0, wr, 0, xs[j], 0, 1);
            }
        }
    };
#ifdef SD_FUSED_Q8_0
    if (h->is_q8_0 && h->fused == 0) {
        // first use: the fused kernel must give vec_dot's bits exactly, else it stays off;
        // each row alone, and three rows as one group (a pair and an odd row where the pair
        // kernel runs)
        const int64_t m = n_vocab < 256 ? n_vocab : 256;
        std::vector<float> b((size_t) m), got((size_t) 3 * m);
        h->fused = 1;
        for (int j = 0; j < nr + 1 && h->fused == 1; ++j) {
            const bool three = j == nr;
            const void * tys[3] = {xs[three ? 0 : j], xs[nr - 1], xs[0]};
            const int c = three ? 3 : 1;
            float * touts[3] = {got.data(), got.data() + m, got.data() + 2 * m};
            sd_fused_scales tsc;
            tsc.set(tys, c, (int) n_embd);
            sd_fused_group(h->w_data, h->w_row, 0, m, (int) n_embd, tys, tsc, touts, 0, c);
            for (int i = 0; i < c && h->fused == 1; ++i) {
                for (int64_t v = 0; v < m; ++v) h->vec_dot((int) n_embd, &b[v], 0, h->w_data + (size_t) v * h->w_row, 0, tys[i], 0, 1);
                if (memcmp(touts[i], b.data(), (size_t) m * sizeof(float)) != 0) h->fused = -1;
            }
        }
    }
    const bool fused = h->is_q8_0 && h->fused == 1;
    sd_fused_scales sc;
    if (fused) sc.set(xs.data(), nr, (int) n_embd);
#else
    const bool fused = false;
#endif
    auto work = [&](int64_t v0, int64_t v1) {
#ifdef SD_FUSED_Q8_0
        if (fused) {
            const int64_t tile = nr > SD_GROUP_ROWS ? SD_HEAD_TILE : v1 - v0;
            for (int64_t t0 = v0; t0 < v1; t0 += tile) {
                const int64_t t1 = v1 - t0 > tile ? t0 + tile : v1;
                for (int j0 = 0; j0 < nr; j0 += SD_GROUP_ROWS) {
                    const int c = nr - j0 < SD_GROUP_ROWS ? nr - j0 : SD_GROUP_ROWS;
                    sd_fused_group(h->w_data, h->w_row, t0, t1, (int) n_embd, xs.data(), sc,
                                   outs.data(), j0, c);
                }
            }
            return;
        }
#endif
        (void) fused;
        vec_dot_rows(v0, v1);
    };
    const int nt = h->n_threads > 1 ? h->n_threads : 1;
    const int64_t chunk = (n_vocab + nt - 1) / nt;
#ifdef _OPENMP
    // ggml's own OpenMP team: its threads are still spinning from the decode, so they take
    // this work at once; threads of our own would fight them for the cores (2x slower here)
    #pragma omp parallel num_threads(nt)
    {
        const int64_t v0 = (int64_t) omp_get_thread_num() * chunk;
        const int64_t v1 = v0 + chunk < n_vocab ? v0 + chunk : n_vocab;
        if (v0 < v1) work(v0, v1);
    }
#else
    std::vector<std::thread> pool;
    for (int i = 1; i < nt; ++i) {
        const int64_t v0 = i * chunk, v1 = v0 + chunk < n_vocab ? v0 + chunk : n_vocab;
        if (v0 < v1) pool.emplace_back(work, v0, v1);
    }
    work(0, chunk < n_vocab ? chunk : n_vocab);
    for (auto & th : pool) th.join();
#endif
    for (int r : rows) h->done[r] = 1;
}

// tokens set in a mask of n_vocab bits (one bit per token id, 32 per word)
static inline int64_t sd_mask_count(const uint32_t * bits, int64_t n_vocab) {
    int64_t n = 0;
    const int64_t full = n_vocab / 32;
    for (int64_t j = 0; j < full; ++j) n += __builtin_popcount(bits[j]);
    if (n_vocab % 32) n += __builtin_popcount(bits[full] & ((1u << (n_vocab % 32)) - 1u));
    return n;
}

// Row r's logits for the tokens a grammar allows (``bits``), the others -inf; the row is
// then done. Under a grammar most rows allow a few tokens (a JSON key, punctuation, digits:
// often exactly one), and their logits are all verification reads: this costs one dot product
// per allowed token instead of a pass over the whole head. Each logit is the same vec_dot of
// the same quantized hidden row as a full pass's (the fused kernel gives vec_dot's bits), so
// the masked row is bit-identical to a full row with the mask applied.
static void sd_lm_head_compute_masked(sd_lm_head * h, int r, const uint32_t * bits) {
    if (r < 0 || r >= h->n_rows || h->done[r]) return;
    const int64_t n_embd = h->n_embd, n_vocab = h->n_vocab;
    const float * x = h->hidden.data() + (size_t) r * n_embd;
    uint8_t * q = h->q.data() + (size_t) r * h->q_row;
    if (h->from_float) h->from_float(x, q, n_embd);
    const void * xv = h->from_float ? (const void *) q : (const void *) x;
    float * out = h->logits.data() + (size_t) r * n_vocab;
    std::fill(out, out + n_vocab, -INFINITY);
    const int64_t n_words = (n_vocab + 31) / 32;
    for (int64_t j = 0; j < n_words; ++j) {
        uint32_t w = bits[j];
        while (w) {
            const int64_t v = j * 32 + __builtin_ctz(w);
            w &= w - 1;
            if (v < n_vocab) h->vec_dot((int) n_embd, out + v, 0, h->w_data + (size_t) v * h->w_row, 0, xv, 0, 1);
        }
    }
    h->done[r] = 1;
    h->n_masked += 1;
}

// logits of rows [r0, r1) that are not done yet, in one pass over the weights
static void sd_lm_head_compute(sd_lm_head * h, int r0, int r1) {
    std::vector<int> rows;
    for (int r = r0; r < r1; ++r) rows.push_back(r);
    sd_lm_head_compute_rows(h, rows.data(), (int) rows.size());
}

// size the outputs for an active decode of n_rows rows
static void sd_lm_head_begin(sd_lm_head * h) {
    h->captured = false;
    h->n_rows = 0;
}

static void sd_lm_head_end(sd_lm_head * h) {
    const size_t n = (size_t) h->n_rows;
    if (h->logits.size() < n * h->n_vocab) h->logits.resize(n * h->n_vocab);
    if (h->q.size() < n * h->q_row) h->q.resize(n * h->q_row);
    h->done.assign(n, 0);
}
