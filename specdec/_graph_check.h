// The graph of a new context checked, node by node, against the kernels that will compute it.
//
// Why: the model-file pre-check (_gguf_check.py) judges a tensor by its type alone: a matrix of
// any type with a matmul kernel passes. But what a tensor can be depends on the op it feeds:
// ggml's CPU binary ops (add, mul, ...) take f32/f16/bf16 operands in a few combinations
// only, norms, lerps and the recurrent ops (ssm_conv, rwkv_wkv7, ...) f32 only, and anything
// else ends in GGML_ABORT inside ggml's compute threads, where nothing can turn it into an
// exception (binary-ops.cpp: "unsupported types: dst f32, src1 f16" for an rwkv7 file whose
// lerp tensors are f16). Which tensors feed which ops is the graph builders' knowledge, per
// architecture, and changes with the pin: a table of it would always lag behind.
//
// How: llama.cpp builds and reserves the worst-case graph while it creates a context
// (llama_context::sched_reserve; the last one built stays in get_gf_res_reserve()), with
// every node's op, sources and types, and the scheduler's assignment of a backend to each
// node. Before the first compute the core walks that graph once:
//   - every node must be supported by the backend it is assigned to (ggml_backend_supports_op);
//   - element-wise binary ops (add, sub, mul, div) must have one of the type combinations
//     ggml-cpu's binary_op dispatches (binary-ops.cpp, mirrored below), where they run on a
//     CPU backend;
//   - a model weight (a tensor of a weights buffer, or a view of one) may be any type with
//     CPU kernels (the caller's `computable` set, from ggml's type traits, as the pre-check
//     uses) only as the matrix of a matmul or the table of get_rows; a cast (cpy/cont/dup)
//     takes f32/f16/bf16; every other op it feeds takes f32 only (norms, lerps, biases,
//     ssm and wkv ops, rope frequencies, ...). llama.cpp's converters write such tensors
//     in f32, so this refuses no model they produce.
// The first failing node is reported by name, op and types, and the context is refused.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama-context.h"
#include "llama-graph.h"

static inline bool sd_is_weight(const ggml_tensor * t) {
    while (t->view_src != nullptr) {
        t = t->view_src;
    }
    return t->buffer != nullptr &&
           ggml_backend_buffer_get_usage(t->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
}

static inline const ggml_tensor * sd_weight_root(const ggml_tensor * t) {
    while (t->view_src != nullptr) {
        t = t->view_src;
    }
    return t;
}

static inline bool sd_no_compute(ggml_op op) {
    return op == GGML_OP_NONE || op == GGML_OP_VIEW || op == GGML_OP_RESHAPE ||
           op == GGML_OP_PERMUTE || op == GGML_OP_TRANSPOSE;
}

// ggml-cpu's binary_op (binary-ops.cpp): the (src0, src1, dst) types it has a kernel for
static inline bool sd_cpu_binary_types(ggml_type a, ggml_type b, ggml_type d) {
    const ggml_type F32 = GGML_TYPE_F32, F16 = GGML_TYPE_F16, BF16 = GGML_TYPE_BF16;
    return (a == F32 && b == F32 && d == F32) || (a == F16 && b == F16 && d == F16) ||
           (a == BF16 && b == BF16 && d == BF16) || (a == BF16 && b == F32 && d == BF16) ||
           (a == BF16 && b == F32 && d == F32) || (a == F16 && b == F32 && d == F16) ||
           (a == F16 && b == F32 && d == F32);
}

static inline std::string sd_node_desc(const ggml_tensor * n) {
    std::string s = std::string("node '") + ggml_get_name(n) + "' (" + ggml_op_desc(n) + ", ";
    s += std::string("dst ") + ggml_type_name(n->type);
    for (int i = 0; i < GGML_MAX_SRC && n->src[i] != nullptr; i++) {
        s += std::string(", src") + std::to_string(i) + " " + ggml_type_name(n->src[i]->type);
    }
    return s + ")";
}

// `computable[type]`: the types with CPU matmul/get_rows kernels (ggml_type_traits()).
// Returns "" when every node can be computed, else what cannot.
static inline std::string sd_check_graph(llama_context * ctx, const std::vector<bool> & computable) {
    llm_graph_result * res = ctx->get_gf_res_reserve();
    if (res == nullptr || res->get_gf() == nullptr) {
        return "";
    }
    ggml_cgraph * gf = res->get_gf();
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    const int n = ggml_graph_n_nodes(gf);
    for (int k = 0; k < n; k++) {
        const ggml_tensor * node = ggml_graph_node(gf, k);
        if (sd_no_compute(node->op)) {
            continue;
        }
        // the scheduler's assignments are reset after the reservation: a node whose weights
        // are all in host memory (or that has none) runs on the CPU, or may fall back to it
        bool host = true;
        for (int i = 0; i < GGML_MAX_SRC && node->src[i] != nullptr; i++) {
            const ggml_tensor * w = sd_weight_root(node->src[i]);
            if (sd_is_weight(w) && !ggml_backend_buffer_is_host(w->buffer)) {
                host = false;
            }
        }
        if (host && cpu != nullptr && !ggml_backend_dev_supports_op(cpu, node)) {
            return sd_node_desc(node) + " is not supported by ggml's CPU backend";
        }
        for (int i = 0; i < GGML_MAX_SRC && node->src[i] != nullptr; i++) {
            const ggml_tensor * s = node->src[i];
            if (!sd_is_weight(s)) {
                continue;
            }
            const ggml_type t = s->type;
            const char * why = nullptr;
            if ((node->op == GGML_OP_MUL_MAT || node->op == GGML_OP_MUL_MAT_ID ||
                 node->op == GGML_OP_GET_ROWS) && i == 0) {
                if (t < 0 || (size_t) t >= computable.size() || !computable[t]) {
                    why = "ggml's CPU backend has no kernel for that type";
                }
            } else if (node->op == GGML_OP_MUL_MAT || node->op == GGML_OP_MUL_MAT_ID) {
                // the activations' side of a matmul: supports_op above judged the pair
            } else if (node->op == GGML_OP_CPY || node->op == GGML_OP_CONT ||
                       node->op == GGML_OP_DUP) {
                if (t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16) {
                    why = "a copy takes f32, f16 or bf16";
                }
            } else if (t != GGML_TYPE_F32) {
                why = "that op takes f32 weights only";
            }
            if (why != nullptr) {
                return std::string("tensor '") + ggml_get_name(sd_weight_root(s)) + "' (" +
                       ggml_type_name(t) + ") feeds " + sd_node_desc(node) + ": " + why;
            }
        }
        if ((node->op == GGML_OP_ADD || node->op == GGML_OP_SUB || node->op == GGML_OP_MUL ||
             node->op == GGML_OP_DIV) && !ggml_is_quantized(node->src[0]->type) &&
            !sd_cpu_binary_types(node->src[0]->type, node->src[1]->type, node->type)) {
            return sd_node_desc(node) + ": ggml's CPU kernel has no such type combination";
        }
    }
    return "";
}
