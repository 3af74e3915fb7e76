"""What llama.cpp's architectures can do, from the pinned tree (src/llama-arch.cpp, src/models/*).

Plain data: the core checks contexts against it, the API and the MTP drafter choose with it.
llama.cpp's own terms are kept in the comments (NextN layers, ``n_rs_seq``) so that each
entry can be checked against the source.
"""

#: archs whose graph has an MTP path (llama.cpp: DECODER_MTP, NextN layers)
MTP_ARCHS = frozenset({
    "qwen35", "qwen35moe", "qwen3next", "deepseek2", "deepseek32", "deepseek4", "glm4moe",
    "glm-dsa", "glm5-next", "step35", "mimo2", "hy_v3", "cohere2moe", "bailingmoe3",
    "nemotron_h_moe",
})

#: archs whose graph hands out its layers' inputs (llama.cpp: t_layer_inp, read with
#: llama_get_embeddings_layer_inp): the targets an EAGLE-3 draft can read
LAYER_INPUT_ARCHS = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma4",
    "gpt-oss", "bailingmoe3", "deepseek4", "hunyuan_vl", "lfm2", "minimax-01", "minimax-m2",
    "muse-glimmer", "nanbeige", "nemotron_h", "mimo2",
})

#: draft archs fed the target's layer inputs through an encoder graph whose output, and
#: the decoder's pre-norm state, come out as llama.cpp's nextn embeddings
LAYER_DRAFT_ARCHS = frozenset({"eagle3"})

#: draft archs that take the target's layer inputs as feature-only decode batches, written
#: into their own KV at the target's positions (llama.cpp: DFlash's KV injection), and draft
#: a whole block of mask tokens in one token batch
BLOCK_DRAFT_ARCHS = frozenset({"dflash"})

#: of those, the archs whose MTP graph runs several chained heads
MTP_MULTI_HEAD_ARCHS = frozenset({"step35", "mimo2", "hy_v3"})

#: recurrent/hybrid archs whose recurrent state can be rolled back by a few tokens
#: (llama.cpp: llm_arch_supports_rs_rollback, ``n_rs_seq`` snapshots); the others roll
#: back by state checkpoints
PARTIAL_ROLLBACK_ARCHS = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
    "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3",
})

#: archs whose graph computes the MTP hidden rows (llama.cpp: h_nextn) before result_norm,
#: where the lazy LM head stops the graph: lazy logits and MTP hidden states go together on
#: these only (eagle3: its decoder's pre-norm state, which the next draft step reads)
LAZY_MTP_ARCHS = frozenset({"qwen35", "qwen35moe", "eagle3"})

#: archs whose MTP graph keeps only the output rows before its hidden state (h_nextn): an
#: MTP context of theirs reads hidden rows masked (one per output row); dense reading, one
#: row per batch entry, would run past the tensor (llama.cpp aborts)
MTP_PRUNED_ARCHS = frozenset({"qwen3next", "mimo2", "step35", "deepseek4"})

#: archs whose decode graphs may keep fewer rollback snapshots than the context holds
#: (their graph code reads cparams.n_rs_seq the way _rs_graph.h assumes: delta-net layers)
ROLLBACK_TRIM_ARCHS = frozenset({"qwen35", "qwen35moe"})
