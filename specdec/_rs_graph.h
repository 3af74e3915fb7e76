// Recurrent-state snapshots sized per decode, for hybrid targets (qwen35, qwen35moe).
//
// Why: a context made with n_rs_seq = K keeps K snapshots of every recurrent layer's state so
// that the last decode can be rolled back by up to K tokens. llama.cpp's graph builders read
// K from the context's parameters (cparams.n_rs_seq) and write the snapshot slots on every
// decode, one-token decodes included, which can never be rolled back at all (a decode of n
// tokens of a sequence rolls back at most n - 1). On the mid bigram qwen35 (2 cores) that
// costs a plain round ~2.5% at K = 4: every plain round of an MTP-ready target pays it, even
// when the adaptive policy has turned drafting off.
//
// How: before each decode the core sets the graph's K to min(n_rs_seq, n - 1), n the most
// tokens any sequence has in the batch, and restores n_rs_seq afterwards. Only the graph
// builders see it; the recurrent memory keeps its own n_rs_seq (its layout of 1 + n_rs_seq
// state rows per cell, its rollback bound, its ubatch split), so the slots a smaller K writes
// are the same slots, with the same meaning (slot s: the state s tokens back).
//
// Why it stays correct under llama.cpp's graph reuse: a graph is reused only for a ubatch of
// the same shape (tokens per sequence included), and a ubatch of m tokens per sequence is
// always built with K >= min(n_rs_seq, m - 1) (the batch's n is at least m), which covers
// every rollback the core allows after it (Context tracks that budget and refuses more).
// On the CPU, llama.cpp runs both the K = 1 and the K > 1 graph through the same fused
// gated-delta-net op, so outputs are bit-identical (tests/test_rs_trim.py checks it).
//
// This is the one place specdec writes a field of llama.cpp's llama_context: through the
// const reference of get_cparams() (the object itself is not const), at the pinned commit,
// for the archs whose graph code was read for it (ROLLBACK_TRIM_ARCHS in _archs.py).
#pragma once

#include <cstdint>

#include "llama-context.h"

static inline void sd_set_graph_n_rs_seq(llama_context * ctx, uint32_t n) {
    const_cast<llama_cparams &>(ctx->get_cparams()).n_rs_seq = n;
}
