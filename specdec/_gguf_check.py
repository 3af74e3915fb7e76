"""Checks of a GGUF file before llama.cpp opens it.

llama.cpp parses GGUF files carefully, but the model loader then trusts what it
read: a zero or absurd hyperparameter, a tensor whose shape does not match, or
a vocabulary whose arrays disagree ends in ``GGML_ASSERT`` -> ``abort()``. On the
calling thread ``_abort.h`` turns that into an exception; inside ggml's compute
threads nothing can, and there a tensor type without a kernel is a segfault.
``check_gguf`` walks the header, the metadata and the tensor infos of the
memory-mapped file once (``specdec._gguf_layout``; no tensor data is read; a 262k-token
vocabulary takes tens of milliseconds, where ``gguf.GGUFReader`` needs seconds) and
raises :class:`GGUFError` for what would crash the process, and early for what would
only raise later. Tensor types are judged by the linked ggml's own type traits.
"""
from __future__ import annotations

import array
import math
import mmap
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

from ._gguf_layout import (T_ARRAY, T_STRING, VALUE_TYPES, GGUFError, GGUFLayout, _parse,
                           tensor_types)

#: tensors whose consuming ggml op (not a matmul) takes f32 only, asserting in the compute
#: threads otherwise: ssm_conv's kernel weights
F32_ONLY_SUFFIXES = ("ssm_conv1d.weight",)
MAX_NAME = 64          # GGML_MAX_NAME, with the terminating NUL
MAX_LAYERS = 512       # LLAMA_MAX_LAYERS
MAX_EXPERTS = 512      # LLAMA_MAX_EXPERTS
#: bounds on single dimensions that no real model reaches but that keep products finite
MAX_EMBD = 1 << 20
MAX_VOCAB = 1 << 24
_INT_TYPES = {0, 1, 2, 3, 4, 5, 10, 11}

def _check_tensors(lay: GGUFLayout) -> None:
    # a shard of a split model holds only its own tensors' data, in its own data section
    data_size = lay.size - lay.data_start
    expected = 0
    types = tensor_types()
    for t in lay.tensors:
        if not t.name or len(t.name.encode()) >= MAX_NAME:
            raise GGUFError(f"tensor name {t.name!r} must be 1..{MAX_NAME - 1} bytes")
        if t.type not in types:
            raise GGUFError(f"tensor {t.name!r} has unknown type {t.type}")
        tname, blck, tsize, computable = types[t.type]
        if len(t.dims) == 1 or t.name.endswith(F32_ONLY_SUFFIXES):
            # norms, biases, scales, conv kernels: their ggml ops take f32 only
            if t.type != 0:
                raise GGUFError(f"tensor {t.name!r} must be f32, is {tname}")
        elif not computable:
            # a matrix is multiplied (or its rows fetched): the CPU backend has no kernel
            raise GGUFError(f"tensor {t.name!r} has type {tname}, which ggml cannot compute "
                            "with (no matmul kernel on the CPU)")
        n = 1
        for d in t.dims:
            if d <= 0:
                raise GGUFError(f"tensor {t.name!r} has a dimension of {d} (shape {list(t.dims)})")
            n *= d
        if n >= 1 << 62:
            raise GGUFError(f"tensor {t.name!r} is too large (shape {list(t.dims)})")
        if t.dims[0] % blck:
            raise GGUFError(f"tensor {t.name!r}: row of {t.dims[0]} elements is not a multiple of "
                            f"the block size {blck} of type {tname}")
        nbytes = n // blck * tsize
        if t.data_offset != expected:
            raise GGUFError(f"tensor {t.name!r} has data offset {t.data_offset}, expected "
                            f"{expected}")
        if t.data_offset + nbytes > data_size:
            raise GGUFError(f"tensor {t.name!r} data ({nbytes} bytes at {t.data_offset}) runs "
                            f"past the end of the file (data section of {data_size} bytes)")
        expected += (nbytes + lay.alignment - 1) // lay.alignment * lay.alignment


def _ints(lay: GGUFLayout, key: str) -> Optional[List[Any]]:
    """A scalar or an array hyperparameter as a list, or None when absent."""
    kv = lay.kvs.get(key)
    if kv is None:
        return None
    if kv.type == T_ARRAY:
        return None if kv.value is None else list(kv.value)
    return [kv.value]


def _check_number(lay: GGUFLayout, key: str, lo: float, hi: float, *, per_layer: bool) -> None:
    kv = lay.kvs.get(key)
    if kv is None:
        return
    t = kv.arr_type if kv.type == T_ARRAY else kv.type
    if t in (T_STRING,) or (kv.type == T_ARRAY and not per_layer):
        raise GGUFError(f"metadata {key!r} must be a number, is "
                        f"{'an array' if kv.type == T_ARRAY else 'a string'}")
    vals = _ints(lay, key) or []
    if kv.type == T_ARRAY and kv.count > MAX_LAYERS:
        raise GGUFError(f"metadata {key!r} has {kv.count} entries, more than {MAX_LAYERS} layers")
    for v in vals:
        if isinstance(v, float) and not math.isfinite(v):
            raise GGUFError(f"metadata {key!r} is {v}")
        if not lo <= v <= hi:
            raise GGUFError(f"metadata {key!r} = {v} is out of range [{lo}, {hi}]")


#: hyperparameters (suffixes of ``{arch}.``): (min, max, may be a per-layer array)
_HPARAMS: Dict[str, Tuple[float, float, bool]] = {
    "context_length": (1, 1 << 30, False),
    "embedding_length": (1, MAX_EMBD, False),
    "embedding_length_out": (0, MAX_EMBD, False),
    "block_count": (1, MAX_LAYERS, False),
    "feed_forward_length": (0, 1 << 22, True),
    "attention.head_count": (0, 1 << 14, True),
    "attention.head_count_kv": (0, 1 << 14, True),
    "attention.key_length": (1, 1 << 16, False),
    "attention.value_length": (1, 1 << 16, False),
    "attention.key_length_mla": (0, 1 << 16, False),
    "attention.value_length_mla": (0, 1 << 16, False),
    "attention.sliding_window": (0, 1 << 30, False),
    "attention.layer_norm_rms_epsilon": (0, 1, False),
    "attention.layer_norm_epsilon": (0, 1, False),
    "rope.dimension_count": (0, 1 << 16, False),
    "rope.freq_base": (0, 1e30, False),
    "expert_count": (0, MAX_EXPERTS, False),
    "expert_used_count": (0, MAX_EXPERTS, False),
    "expert_feed_forward_length": (0, 1 << 22, False),
    "expert_shared_feed_forward_length": (0, 1 << 22, False),
    "nextn_predict_layers": (0, MAX_LAYERS, False),
    "full_attention_interval": (0, MAX_LAYERS, False),
    "ssm.conv_kernel": (0, 1 << 10, False),
    "ssm.state_size": (0, 1 << 16, False),
    "ssm.inner_size": (0, MAX_EMBD, False),
    "ssm.group_count": (0, 1 << 14, False),
    "ssm.time_step_rank": (0, 1 << 14, False),
}


def _check_hparams(lay: GGUFLayout) -> str:
    arch_kv = lay.kvs.get("general.architecture")
    if arch_kv is None:
        raise GGUFError("metadata general.architecture is missing")
    if arch_kv.type != T_STRING or not arch_kv.value:
        raise GGUFError("metadata general.architecture must be a non-empty string")
    arch = arch_kv.value
    for suffix, (lo, hi, per_layer) in _HPARAMS.items():
        _check_number(lay, f"{arch}.{suffix}", lo, hi, per_layer=per_layer)
    n_layer = (_ints(lay, f"{arch}.block_count") or [None])[0]
    n_embd = (_ints(lay, f"{arch}.embedding_length") or [None])[0]
    for suffix in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        kv = lay.kvs.get(f"{arch}.{suffix}")
        if kv is not None and kv.type == T_ARRAY and n_layer is not None and kv.count < n_layer:
            raise GGUFError(f"metadata {arch}.{suffix} has {kv.count} entries for {n_layer} "
                            "layers")
    heads = _ints(lay, f"{arch}.attention.head_count")
    heads_kv = _ints(lay, f"{arch}.attention.head_count_kv")
    if heads is not None and n_embd is not None:
        for il, h in enumerate(heads):
            if h == 0:
                continue
            if lay.kvs.get(f"{arch}.attention.key_length") is None and n_embd % h:
                raise GGUFError(f"embedding_length {n_embd} is not divisible by head_count {h}")
            if heads_kv is not None:
                hk = heads_kv[il] if il < len(heads_kv) else heads_kv[-1]
                if hk and h % hk:
                    raise GGUFError(f"head_count {h} is not a multiple of head_count_kv {hk} "
                                    f"(layer {il})")
    head_k = (_ints(lay, f"{arch}.attention.key_length") or [None])[0]
    if head_k is None and heads and n_embd is not None and max(heads):
        head_k = n_embd // max(heads)
    n_rot = (_ints(lay, f"{arch}.rope.dimension_count") or [None])[0]
    # every rope width (the full-attention one, the sliding-window one, ...) is asserted
    # even and within its head by ggml's rope kernel, in the compute threads
    for kv in lay.kv_list:
        if not kv.key.startswith(f"{arch}.rope.dimension_count"):
            continue
        suffix = kv.key[len(arch) + 1:]
        _check_number(lay, kv.key, 0, 1 << 16, per_layer=False)
        rot = kv.value
        head = head_k
        if kv.key.endswith("_swa"):
            head = _one(lay, f"{arch}.attention.key_length_swa") or head_k
        if rot == 0:
            # ggml's rope kernel skips the rotated channels with i0 += n_dims - 2: at 0 it
            # never moves on (a decode that never returns)
            raise GGUFError(f"{suffix} is 0; rope needs a width of 2 or more")
        if rot % 2:
            raise GGUFError(f"{suffix} {rot} is odd")
        if head is not None and rot > head:
            raise GGUFError(f"{suffix} {rot} exceeds the head size {head}")
    sections = lay.kvs.get(f"{arch}.rope.dimension_sections")
    if sections is not None:
        vals = sections.value if sections.type == T_ARRAY else None
        if (vals is None or sections.arr_type not in _INT_TYPES or not vals
                or any(not 0 <= v <= (1 << 16) for v in vals) or sum(vals) == 0):
            raise GGUFError(f"rope.dimension_sections {vals} must be non-negative ints, not all 0")
        if head_k is not None and sum(vals) > head_k:
            raise GGUFError(f"rope.dimension_sections {vals} add up to more than the head size "
                            f"{head_k}")
        if not n_rot:
            raise GGUFError("multi-section rope needs rope.dimension_count > 0")
    nextn = _one(lay, f"{arch}.nextn_predict_layers")
    if nextn is not None and n_layer is not None and nextn > n_layer:
        raise GGUFError(f"nextn_predict_layers {nextn} exceeds block_count {n_layer}")
    for suffix in ("full_attention_interval",):
        v = _ints(lay, f"{arch}.{suffix}")
        if v is not None and v[0] == 0:
            raise GGUFError(f"{arch}.{suffix} is 0 (a divisor)")
    for rule in _ARCH_RULES.get(arch, ()):
        rule(lay, arch)
    used = (_ints(lay, f"{arch}.expert_used_count") or [0])[0]
    n_expert = (_ints(lay, f"{arch}.expert_count") or [0])[0]
    if used > n_expert:
        raise GGUFError(f"expert_used_count {used} exceeds expert_count {n_expert}")
    return arch


def _one(lay: GGUFLayout, key: str) -> Optional[Any]:
    v = _ints(lay, key)
    return v[0] if v else None


def _gated_delta_net(lay: GGUFLayout, arch: str) -> None:
    """qwen35 / qwen3next: the linear-attention value width is state_size * time_step_rank."""
    inner, state, rank = (_one(lay, f"{arch}.ssm.{k}") for k in ("inner_size", "state_size",
                                                                   "time_step_rank"))
    if None not in (inner, state, rank) and inner != state * rank:
        raise GGUFError(f"{arch}.ssm.inner_size {inner} != state_size {state} * time_step_rank "
                        f"{rank}")


def _mamba2_hybrid(lay: GGUFLayout, arch: str) -> None:
    """jamba / granitehybrid graphs assert d_inner == 2 * n_embd."""
    inner, embd = _one(lay, f"{arch}.ssm.inner_size"), _one(lay, f"{arch}.embedding_length")
    if None not in (inner, embd) and inner != 2 * embd:
        raise GGUFError(f"{arch}.ssm.inner_size {inner} != 2 * embedding_length {embd}")


def _gated_delta_net_tensors(lay: GGUFLayout, arch: str) -> None:
    """llama.cpp loads a recurrent layer's attn_qkv / attn_gate as optional, then uses them."""
    names = {t.name for t in lay.tensors}
    if "blk.0.attn_norm.weight" not in names:
        return   # an MTP-only file: no trunk layers
    for t in lay.tensors:
        if t.name.endswith(".ssm_conv1d.weight"):
            blk = t.name[: -len("ssm_conv1d.weight")]
            for need in ("attn_qkv.weight", "attn_gate.weight"):
                if blk + need not in names:
                    raise GGUFError(f"recurrent layer {blk[:-1]} has no {need}")


#: archs whose every layer (or every MoE layer) routes through experts
MOE_ARCHS = frozenset({
    "qwen2moe", "qwen3moe", "qwen3vlmoe", "qwen35moe", "qwen3next", "phimoe", "cohere2moe",
    "olmoe", "glm4moe", "nemotron_h_moe", "exaone-moe", "granitemoe", "bailingmoe",
    "bailingmoe2", "bailingmoe3", "afmoe", "ernie4_5-moe", "hunyuan-moe", "gpt-oss", "lfm2moe",
    "llada-moe", "grovemoe", "nomic-bert-moe", "deepseek", "deepseek2", "deepseek32",
    "deepseek4", "dbrx", "grok", "arctic", "minimax-m2", "mimo2", "step35", "hy_v3",
})


def _moe(lay: GGUFLayout, arch: str) -> None:
    """MoE graphs divide by and index with the expert counts."""
    n, used = _one(lay, f"{arch}.expert_count"), _one(lay, f"{arch}.expert_used_count")
    if not n or not used:
        raise GGUFError(f"{arch} is a mixture of experts: expert_count ({n}) and "
                        f"expert_used_count ({used}) must be set and positive")


#: the longest DFlash block a draft may declare (trained drafts use 8-16): the drafter
#: sizes its batches and context by it
MAX_DRAFT_BLOCK = 1024


def _layer_draft(lay: GGUFLayout, arch: str) -> None:
    """EAGLE-3 / DFlash drafts: the hyperparameters their graphs and specdec's drafters read
    beyond a target's (which they get too: rope widths, head counts, ...)."""
    kv = lay.kvs.get(f"{arch}.target_layers")
    if kv is None:
        raise GGUFError(f"{arch} draft without {arch}.target_layers (the target layers it reads)")
    if kv.type != T_ARRAY or kv.arr_type not in _INT_TYPES or kv.value is None:
        raise GGUFError(f"{arch}.target_layers must be an array of integers")
    n_want = 3 if arch == "eagle3" else None
    if (n_want is not None and kv.count != n_want) or not 1 <= kv.count <= MAX_LAYERS:
        raise GGUFError(f"{arch}.target_layers has {kv.count} entries"
                        + ("; EAGLE-3 reads exactly 3" if n_want else ""))
    bad = [v for v in kv.value if not 0 <= v < MAX_LAYERS]
    if bad:
        raise GGUFError(f"{arch}.target_layers {list(kv.value)[:8]} names layers out of "
                        f"[0, {MAX_LAYERS})")
    hidden = lay.kvs.get(f"{arch}.target_hidden_size")
    if arch == "eagle3" and hidden is None:
        raise GGUFError("eagle3 draft without eagle3.target_hidden_size")
    if hidden is not None:
        if hidden.type not in _INT_TYPES or not 1 <= hidden.value <= MAX_EMBD:
            raise GGUFError(f"{arch}.target_hidden_size {hidden.value!r:.20} is out of range "
                            f"[1, {MAX_EMBD}]")
    block = lay.kvs.get(f"{arch}.block_size")
    if block is not None and (block.type not in _INT_TYPES
                              or not 2 <= block.value <= MAX_DRAFT_BLOCK):
        raise GGUFError(f"{arch}.block_size: block size {block.value!r:.20} is out of range "
                        f"[2, {MAX_DRAFT_BLOCK}]")


#: per-architecture invariants that llama.cpp's graph code asserts
_ARCH_RULES = {
    "eagle3": [_layer_draft], "dflash": [_layer_draft],
    "qwen35": [_gated_delta_net, _gated_delta_net_tensors],
    "qwen35moe": [_gated_delta_net, _gated_delta_net_tensors],
    "qwen3next": [_gated_delta_net, _gated_delta_net_tensors],
    "jamba": [_mamba2_hybrid], "granitehybrid": [_mamba2_hybrid],
}
for _a in MOE_ARCHS:
    _ARCH_RULES.setdefault(_a, []).append(_moe)


_VOCAB_ARRAYS = {"tokenizer.ggml.scores": 6, "tokenizer.ggml.token_type": 5}


def _check_vocab(lay: GGUFLayout) -> None:
    model = lay.kvs.get("tokenizer.ggml.model")
    if model is not None and model.type != T_STRING:
        raise GGUFError("metadata tokenizer.ggml.model must be a string")
    toks = lay.kvs.get("tokenizer.ggml.tokens")
    if toks is None:
        return
    if toks.type != T_ARRAY or toks.arr_type != T_STRING:
        raise GGUFError("metadata tokenizer.ggml.tokens must be an array of strings")
    n = toks.count
    if n == 0:
        raise GGUFError("the vocabulary (tokenizer.ggml.tokens) is empty")
    words = lay.tokens or []
    uniq = set(words)
    if len(uniq) < n:
        raise GGUFError(f"the vocabulary has {n - len(uniq)} duplicate token strings")
    kind = model.value if model is not None else ""
    if kind == "llama":
        # SPM falls back to byte tokens, looked up with std::map::at (an uncaught throw)
        missing = [b for b in range(256) if f"<0x{b:02X}>".encode() not in uniq
                   and bytes([b]) not in uniq]
        if missing:
            raise GGUFError(f"SPM vocabulary without byte tokens for {len(missing)} bytes "
                            f"(e.g. <0x{missing[0]:02X}>)")
    if kind == "rwkv":
        _check_rwkv_vocab(words)
    types = lay.kvs.get("tokenizer.ggml.token_type")
    if types is not None and types.type == T_ARRAY and types.arr_type == 5 and types.count == n:
        tt = array.array("i")
        tt.frombytes(bytes(lay.buf[types.data_offset:types.data_offset + 4 * n]))
        if sys.byteorder != "little":
            tt.byteswap()
        for i in (i for i, t in enumerate(tt) if t == 6):   # LLAMA_TOKEN_TYPE_BYTE
            w = words[i]
            if len(w) != 6 or not w.startswith(b"<0x") or not w.endswith(b">"):
                raise GGUFError(f"token {i} is typed as a byte but reads {w[:20]!r}, not <0xXX>")
    if n > MAX_VOCAB:
        raise GGUFError(f"vocabulary of {n} tokens is too large")
    for key, t in _VOCAB_ARRAYS.items():
        kv = lay.kvs.get(key)
        if kv is None:
            continue
        if kv.type != T_ARRAY or kv.arr_type != t:
            raise GGUFError(f"metadata {key} must be an array of {VALUE_TYPES[t][0]}")
        if kv.count != n:
            raise GGUFError(f"metadata {key} has {kv.count} entries for {n} tokens")
    merges = lay.kvs.get("tokenizer.ggml.merges")
    if merges is not None and (merges.type != T_ARRAY or merges.arr_type != T_STRING):
        raise GGUFError("metadata tokenizer.ggml.merges must be an array of strings")
    for kv in lay.kv_list:
        if kv.key.startswith("tokenizer.ggml.") and kv.key.endswith("_token_id"):
            if kv.type not in _INT_TYPES:
                raise GGUFError(f"metadata {kv.key} must be an integer")


def _unescape_rwkv(token: bytes) -> bytes:
    """llama.cpp's llama_unescape_rwkv_token, byte for byte (its hex digits unchecked too)."""
    out = bytearray()
    escaping, hex_left, acc = False, 0, 0
    for c in token:
        if hex_left:
            acc = ((acc << 4) + ((c - 97 + 10) if c >= 97 else (c - 48))) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            if c == 120:   # \xHH
                hex_left = 2
            else:
                out.append({116: 9, 110: 10, 114: 13}.get(c, c))
            escaping = False
        elif c == 92:
            escaping = True
        else:
            out.append(c)
    return bytes(out)


def _check_rwkv_vocab(words: List[bytes]) -> None:
    """llama.cpp's RWKV tokenizer matches the longest token from each position; when a byte
    begins some token but is no token itself and no longer match completes, it restarts
    from position 0 and loops forever (appending to its output until memory runs out)."""
    firsts, singles = set(), set()
    for w in words:
        u = _unescape_rwkv(w)
        if u:
            firsts.add(u[0])
            if len(u) == 1:
                singles.add(u[0])
    missing = sorted(firsts - singles)
    if missing:
        raise GGUFError(f"RWKV vocabulary: {len(missing)} bytes begin tokens without being tokens "
                        f"themselves (e.g. {bytes([missing[0]])!r}); llama.cpp's RWKV tokenizer "
                        "never ends on text with them")


def check_layout(lay: GGUFLayout) -> str:
    """Semantic checks of a parsed file; returns the architecture."""
    _check_tensors(lay)
    arch = _check_hparams(lay)
    _check_vocab(lay)
    return arch


def check_path(path: "os.PathLike[str] | str") -> str:
    """The model path as a string, refused by what it is when it is not a file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"model path is a directory, not a GGUF file: {path}")
    return path


def check_gguf(path: "os.PathLike[str] | str") -> str:
    """Raise :class:`GGUFError` if llama.cpp could crash on this file; returns the architecture."""
    path = check_path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            head = f.read(4)
            if head != b"GGUF":
                raise GGUFError(f"not a GGUF file (bad magic {head!r})")
            raise GGUFError(f"truncated GGUF header ({size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return check_layout(_parse(mm))
