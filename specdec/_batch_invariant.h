// Batch-invariant CPU kernels for a context: a row's outputs do not depend on how many rows
// share its batch (exact mode).
//
// Why: ggml-cpu picks matmul and attention kernels by row count, and they accumulate in
// different orders. At the pinned commit:
//   - K-quant and IQ weights (Q2_K..Q6_K, IQ*) take the tiled kernel (ggml-cpu/tiled/) for
//     batches of 8 rows or more and vec_dot below that;
//   - flash attention takes a tiled kernel at 64 query rows or more (GGML_FA_TILE_Q) and a
//     split-KV kernel for a single row;
//   - llamafile's tinyBLAS takes Q4_0/Q5_0/Q8_0/IQ4_NL/F16/F32 weights for 2 rows or more,
//     vec_dot for one (per element it accumulates in the same order whatever the tile).
// So a verify of 8+ rows rounds differently from the 2-row decodes of exact plain decoding,
// and near-ties flip.
//
// How: ggml's CPU backend has a per-backend "reference" switch (ggml_backend_cpu_set_use_ref)
// that turns the tiled matmul, the tiled and split-KV attention and op fusion off, so every
// batch of 2 rows or more computes each row with the same kernels in the same order. A single
// row still differs (tinyBLAS starts at 2 rows): the controller never decodes one row in exact
// mode. Weights must not be repacked (Model(use_extra_bufts=False)): the repacked kernels
// depend on the row count modulo 4, and the switch does not reach them.
//
// The switch reaches only CPU backends. sd_set_cpu_ref_kernels returns the number of backends
// of the context's scheduler that are not the CPU (a GPU, RPC servers, BLAS): their kernels are
// chosen by their own rules, so the caller checks them (Context.check_batch_invariance) for the
// batches it will decode, and refuses exact mode where they fail.
#pragma once

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama-context.h"
// ggml/src is not on the include path; llama.cpp/src (llama-context.h) is, beside it
#include "../ggml/src/ggml-backend-impl.h"

#include <string>
#include <vector>

// The same switch is also the faster choice, outside exact mode, for a batch that interleaves
// the rows of several sequences in one KV cache (Context.decode_c turns it on for such a
// decode only). The tiled attention kernel computes 64 query rows at a time against every KV
// tile that is not masked for all of them; with the rows of 8 sequences in a tile, each
// tile's KV is that of all 8, eight times the cells a row needs. The reference kernel skips
// each row's masked cells. Measured on gemma3-270m, 2 threads, prompts of 166-1,570 tokens:
// 8 sequences x 9 rows 308 -> 211 ms; 16 x 5 rows 622 -> 253 ms; 3 x 22 rows 276 -> 204 ms.
// For a single sequence (a prompt's chunk) the tiled kernels are faster: 128 rows 217 -> 321 ms
// with the switch, so it stays off there.
static inline int sd_set_cpu_ref_kernels(llama_context * ctx, bool on) {
    ggml_backend_sched_t sched = ctx->get_sched();
    const int n = ggml_backend_sched_get_n_backends(sched);
    int others = 0;
    for (int i = 0; i < n; i++) {
        ggml_backend_t b = ggml_backend_sched_get_backend(sched, i);
        if (ggml_backend_is_cpu(b)) {
            ggml_backend_cpu_set_use_ref(b, on);
        } else {
            others++;
        }
    }
    return others;
}

// query rows per tile of ggml-cpu's tiled attention (GGML_FA_TILE_Q in ggml-cpu/common.h)
#define SD_FA_TILE_Q 64

static inline bool sd_flash_attn(llama_context * ctx) {
    return ctx->get_cparams().flash_attn;
}

// the names of the context's backends, in the scheduler's order (a GPU's, "RPC[host:port]",
// "CPU"): which kernels compute its rows
static inline std::vector<std::string> sd_backend_names(llama_context * ctx) {
    ggml_backend_sched_t sched = ctx->get_sched();
    std::vector<std::string> out;
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); i++) {
        out.emplace_back(ggml_backend_name(ggml_backend_sched_get_backend(sched, i)));
    }
    return out;
}

// A CPU device whose backends compute with the reference kernels: what
// `specdec rpc-server --batch-invariant` serves, so that rows computed on the server come out as
// a local exact-mode context's do. It copies the CPU device (name, memory and buffer types stay
// the CPU's, and the CPU's own functions read only its context) and replaces init_backend.
struct sd_ref_cpu_device {
    ggml_backend_device dev;          // first: the RPC server sees a ggml_backend_dev_t
    ggml_backend_dev_t base;
};

static inline ggml_backend_t sd_ref_cpu_init_backend(ggml_backend_dev_t dev, const char * params) {
    ggml_backend_dev_t base = reinterpret_cast<sd_ref_cpu_device *>(dev)->base;
    ggml_backend_t b = base->iface.init_backend(base, params);
    if (b) {
        ggml_backend_cpu_set_use_ref(b, true);
    }
    return b;
}

// a process-lifetime wrapper of a CPU device (the RPC server never returns)
static inline ggml_backend_dev_t sd_ref_cpu_device_of(ggml_backend_dev_t base) {
    auto * w = new sd_ref_cpu_device{*base, base};
    w->dev.iface.init_backend = sd_ref_cpu_init_backend;
    return &w->dev;
}
