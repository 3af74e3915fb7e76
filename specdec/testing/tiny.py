"""Tiny random-weight GGUF models for tests that need a real llama.cpp model.

The layouts mirror what llama.cpp's loaders create (src/models/qwen35.cpp,
qwen35moe.cpp, llama.cpp): shapes are ggml ``ne`` order ({ne0, ne1, ...}),
numpy arrays use the reversed order. Weights are filled by a per-tensor
callback so that bigram.py can reuse the same layouts with structured values.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

Shape = tuple[int, ...]
Filler = Callable[[str, Shape], np.ndarray]

RMS_EPS = 1e-6

# name -> (file type, tensor type used for the big matrices)
_DTYPES: dict[str, tuple[gguf.LlamaFileType, gguf.GGMLQuantizationType]] = {
    "f32": (gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
    "f16": (gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16),
    "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
}


@dataclasses.dataclass(frozen=True)
class Qwen35Dims:
    """Hyperparameters of a qwen35 / qwen35moe model (trunk layers exclude the MTP block)."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_sections: tuple[int, int, int, int]
    n_ff: int
    ssm_state: int  # head_k_dim == head_v_dim of the gated delta net
    ssm_groups: int  # linear key heads
    ssm_v_heads: int  # linear value heads, a multiple of ssm_groups
    ssm_conv: int = 4
    full_attention_interval: int = 4
    n_ctx_train: int = 4096
    n_expert: int = 0  # > 0 selects the qwen35moe tensor set
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    head_dim_v: int = 0  # value head size of the attention layers; 0: head_dim
    checked: bool = True  # False keeps inconsistent hyperparameters (files llama.cpp must reject)

    def __post_init__(self) -> None:
        if not self.checked:
            return
        if 2 * sum(self.rope_sections) != self.n_rot:
            raise ValueError("rope_sections count rope pairs: their sum must be n_rot / 2")
        if self.ssm_v_heads % self.ssm_groups:
            raise ValueError("ssm_v_heads must be a multiple of ssm_groups")

    @property
    def head_v(self) -> int:
        return self.head_dim_v or self.head_dim

    @property
    def value_dim(self) -> int:
        return self.ssm_state * self.ssm_v_heads

    @property
    def conv_dim(self) -> int:
        return 2 * self.ssm_state * self.ssm_groups + self.value_dim

    def is_recurrent(self, il: int) -> bool:
        """Same rule as llama.cpp when qwen35.attention.recurrent_layers is absent."""
        return il < self.n_layer and (il + 1) % self.full_attention_interval != 0


def embeddings_and_head(n_embd: int, n_vocab: int) -> dict[str, Shape]:
    """The tensors every layout starts with: token embeddings, final norm, LM head."""
    return {
        "token_embd.weight": (n_embd, n_vocab),
        "output_norm.weight": (n_embd,),
        "output.weight": (n_embd, n_vocab),
    }


def qwen35_layout(d: Qwen35Dims, *, n_nextn: int, trunk: bool = True) -> dict[str, Shape]:
    """Tensor names and ggml shapes, in file order; ``trunk=False`` gives the MTP-only subset."""
    t = embeddings_and_head(d.n_embd, d.n_vocab)

    def attention(p: str) -> None:
        t[p + "attn_q.weight"] = (d.n_embd, d.head_dim * d.n_head * 2)  # query and gate per head
        t[p + "attn_k.weight"] = (d.n_embd, d.head_dim * d.n_head_kv)
        t[p + "attn_v.weight"] = (d.n_embd, d.head_v * d.n_head_kv)
        t[p + "attn_output.weight"] = (d.head_dim * d.n_head, d.n_embd)  # llama.cpp: key head size
        t[p + "attn_q_norm.weight"] = (d.head_dim,)
        t[p + "attn_k_norm.weight"] = (d.head_dim,)

    def gated_delta_net(p: str) -> None:
        t[p + "attn_qkv.weight"] = (d.n_embd, d.conv_dim)
        t[p + "attn_gate.weight"] = (d.n_embd, d.value_dim)
        t[p + "ssm_conv1d.weight"] = (d.ssm_conv, d.conv_dim)
        t[p + "ssm_dt.bias"] = (d.ssm_v_heads,)
        t[p + "ssm_a"] = (d.ssm_v_heads,)
        t[p + "ssm_beta.weight"] = (d.n_embd, d.ssm_v_heads)
        t[p + "ssm_alpha.weight"] = (d.n_embd, d.ssm_v_heads)
        t[p + "ssm_norm.weight"] = (d.ssm_state,)
        t[p + "ssm_out.weight"] = (d.value_dim, d.n_embd)

    def ffn(p: str) -> None:
        if d.n_expert == 0:
            t[p + "ffn_gate.weight"] = (d.n_embd, d.n_ff)
            t[p + "ffn_up.weight"] = (d.n_embd, d.n_ff)
            t[p + "ffn_down.weight"] = (d.n_ff, d.n_embd)
            return
        t[p + "ffn_gate_inp.weight"] = (d.n_embd, d.n_expert)
        t[p + "ffn_gate_exps.weight"] = (d.n_embd, d.n_ff_exp, d.n_expert)
        t[p + "ffn_up_exps.weight"] = (d.n_embd, d.n_ff_exp, d.n_expert)
        t[p + "ffn_down_exps.weight"] = (d.n_ff_exp, d.n_embd, d.n_expert)
        t[p + "ffn_gate_inp_shexp.weight"] = (d.n_embd,)
        t[p + "ffn_gate_shexp.weight"] = (d.n_embd, d.n_ff_shexp)
        t[p + "ffn_up_shexp.weight"] = (d.n_embd, d.n_ff_shexp)
        t[p + "ffn_down_shexp.weight"] = (d.n_ff_shexp, d.n_embd)

    for il in range(d.n_layer if trunk else 0):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = (d.n_embd,)
        t[p + "post_attention_norm.weight"] = (d.n_embd,)
        if d.is_recurrent(il):
            gated_delta_net(p)
        else:
            attention(p)
        ffn(p)

    for il in range(d.n_layer, d.n_layer + n_nextn):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = (d.n_embd,)
        t[p + "post_attention_norm.weight"] = (d.n_embd,)
        attention(p)
        ffn(p)
        t[p + "nextn.eh_proj.weight"] = (2 * d.n_embd, d.n_embd)  # input: concat(enorm(e), hnorm(h))
        t[p + "nextn.enorm.weight"] = (d.n_embd,)
        t[p + "nextn.hnorm.weight"] = (d.n_embd,)
        t[p + "nextn.shared_head_norm.weight"] = (d.n_embd,)
    return t


def add_qwen35_kv(w: gguf.GGUFWriter, d: Qwen35Dims, *, n_nextn: int) -> None:
    """Hyperparameter keys read by llama_model_qwen35(moe)::load_arch_hparams and the generic loader."""
    w.add_context_length(d.n_ctx_train)
    w.add_embedding_length(d.n_embd)
    w.add_block_count(d.n_layer + n_nextn)
    if n_nextn:
        w.add_nextn_predict_layers(n_nextn)
    w.add_feed_forward_length(d.n_ff)
    w.add_head_count(d.n_head)
    w.add_head_count_kv(d.n_head_kv)
    w.add_key_length(d.head_dim)
    w.add_value_length(d.head_v)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_dimension_count(d.n_rot)
    w.add_rope_dimension_sections(list(d.rope_sections))
    w.add_rope_freq_base(10_000_000.0)
    w.add_ssm_conv_kernel(d.ssm_conv)
    w.add_ssm_inner_size(d.value_dim)
    w.add_ssm_state_size(d.ssm_state)
    w.add_ssm_time_step_rank(d.ssm_v_heads)
    w.add_ssm_group_count(d.ssm_groups)
    w.add_full_attention_interval(d.full_attention_interval)
    if d.n_expert:
        w.add_expert_count(d.n_expert)
        w.add_expert_used_count(d.n_expert_used)
        w.add_expert_feed_forward_length(d.n_ff_exp)
        w.add_expert_shared_feed_forward_length(d.n_ff_shexp)


def add_test_tokenizer(w: gguf.GGUFWriter, n_vocab: int) -> None:
    """llama.cpp's dummy "test" vocab (tests/test-llama-archs.cpp).

    Text is cut into 5-char chunks hashed to ids and ids detokenize to hex.
    The vocab sets no BOS/EOS (both LLAMA_TOKEN_NULL) and add_bos=false, which
    asserts nothing; with no EOS, generation never stops by itself, which is
    what fixed-length tests want. add_bos_token=false is written to make that explicit.
    """
    w.add_tokenizer_model("test")
    w.add_token_list([f"tok_{i}" for i in range(n_vocab)])
    w.add_token_scores([0.0] * n_vocab)
    w.add_add_bos_token(False)


def _stays_f32(name: str, ne: Shape) -> bool:
    """Tensors that llama-quantize leaves alone (src/llama-quant.cpp): 1-D, norms, router, conv."""
    return (
        len(ne) < 2
        or not name.endswith(".weight")
        or name.endswith("_norm.weight")
        or "ffn_gate_inp" in name
        or "ssm_conv1d" in name
    )


def _encode(name: str, arr: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """Store as qtype; rows that Q8_0 blocks (32) do not divide fall back to F16."""
    ne0 = arr.shape[-1]
    if _stays_f32(name, tuple(reversed(arr.shape))) or qtype == gguf.GGMLQuantizationType.F32:
        return arr.astype(np.float32, copy=False)
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
    if qtype == gguf.GGMLQuantizationType.F16 or ne0 % block:
        return arr.astype(np.float16)
    return gguf.quants.quantize(arr.astype(np.float32, copy=False), qtype)


def write_gguf(
    path: str | os.PathLike[str],
    arch: str,
    layout: dict[str, Shape],
    fill: Filler,
    add_kv: Callable[[gguf.GGUFWriter], None],
    *,
    dtype: str = "f32",
    name: str = "specdec-test",
) -> Path:
    """Write ``layout`` filled by ``fill(name, ne)`` (numpy shape = reversed ne) as a GGUF file."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    ftype, qtype = _DTYPES[dtype]
    path = Path(path)
    w = gguf.GGUFWriter(path, arch)
    try:
        w.add_name(name)
        w.add_file_type(ftype)
        add_kv(w)
        for tname, ne in layout.items():
            arr = fill(tname, ne)
            if arr.shape != tuple(reversed(ne)):
                raise AssertionError(f"{tname}: filled shape {arr.shape} != reversed ne {ne}")
            data = _encode(tname, arr, qtype)
            raw_dtype = qtype if data.dtype == np.uint8 else None
            w.add_tensor(tname, data, raw_dtype=raw_dtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return path


class RandomFill:
    """Random weights scaled so every sublayer moves the residual by O(1).

    Matrices get std 1/sqrt(fan_in) (fan_in = ne0), embeddings std 1 and the
    LM head a larger gain so logit gaps are wide: greedy output then depends
    on the context rather than collapsing to one token, and argmax is not
    flipped by float noise between batched and single-token evaluation.
    Gated-delta-net parameters use the HF initialisation ranges.
    """

    def __init__(self, seed: int, *, logit_gain: float = 6.0) -> None:
        self.rng = np.random.default_rng(seed)
        self.logit_gain = logit_gain

    def normal(self, ne: Shape, std: float) -> np.ndarray:
        return self.rng.standard_normal(tuple(reversed(ne)), dtype=np.float32) * np.float32(std)

    def __call__(self, name: str, ne: Shape) -> np.ndarray:
        shape = tuple(reversed(ne))
        if name.endswith("norm.weight"):
            return np.ones(shape, dtype=np.float32)
        if name.endswith("ssm_a"):  # -exp(A_log), A in [1, 16)
            return -self.rng.uniform(1.0, 16.0, shape).astype(np.float32)
        if name.endswith("ssm_dt.bias"):
            return self.rng.uniform(-1.0, 1.0, shape).astype(np.float32)
        if name == "token_embd.weight":
            return self.normal(ne, 1.0)
        if name == "output.weight":
            return self.normal(ne, self.logit_gain / np.sqrt(ne[0]))
        return self.normal(ne, 1.0 / np.sqrt(ne[0]))


TINY_QWEN35 = Qwen35Dims(
    n_vocab=256,
    n_embd=128,
    n_layer=4,
    n_head=4,
    n_head_kv=2,
    head_dim=32,
    n_rot=8,
    rope_sections=(2, 1, 1, 0),
    n_ff=256,
    ssm_state=32,
    ssm_groups=2,
    ssm_v_heads=4,
)


def write_tiny_qwen35(
    path: str | os.PathLike[str],
    *,
    mtp: bool = True,
    mtp_only: bool = False,
    seed: int = 0,
    n_vocab: int = 256,
    dtype: str = "f32",
    arch: str = "qwen35",
    dims: Qwen35Dims | None = None,
) -> Path:
    """Random qwen35 (layers 0-2 gated delta net, layer 3 full attention) plus one MTP block.

    ``arch="qwen35moe"`` replaces each FFN by 4 routed experts (2 used) and a shared one.

    ``mtp=False`` drops the block and the nextn_predict_layers key;
    ``mtp_only=True`` keeps token_embd, output_norm, output and the block, like
    convert_hf_to_gguf.py --mtp-only (block_count still counts the trunk).
    The same seed gives the same weights in all three variants. ``dims`` replaces the
    hyperparameters (``n_vocab`` and ``arch``'s expert settings then come from it).
    """
    if mtp_only and not mtp:
        raise ValueError("mtp_only=True needs mtp=True")
    if arch not in ("qwen35", "qwen35moe"):
        raise ValueError(f"arch must be 'qwen35' or 'qwen35moe', got {arch!r}")
    d = dims or dataclasses.replace(TINY_QWEN35, n_vocab=n_vocab)
    if arch == "qwen35moe" and dims is None:
        d = dataclasses.replace(d, n_expert=4, n_expert_used=2, n_ff_exp=64, n_ff_shexp=64)
    n_nextn = 1 if mtp else 0
    fill = RandomFill(seed)
    # draw every tensor of the full model in one order, then pick the variant's subset
    values = {name: fill(name, ne) for name, ne in qwen35_layout(d, n_nextn=1).items()}

    def add_kv(w: gguf.GGUFWriter) -> None:
        add_qwen35_kv(w, d, n_nextn=n_nextn)
        add_test_tokenizer(w, d.n_vocab)

    return write_gguf(
        path,
        arch,
        qwen35_layout(d, n_nextn=n_nextn, trunk=not mtp_only),
        lambda name, ne: values[name],
        add_kv,
        dtype=dtype,
        name=f"tiny-{arch}",
    )


def qwen3next_layout(d: Qwen35Dims, *, n_nextn: int) -> dict[str, Shape]:
    """llama_model_qwen3next::load_arch_tensors: qwen35moe's tensors, with the delta net's
    beta and alpha projections fused into one ``ssm_ba`` ({n_embd, 2 * value heads})."""
    t: dict[str, Shape] = {}
    for name, ne in qwen35_layout(d, n_nextn=n_nextn).items():
        if name.endswith("ssm_alpha.weight"):
            continue
        if name.endswith("ssm_beta.weight"):
            t[name.replace("ssm_beta", "ssm_ba")] = (d.n_embd, 2 * d.ssm_v_heads)
            continue
        t[name] = ne
    return t


def write_tiny_qwen3next(
    path: str | os.PathLike[str],
    *,
    mtp: bool = True,
    seed: int = 0,
    n_vocab: int = 256,
    dtype: str = "f32",
) -> Path:
    """Random qwen3next (Qwen3-Next: MoE, layers 0-2 gated delta net, layer 3 attention) plus
    one MTP block (attention and MoE, as llama_model_qwen3next loads it): a hybrid target
    without partial rollback, rolled back by checkpoints of its recurrent part while its
    attention KV is trimmed. ``mtp=False`` drops the block; the trunk's weights are the same."""
    d = dataclasses.replace(TINY_QWEN35, n_vocab=n_vocab, n_expert=4, n_expert_used=2,
                            n_ff_exp=64, n_ff_shexp=64)
    n_nextn = 1 if mtp else 0
    return write_random(path, "qwen3next", qwen3next_layout(d, n_nextn=n_nextn),
                        lambda w: add_qwen35_kv(w, d, n_nextn=n_nextn),
                        n_vocab=n_vocab, seed=seed, dtype=dtype, name="tiny-qwen3next")


@dataclasses.dataclass(frozen=True)
class LlamaDims:
    """Hyperparameters of a plain llama-architecture model."""

    n_vocab: int = 256
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 4096

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def llama_layout(d: LlamaDims) -> dict[str, Shape]:
    """Tensor names and ggml shapes created by llama_model_llama::load_arch_tensors."""
    t = embeddings_and_head(d.n_embd, d.n_vocab)
    for il in range(d.n_layer):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = (d.n_embd,)
        t[p + "attn_q.weight"] = (d.n_embd, d.head_dim * d.n_head)
        t[p + "attn_k.weight"] = (d.n_embd, d.head_dim * d.n_head_kv)
        t[p + "attn_v.weight"] = (d.n_embd, d.head_dim * d.n_head_kv)
        t[p + "attn_output.weight"] = (d.head_dim * d.n_head, d.n_embd)
        t[p + "ffn_norm.weight"] = (d.n_embd,)
        t[p + "ffn_gate.weight"] = (d.n_embd, d.n_ff)
        t[p + "ffn_up.weight"] = (d.n_embd, d.n_ff)
        t[p + "ffn_down.weight"] = (d.n_ff, d.n_embd)
    return t


def add_llama_kv(w: gguf.GGUFWriter, d: LlamaDims) -> None:
    """Keys for LLM_ARCH_LLAMA; rope.dimension_count must equal the head dim for this arch."""
    w.add_context_length(d.n_ctx_train)
    w.add_embedding_length(d.n_embd)
    w.add_block_count(d.n_layer)
    w.add_feed_forward_length(d.n_ff)
    w.add_head_count(d.n_head)
    w.add_head_count_kv(d.n_head_kv)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_dimension_count(d.head_dim)
    w.add_rope_freq_base(10_000.0)


def write_tiny_dense(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_vocab: int = 256,
    dtype: str = "f32",
    dims: LlamaDims | None = None,
) -> Path:
    """Random 2-layer llama (n_embd 64, 4 heads, 2 KV heads, n_ff 128), e.g. a draft model;
    ``dims`` replaces the hyperparameters (``n_vocab`` included)."""
    d = dims or LlamaDims(n_vocab=n_vocab)
    return write_random(path, "llama", llama_layout(d), lambda w: add_llama_kv(w, d),
                        n_vocab=d.n_vocab, seed=seed, dtype=dtype, name="tiny-dense")


@dataclasses.dataclass(frozen=True)
class Gemma3Dims(LlamaDims):
    """Hyperparameters of a gemma3 model with sliding-window attention: every ``swa_pattern``-th
    layer attends globally, the others over the last ``n_swa`` positions."""

    n_layer: int = 3
    n_head_kv: int = 1
    n_swa: int = 32
    swa_pattern: int = 3
    n_ctx_train: int = 8192


def gemma3_layout(d: Gemma3Dims) -> dict[str, Shape]:
    """Tensor names and ggml shapes created by llama_model_gemma3::load_arch_tensors: llama's,
    with norms after attention and FFN and on the query and key heads."""
    t = llama_layout(d)
    for il in range(d.n_layer):
        p = f"blk.{il}."
        t[p + "post_attention_norm.weight"] = (d.n_embd,)
        t[p + "attn_k_norm.weight"] = (d.head_dim,)
        t[p + "attn_q_norm.weight"] = (d.head_dim,)
        t[p + "post_ffw_norm.weight"] = (d.n_embd,)
    return t


def add_gemma3_kv(w: gguf.GGUFWriter, d: Gemma3Dims) -> None:
    """Keys llama_model_gemma3::load_arch_hparams and the generic loader read."""
    add_llama_kv(w, d)
    w.add_key_length(d.head_dim)
    w.add_value_length(d.head_dim)
    w.add_sliding_window(d.n_swa)
    w.add_sliding_window_pattern(d.swa_pattern)


def write_tiny_gemma3(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    dtype: str = "f32",
    dims: Gemma3Dims | None = None,
) -> Path:
    """Random gemma3 with a short sliding window (3 layers, the last global; window 32):
    what llama.cpp's windowed KV cache (``swa_full=False``) keeps or loses shows in its
    output within a few dozen tokens. gemma3 scales the embeddings by sqrt(n_embd): they
    are drawn that much smaller, so that attention moves the residual as much as the
    current token does and the output depends on the context."""
    d = dims or Gemma3Dims()
    rand = RandomFill(seed)

    def fill(name: str, ne: Shape) -> np.ndarray:
        if name == "token_embd.weight":
            return rand.normal(ne, 1.0 / np.sqrt(d.n_embd))
        return rand(name, ne)

    def add_kv(w: gguf.GGUFWriter) -> None:
        add_gemma3_kv(w, d)
        add_test_tokenizer(w, d.n_vocab)

    return write_gguf(path, "gemma3", gemma3_layout(d), fill, add_kv, dtype=dtype,
                      name="tiny-gemma3")


def write_random(
    path: str | os.PathLike[str],
    arch: str,
    layout: dict[str, Shape],
    add_arch_kv: Callable[[gguf.GGUFWriter], None],
    *,
    n_vocab: int,
    seed: int,
    dtype: str,
    name: str,
) -> Path:
    """``layout`` with RandomFill weights, the arch's keys and the test tokenizer."""

    def add_kv(w: gguf.GGUFWriter) -> None:
        add_arch_kv(w)
        add_test_tokenizer(w, n_vocab)

    return write_gguf(path, arch, layout, RandomFill(seed), add_kv, dtype=dtype, name=name)


@dataclasses.dataclass(frozen=True)
class Mamba2Dims:
    """Hyperparameters of a Mamba-2 model (src/models/mamba2.cpp)."""

    n_vocab: int = 256
    n_embd: int = 64
    n_layer: int = 2
    d_inner: int = 128
    d_state: int = 16
    n_head: int = 4          # ssm.time_step_rank: heads of d_inner / n_head channels
    n_group: int = 1
    d_conv: int = 4
    n_ctx_train: int = 4096

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_group * self.d_state


def mamba2_layout(d: Mamba2Dims) -> dict[str, Shape]:
    """Tensor names and ggml shapes created by llama_model_mamba2::load_arch_tensors."""
    t = embeddings_and_head(d.n_embd, d.n_vocab)
    for il in range(d.n_layer):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = (d.n_embd,)
        t[p + "ssm_in.weight"] = (d.n_embd, d.d_inner + d.conv_dim + d.n_head)
        t[p + "ssm_conv1d.weight"] = (d.d_conv, d.conv_dim)
        t[p + "ssm_conv1d.bias"] = (d.conv_dim,)
        t[p + "ssm_dt.bias"] = (d.n_head,)
        t[p + "ssm_a"] = (1, d.n_head)
        t[p + "ssm_d"] = (1, d.n_head)
        t[p + "ssm_norm.weight"] = (d.d_inner // d.n_group, d.n_group)
        t[p + "ssm_out.weight"] = (d.d_inner, d.n_embd)
    return t


def add_mamba2_kv(w: gguf.GGUFWriter, d: Mamba2Dims) -> None:
    """Keys llama_model_mamba2::load_arch_hparams reads (no attention: no head counts)."""
    w.add_context_length(d.n_ctx_train)
    w.add_embedding_length(d.n_embd)
    w.add_block_count(d.n_layer)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_ssm_conv_kernel(d.d_conv)
    w.add_ssm_inner_size(d.d_inner)
    w.add_ssm_state_size(d.d_state)
    w.add_ssm_time_step_rank(d.n_head)
    w.add_ssm_group_count(d.n_group)


def write_tiny_mamba2(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_vocab: int = 256,
    dtype: str = "f32",
) -> Path:
    """Random 2-layer Mamba-2 (n_embd 64, d_inner 128, 4 heads, d_state 16): a purely
    recurrent target with no partial rollback, so speculation needs state checkpoints."""
    d = Mamba2Dims(n_vocab=n_vocab)
    return write_random(path, "mamba2", mamba2_layout(d), lambda w: add_mamba2_kv(w, d),
                        n_vocab=n_vocab, seed=seed, dtype=dtype, name="tiny-mamba2")
