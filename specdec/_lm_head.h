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

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

struct sd_lm_head {
    // set by the owner
    bool enabled = false;   // stop decodes at the norm when we can
    bool active = false;    // this decode: stop at the norm (set before each llama_decode)
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
    // outputs of the last active decode
    int n_rows = 0;         // hidden rows captured
    bool captured = false;
    std::vector<float> hidden;      // n_rows x n_embd
    std::vector<uint8_t> q;         // n_rows x q_row
    std::vector<float> logits;      // n_rows x n_vocab
    std::vector<uint8_t> done;      // per row: logits computed
};

static inline void sd_lm_head_disable(sd_lm_head * h, const char * why) {
    h->state = -1;
    h->why = why;
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
    h->state = 1;
}

// the scheduler's eval callback (ggml_backend_sched_eval_callback)
static bool sd_lm_head_cb(ggml_tensor * t, bool ask, void * user_data) {
    sd_lm_head * h = (sd_lm_head *) user_data;
    if (!h->enabled || h->state < 0) return false;
    if (ask) {
        if (h->state == 0) {
            if (strcmp(t->name, "result_norm") == 0) h->norm_seen = t;
            else if (strcmp(t->name, "result_output") == 0) sd_lm_head_discover(h, t);
            return false;
        }
        return h->active && strcmp(t->name, "result_norm") == 0;
    }
    // result_norm is computed: keep its rows, end the graph here
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->ne[0] != h->n_embd || h->captured) {
        return true;  // not what we expect: let the graph run on (the owner sees captured == false)
    }
    const int rows = (int) (t->ne[1] * t->ne[2] * t->ne[3]);
    h->hidden.resize((size_t) rows * h->n_embd);
    memcpy(h->hidden.data(), t->data, (size_t) rows * h->n_embd * sizeof(float));
    h->n_rows = rows;
    h->captured = true;
    return false;
}

// logits of rows [r0, r1) that are not done yet, in one pass over the weights
static void sd_lm_head_compute(sd_lm_head * h, int r0, int r1) {
    std::vector<int> rows;
    for (int r = r0; r < r1; ++r) {
        if (!h->done[r]) rows.push_back(r);
    }
    if (rows.empty()) return;
    const int64_t n_embd = h->n_embd, n_vocab = h->n_vocab;
    const size_t q_row = h->q_row;
    for (int r : rows) {
        const float * x = h->hidden.data() + (size_t) r * n_embd;
        if (h->from_float) h->from_float(x, h->q.data() + (size_t) r * q_row, n_embd);
    }
    const int nr = (int) rows.size();
    auto work = [&](int64_t v0, int64_t v1) {
        std::vector<const void *> xs(nr);
        std::vector<float *> outs(nr);
        for (int j = 0; j < nr; ++j) {
            xs[j] = h->from_float ? (const void *) (h->q.data() + (size_t) rows[j] * q_row)
                                  : (const void *) (h->hidden.data() + (size_t) rows[j] * n_embd);
            outs[j] = h->logits.data() + (size_t) rows[j] * n_vocab;
        }
        for (int64_t v = v0; v < v1; ++v) {
            const void * wr = h->w_data + (size_t) v * h->w_row;
            for (int j = 0; j < nr; ++j) {
                h->vec_dot((int) n_embd, outs[j] + v, 0, wr, 0, xs[j], 0, 1);
            }
        }
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
