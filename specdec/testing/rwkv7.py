"""A tiny random RWKV-7 GGUF (src/models/rwkv7.cpp): a purely recurrent target whose state
is rolled back by checkpoints. Its mixing coefficients are drawn in their trained ranges so
the recurrence stays bounded. The head size is 64, as in released RWKV-7 models: at the
pinned tree, with heads of 16 or 32 a decode split across calls does not compute what one
batch computes."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import gguf
import numpy as np

from specdec.testing.tiny import (RandomFill, Shape, add_test_tokenizer, embeddings_and_head,
                                  write_gguf)


@dataclasses.dataclass(frozen=True)
class Rwkv7Dims:
    """Hyperparameters of an RWKV-7 model (src/models/rwkv7.cpp)."""

    n_vocab: int = 256
    n_embd: int = 128
    n_layer: int = 2
    head_size: int = 64      # wkv.head_size: n_embd / head_size heads
    n_ff: int = 128
    lora_decay: int = 8
    lora_iclr: int = 8
    lora_value_mix: int = 8
    lora_gate: int = 16
    n_ctx_train: int = 4096


def rwkv7_layout(d: Rwkv7Dims) -> dict[str, Shape]:
    """Tensor names and ggml shapes created by llama_model_rwkv7::load_arch_tensors."""
    e = d.n_embd
    t = embeddings_and_head(e, d.n_vocab)
    t.update({"token_embd_norm.weight": (e,), "token_embd_norm.bias": (e,),
              "output_norm.bias": (e,)})
    for il in range(d.n_layer):
        p = f"blk.{il}."
        v_rank = d.lora_iclr if il == 0 else d.lora_value_mix
        for name, ne in {
            "attn_norm.weight": (e,), "attn_norm.bias": (e,),
            "attn_norm_2.weight": (e,), "attn_norm_2.bias": (e,),
            "time_mix_w0.weight": (e,), "time_mix_w1.weight": (e, d.lora_decay),
            "time_mix_w2.weight": (d.lora_decay, e),
            "time_mix_a0.weight": (e,), "time_mix_a1.weight": (e, d.lora_iclr),
            "time_mix_a2.weight": (d.lora_iclr, e),
            "time_mix_v0.weight": (e,), "time_mix_v1.weight": (e, v_rank),
            "time_mix_v2.weight": (v_rank, e),
            "time_mix_g1.weight": (e, d.lora_gate), "time_mix_g2.weight": (d.lora_gate, e),
            "time_mix_lerp_fused.weight": (e, 1, 1, 6),
            "time_mix_k_k.weight": (e,), "time_mix_k_a.weight": (e,), "time_mix_r_k.weight": (e,),
            "time_mix_key.weight": (e, e), "time_mix_value.weight": (e, e),
            "time_mix_receptance.weight": (e, e),
            "time_mix_ln.weight": (e,), "time_mix_ln.bias": (e,),
            "time_mix_output.weight": (e, e),
            "channel_mix_lerp_k.weight": (e, 1, 1),
            "channel_mix_key.weight": (e, d.n_ff), "channel_mix_value.weight": (d.n_ff, e),
        }.items():
            t[p + name] = ne
    return t


def add_rwkv7_kv(w: gguf.GGUFWriter, d: Rwkv7Dims) -> None:
    """Keys llama_model_rwkv7::load_arch_hparams and the generic loader read."""
    w.add_context_length(d.n_ctx_train)
    w.add_embedding_length(d.n_embd)
    w.add_block_count(d.n_layer)
    w.add_feed_forward_length(d.n_ff)
    w.add_head_count(0)
    w.add_layer_norm_eps(1e-5)
    w.add_wkv_head_size(d.head_size)
    w.add_decay_lora_rank(d.lora_decay)
    w.add_iclr_lora_rank(d.lora_iclr)
    w.add_value_residual_mix_lora_rank(d.lora_value_mix)
    w.add_gate_lora_rank(d.lora_gate)
    w.add_token_shift_count(2)


class _Rwkv7Fill(RandomFill):
    """RandomFill, with the mixing coefficients and norm biases in their trained ranges
    (lerps in [0, 1], biases 0) so the recurrence stays bounded."""

    def __call__(self, name: str, ne: Shape) -> np.ndarray:
        shape = tuple(reversed(ne))
        if name.endswith("norm.bias") or name.endswith("time_mix_ln.bias"):
            return np.zeros(shape, dtype=np.float32)
        if "lerp" in name or name.endswith(("time_mix_k_a.weight", "time_mix_r_k.weight",
                                            "time_mix_k_k.weight")):
            return self.rng.uniform(0.0, 1.0, shape).astype(np.float32)
        if name.endswith(("time_mix_w0.weight", "time_mix_a0.weight", "time_mix_v0.weight")):
            return self.rng.uniform(-1.0, 1.0, shape).astype(np.float32)
        if name.endswith("time_mix_ln.weight"):
            return np.ones(shape, dtype=np.float32)
        return super().__call__(name, ne)


def write_tiny_rwkv7(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_vocab: int = 256,
    dtype: str = "f32",
) -> Path:
    """Random 2-layer RWKV-7 (n_embd 128, 2 heads of 64): a purely recurrent target with no
    partial rollback, so speculation needs state checkpoints."""
    d = Rwkv7Dims(n_vocab=n_vocab)

    def add_kv(w: gguf.GGUFWriter) -> None:
        add_rwkv7_kv(w, d)
        add_test_tokenizer(w, n_vocab)

    return write_gguf(path, "rwkv7", rwkv7_layout(d), _Rwkv7Fill(seed), add_kv, dtype=dtype,
                      name="tiny-rwkv7")
