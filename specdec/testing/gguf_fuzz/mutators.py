"""The fuzzer's mutations: raw bytes of the header, a metadata entry's type/length/value, a
tensor info's dims/type/offset; or the file's meaning with a consistent structure (a zero or
huge hyperparameter, a missing key, another architecture, a vocabulary whose arrays
disagree, a tensor with another shape); and whole generated models (:data:`GENERATED`).
:func:`mutate` picks them: case ``i`` of seed ``s`` is always the same file.
"""
from __future__ import annotations

import os
import random
import struct
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

from specdec._gguf_layout import (T_ARRAY, T_STRING, VALUE_TYPES, parse_gguf, tensor_nbytes,
                                  tensor_types)

from .editor import Entry, GGUFFile, Sparse, Tensor, dump, load


ARCHS = ["llama", "qwen35", "qwen35moe", "gemma3", "qwen2", "qwen3", "phi3", "mamba", "mamba2",
         "rwkv6", "rwkv7", "bert", "t5", "t5encoder", "deepseek2", "falcon", "gpt2", "jamba",
         "granitehybrid", "lfm2", "nemotron_h", "clip", "", "nonsense", "llama\0x", "LLAMA"]
TOKENIZERS = ["llama", "gpt2", "bert", "t5", "rwkv", "none", "no_vocab", "plamo2", "gemma4",
              "ugm", "", "foo"]
#: numbers that break code: zero, one, sign flips, type limits
EDGE_INTS = [0, 1, 2, 3, -1, -2, 7, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1,
             2**32, 2**63 - 1, 2**64 - 1, 10**6, 10**9]
EDGE_FLOATS = [0.0, -0.0, 1.0, -1.0, 1e-30, 1e30, float("nan"), float("inf"), float("-inf"),
               3.4e38, -3.4e38]


def _edge_int(rng: random.Random, v: int = 0) -> int:
    r = rng.random()
    if r < 0.6:
        return rng.choice(EDGE_INTS)
    if r < 0.8:
        return v + rng.choice([-2, -1, 1, 2])
    return v * rng.choice([0, 2, 3, 16, 1 << 10])


def _retyped(rng: random.Random, e: Entry) -> Entry:
    """The same entry with another type (the value converted where it can be)."""
    t = rng.choice([tt for tt in VALUE_TYPES if tt != e.type])
    if t == T_ARRAY:
        at = rng.choice([tt for tt in VALUE_TYPES if tt != T_ARRAY])
        base = e.value if isinstance(e.value, list) else [e.value]
        return Entry(e.key, T_ARRAY, [_convert(at, x) for x in base[:rng.choice([0, 1, 3])]] or [],
                     at)
    v = e.value[0] if isinstance(e.value, list) and e.value else e.value
    return Entry(e.key, t, _convert(t, v))


def _convert(t: int, v: Any) -> Any:
    if t == T_STRING:
        return str(v)
    if t in (6, 12):
        try:
            return float(v)
        except (TypeError, ValueError):
            return 0.0
    if t == 7:
        return bool(v)
    try:
        return int(float(v)) if not isinstance(v, int) else v
    except (TypeError, ValueError, OverflowError):
        return 7


def _hparam_entries(m: GGUFFile) -> List[Entry]:
    arch = m.arch
    return [e for e in m.kv if arch and e.key.startswith(arch + ".")]


def _mut_hparam(rng, m: GGUFFile, raw: bytes) -> str:
    es = _hparam_entries(m) or m.kv
    e = rng.choice(es)
    if e.type == T_ARRAY and e.value and e.arr_type not in (T_STRING, 7):
        i = rng.randrange(len(e.value))
        if e.arr_type in (6, 12):
            e.value[i] = rng.choice(EDGE_FLOATS)
        else:
            e.value[i] = _edge_int(rng, e.value[i])
        return f"hparam {e.key}[{i}] = {e.value[i]}"
    if e.type in (6, 12):
        e.value = rng.choice(EDGE_FLOATS)
    elif e.type in VALUE_TYPES and e.type not in (T_STRING, T_ARRAY, 7):
        e.value = _edge_int(rng, e.value)
    elif e.type == T_ARRAY:
        e.value = e.value[:rng.randrange(len(e.value) + 1)] if e.value else []
        return f"hparam {e.key} array cut to {len(e.value)}"
    else:
        e.value = rng.choice(["", "x" * 300, "\xff", "0"])
    return f"hparam {e.key} = {e.value!r}"


def _mut_hparam_array(rng, m: GGUFFile, raw: bytes) -> str:
    """A scalar hyperparameter turned into a per-layer array (or an array of the wrong length)."""
    es = [e for e in _hparam_entries(m) if e.type in _NUMERIC]
    if not es:
        return _mut_hparam(rng, m, raw)
    e = rng.choice(es)
    n = rng.choice([0, 1, 2, 3, 5, 64, 600])
    vals = [rng.choice([e.value, 0, _edge_int(rng, e.value)]) for _ in range(n)]
    e.arr_type, e.type, e.value = e.type, T_ARRAY, vals
    return f"hparam {e.key} -> array of {n}: {vals[:6]}"


_NUMERIC = {0, 1, 2, 3, 4, 5, 6, 10, 11, 12}


def _mut_retype(rng, m: GGUFFile, raw: bytes) -> str:
    i = rng.randrange(len(m.kv))
    old = m.kv[i]
    m.kv[i] = _retyped(rng, old)
    return f"retype {old.key}: {old.type}/{old.arr_type} -> {m.kv[i].type}/{m.kv[i].arr_type}"


IMPORTANT = ["general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
             "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
             "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"]


def _mut_delete_key(rng, m: GGUFFile, raw: bytes) -> str:
    arch = m.arch
    keys = [e.key for e in m.kv]
    pool = [k for k in keys if k in IMPORTANT or k.startswith(arch + ".")] if rng.random() < 0.8 else keys
    k = rng.choice(pool or keys)
    m.kv = [e for e in m.kv if e.key != k]
    return f"delete key {k}"


def _mut_arch(rng, m: GGUFFile, raw: bytes) -> str:
    old = m.arch
    new = rng.choice(ARCHS)
    e = m.find("general.architecture")
    if e is None:
        return "arch: no key"
    e.type, e.value = T_STRING, new
    rename = rng.random() < 0.6
    if rename and old:
        for x in m.kv:
            if x.key.startswith(old + "."):
                x.key = new + x.key[len(old):]
        seen = set()
        m.kv = [x for x in m.kv if not (x.key in seen or seen.add(x.key))]
    return f"arch {old!r} -> {new!r}" + (" (keys renamed)" if rename else "")


def _vocab(m: GGUFFile) -> Optional[Entry]:
    e = m.find("tokenizer.ggml.tokens")
    return e if e is not None and e.type == T_ARRAY and isinstance(e.value, list) else None


def _mut_vocab(rng, m: GGUFFile, raw: bytes) -> str:
    toks = _vocab(m)
    n = len(toks.value) if toks else 0
    what = rng.randrange(9)
    if what == 0 and toks:
        k = rng.choice([0, 1, n // 2, n - 1, n + 1, n + 100])
        toks.value = (toks.value + [f"<extra{i}>" for i in range(k)])[:k]
        return f"vocab: tokens array resized to {k} (from {n})"
    if what == 1:
        key = rng.choice(["tokenizer.ggml.scores", "tokenizer.ggml.token_type"])
        e = m.find(key)
        if e is not None and e.type == T_ARRAY:
            k = rng.choice([0, 1, max(0, len(e.value) - 1), len(e.value) + 3])
            e.value = (e.value + [e.value[0] if e.value else 0] * k)[:k]
            return f"vocab: {key} resized to {k}"
    if what == 2:
        e = m.find("tokenizer.ggml.token_type")
        if e is not None and e.type == T_ARRAY and e.value:
            for _ in range(rng.choice([1, 5, len(e.value)])):
                e.value[rng.randrange(len(e.value))] = rng.choice([-1, 0, 1, 2, 3, 4, 5, 6, 7, 100, 2**31 - 1])
            return "vocab: token types scrambled"
    if what == 3:
        key = rng.choice(["bos", "eos", "eot", "unk", "sep", "pad", "mask", "eom", "fim_pre",
                          "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"])
        v = rng.choice([n, n + 1, 2**31 - 1, 2**32 - 1, -1, -2, 0])
        t = rng.choice([4, 5, 10, 11])
        k = f"tokenizer.ggml.{key}_token_id"
        e = m.find(k)
        if e is None:
            m.kv.append(Entry(k, t, v))
        else:
            e.type, e.value = t, v
        return f"vocab: {k} = {v} (type {t})"
    if what == 4:
        e = m.find("tokenizer.ggml.model")
        v = rng.choice(TOKENIZERS)
        if e is None:
            m.kv.append(Entry("tokenizer.ggml.model", T_STRING, v))
        else:
            e.type, e.value = T_STRING, v
        return f"vocab: tokenizer model {v!r}"
    if what == 5 and toks and n:
        for _ in range(rng.choice([1, 3, 20])):
            i = rng.randrange(n)
            toks.value[i] = rng.choice(["", "\0", "a\0b", "\ufffd" * 3, "<0xZZ>", "<0x>",
                                        "x" * 5000, toks.value[0], "\u0120\u0120", " "])
        return "vocab: token strings replaced"
    if what == 6:
        e = m.find("tokenizer.ggml.merges")
        v = rng.choice([[], ["a"], ["a b c"], [" "], ["\0 \0"], ["x y"] * 3])
        if e is None:
            m.kv.append(Entry("tokenizer.ggml.merges", T_ARRAY, v, T_STRING))
        else:
            e.value = v
        return f"vocab: merges = {v!r}"
    if what == 7:
        key = rng.choice(["tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                          "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.pre",
                          "tokenizer.ggml.precompiled_charsmap"])
        t, v = rng.choice([(7, True), (7, False), (T_STRING, rng.choice(["gpt2", "llama3", "qwen2",
                                                                        "bogus", ""]))])
        if key.endswith("charsmap"):
            t, v = T_ARRAY, None
            m.kv = [e for e in m.kv if e.key != key]
            m.kv.append(Entry(key, T_ARRAY, [rng.randrange(256) for _ in range(rng.choice([0, 3, 9]))], 0))
            return f"vocab: {key} garbage"
        m.put(key, t, v)
        return f"vocab: {key} = {v!r}"
    if toks:
        toks.value = []
        return "vocab: empty tokens array"
    return "vocab: no change"


def _mut_tensor(rng, m: GGUFFile, raw: bytes) -> str:
    if not m.tensors:
        return "tensor: none"
    i = rng.randrange(len(m.tensors))
    t = m.tensors[i]
    what = rng.randrange(7)
    if what == 0:
        del m.tensors[i]
        return f"tensor {t.name}: deleted"
    if what == 1:
        old = t.name
        t.name = rng.choice([t.name + ".x", "", "x" * 70, m.tensors[0].name + "_", "blk.999.attn_q.weight",
                             "blk.-1.attn_q.weight", t.name.replace("blk.0", "blk.1"), "output.weight"])
        names = [x.name for x in m.tensors]
        if len(set(names)) != len(names):
            t.name = old + ".dup"
        return f"tensor {old}: renamed {t.name!r}"
    if what == 2:
        # another shape with the data resized to match (a consistent file, the wrong tensor)
        dims = list(t.dims)
        j = rng.randrange(len(dims))
        dims[j] = rng.choice([1, 2, dims[j] * 2, max(1, dims[j] // 2), dims[j] + 1])
        if rng.random() < 0.3 and len(dims) > 1:
            dims.reverse()
        if rng.random() < 0.2 and len(dims) < 4:
            dims.append(rng.choice([1, 2]))
        blck = tensor_types()[t.type][1]
        if dims[0] % blck:
            dims[0] = max(blck, dims[0] // blck * blck)
        n = tensor_nbytes(t.type, dims)
        t.data = (t.data * (n // max(1, len(t.data)) + 1))[:n]
        t.dims = dims
        return f"tensor {t.name}: shape -> {dims}"
    if what == 3:
        new = rng.choice(list(tensor_types()))
        if t.dims[0] % tensor_types()[new][1]:
            return f"tensor {t.name}: type {new} does not fit"
        n = tensor_nbytes(new, t.dims)
        old = t.type
        t.type = new
        t.data = (t.data * (n // max(1, len(t.data)) + 1))[:n]
        if new in (0, 1, 30):   # random bits as floats: NaN and inf weights
            t.data = bytes(rng.getrandbits(8) for _ in range(min(n, 4096))) + t.data[4096:]
        return f"tensor {t.name}: type {old} -> {new}"
    if what == 4:
        m.tensors.append(Tensor(t.name + rng.choice([".extra", ""]) if rng.random() < 0.5 else "blk.0.extra.weight",
                                list(t.dims), t.type, t.data))
        names = [x.name for x in m.tensors]
        if len(set(names)) != len(names):
            m.tensors[-1].name = t.name + ".copy"
        return f"tensor {t.name}: extra copy {m.tensors[-1].name}"
    if what == 5:
        # NaN / inf / huge values in the weights
        if t.type == 0 and isinstance(t.data, bytes) and t.data:
            vals = [float("nan"), float("inf"), -float("inf"), 3.4e38, 0.0]
            b = bytearray(t.data)
            for _ in range(rng.choice([1, 16, len(b) // 4])):
                k = rng.randrange(len(b) // 4)
                b[4 * k:4 * k + 4] = struct.pack("<f", rng.choice(vals))
            t.data = bytes(b)
            return f"tensor {t.name}: non-finite weights"
    j, k = rng.randrange(len(m.tensors)), rng.randrange(len(m.tensors))
    m.tensors[j].name, m.tensors[k].name = m.tensors[k].name, m.tensors[j].name
    return f"tensors swapped names {m.tensors[j].name} <-> {m.tensors[k].name}"


#: optional keys llama.cpp's loaders read and then assert on (suffixes of ``{arch}.``)
EXTRA_KEYS: List[Tuple[str, int, List[Any]]] = [
    ("rope.scaling.type", T_STRING, ["bogus", "", "none", "linear", "yarn", "longrope", "YARN"]),
    ("rope.scaling.factor", 6, [0.0, -1.0, 1e-30, 4.0, float("nan")]),
    ("rope.scaling.original_context_length", 4, [0, 1, 2**31, 4096]),
    ("rope.dimension_count_swa", 4, [0, 1, 7, 8, 16, 1 << 15]),
    ("rope.freq_base_swa", 6, [0.0, -1.0, 1e4]),
    ("attention.key_length_swa", 4, [0, 1, 8, 16, 1 << 15]),
    ("attention.value_length_swa", 4, [0, 1, 8, 16]),
    ("attention.sliding_window", 4, [0, 1, 2, 512, 2**31]),
    ("attention.sliding_window_pattern", 4, [0, 1, 2, 6]),
    ("expert_count", 4, [0, 1, 2, 4, 7]),
    ("expert_used_count", 4, [0, 1, 2, 3, 9]),
    ("expert_group_count", 4, [0, 1, 2, 3]),
    ("expert_group_used_count", 4, [0, 1, 2, 5]),
    ("expert_gating_func", 4, [0, 1, 2, 3, 99]),
    ("expert_weights_scale", 6, [0.0, 1.0, float("inf")]),
    ("leading_dense_block_count", 4, [0, 1, 3, 100]),
    ("attention.causal", 7, [True, False]),
    ("attention.layer_norm_epsilon", 6, [0.0, 1e-6, float("nan")]),
    ("attention.q_lora_rank", 4, [0, 1, 16]),
    ("attention.kv_lora_rank", 4, [0, 1, 16]),
    ("final_logit_softcapping", 6, [0.0, -1.0, 30.0]),
    ("attn_logit_softcapping", 6, [0.0, -1.0, 50.0]),
    ("pooling_type", 4, [0, 1, 2, 3, 4, 99]),
    ("embedding_length_per_layer_input", 4, [0, 1, 64]),
    ("ssm.dt_b_c_rms", 7, [True, False]),
    ("full_attention_interval", 4, [1, 2, 3, 5, 100]),
    ("nextn_predict_layers", 4, [0, 1, 2, 3]),
    # the drafters' own: EAGLE-3 and DFlash read these in their graphs
    ("rope.dimension_count", 4, [0, 2, 4, 1 << 15]),
    ("target_hidden_size", 4, [0, 1, 7, 1 << 31]),
    ("block_size", 4, [0, 1, 2, 64, (1 << 31) - 1]),
    ("target_layers", 4, [0, 1, 999]),
]


def _mut_add_key(rng, m: GGUFFile, raw: bytes) -> str:
    """An optional hyperparameter the file did not have (or another value of it)."""
    if not m.arch:
        return "add key: no arch"
    suffix, t, values = rng.choice(EXTRA_KEYS)
    key = f"{m.arch}.{suffix}"
    v = rng.choice(values)
    m.put(key, t, v)
    return f"key {key} = {v!r}"


#: vocabulary types and the specials their tokenizers insist on
TOKENIZER_SPECIALS = {"llama": ["bos", "eos", "unk"], "gpt2": ["bos", "eos"],
                      "bert": ["bos", "eos", "sep", "unk", "pad", "mask"], "t5": ["eos", "unk", "pad"],
                      "rwkv": [], "plamo2": ["bos", "eos"], "gemma4": ["bos", "eos"]}


def _mut_tokenizer_specials(rng, m: GGUFFile, raw: bytes) -> str:
    """Another tokenizer type, with its special tokens missing, out of range or flagged."""
    kind = rng.choice(list(TOKENIZER_SPECIALS))
    toks = _vocab(m)
    n = len(toks.value) if toks else 0
    done = [f"tokenizer {kind}"]
    m.put("tokenizer.ggml.model", T_STRING, kind)
    for special in ["bos", "eos", "sep", "unk", "pad", "mask", "eot", "eom"]:
        key = f"tokenizer.ggml.{special}_token_id"
        r = rng.random()
        if r < 0.4:
            m.kv = [x for x in m.kv if x.key != key]
            done.append(f"no {special}")
        elif r < 0.55:
            v = rng.choice([n, n + 1, 2**31 - 1, -1])
            m.put(key, 4 if v >= 0 else 5, v)
            done.append(f"{special}={v}")
    for flag in ["add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix"]:
        if rng.random() < 0.5:
            key = f"tokenizer.ggml.{flag}"
            v = rng.random() < 0.7
            m.put(key, 7, v)
            done.append(f"{flag}={v}")
    if toks and rng.random() < 0.3:
        k = rng.choice([1, 2, 8, 64, 200])
        toks.value = toks.value[:k]
        for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            x = m.find(key)
            if x is not None and x.type == T_ARRAY:
                x.value = x.value[:k]
        done.append(f"vocab cut to {k}")
    return "; ".join(done)


def _mut_tensor_class(rng, m: GGUFFile, raw: bytes) -> str:
    """A tensor retyped to a type its op cannot take (data resized: a consistent file)."""
    if not m.tensors:
        return "tensor class: none"
    picks = [t for t in m.tensors if t.name.endswith(("ssm_conv1d.weight", "token_embd.weight",
                                                      "output.weight", "_exps.weight"))
             or len(t.dims) == 1]
    t = rng.choice(picks if picks and rng.random() < 0.6 else m.tensors)
    types = tensor_types()
    odd = [k for k, v in types.items() if not v[3]] + [0, 1, 30, 8]
    new = rng.choice(odd if rng.random() < 0.7 else list(types))
    blck = types[new][1]
    if t.dims[0] % blck:
        return f"tensor {t.name}: type {types[new][0]} does not fit"
    n = tensor_nbytes(new, t.dims)
    old, t.type = t.type, new
    t.data = (t.data * (n // max(1, len(t.data)) + 1))[:n]
    return f"tensor {t.name}: type {old} -> {types[new][0]}"


def _mut_alignment(rng, m: GGUFFile, raw: bytes) -> str:
    """Another alignment, the file laid out by it (consistent)."""
    a = rng.choice([1, 2, 4, 8, 16, 64, 128])
    m.alignment = a
    m.put("general.alignment", 4, a)
    return f"alignment {a}"


SEMANTIC: List[Tuple[Callable[..., str], float]] = [
    (_mut_hparam, 4.0), (_mut_hparam_array, 1.0), (_mut_retype, 2.0), (_mut_delete_key, 2.0),
    (_mut_arch, 1.5), (_mut_vocab, 3.0), (_mut_tensor, 3.0), (_mut_add_key, 3.0),
    (_mut_tokenizer_specials, 2.0), (_mut_tensor_class, 2.0), (_mut_alignment, 0.5),
]


def _u(b: bytearray, off: int, fmt: str, v: int) -> None:
    size = struct.calcsize(fmt)
    if 0 <= off and off + size <= len(b):
        bits = 8 * size
        struct.pack_into(fmt, b, off, v % (1 << bits) if fmt[1].isupper() else
                         (v + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1)))


def raw_mutation(rng: random.Random, data: bytes) -> Tuple[bytes, str]:
    """One edit of the raw bytes, at a field located by parsing the file (of a header-only
    file: of its header, the hole after it kept)."""
    out, desc = _raw_mutation(rng, data)
    if isinstance(data, Sparse):
        size = len(out) if desc.startswith("raw: truncated") else data.size
        out = Sparse(out, size)
    return out, desc


def _raw_mutation(rng: random.Random, data: bytes) -> Tuple[bytes, str]:
    lay = parse_gguf(data, strings=False)
    b = bytearray(data)
    what = rng.randrange(11)
    if what == 0:
        b[0:4] = rng.choice([b"GGUF"[::-1], b"GGML", b"\0\0\0\0", b"GGU\0", b"ggjt"])
        return bytes(b), f"raw: magic {bytes(b[0:4])!r}"
    if what == 1:
        v = rng.choice([0, 1, 2, 3, 4, 2**31, 2**32 - 1])
        _u(b, 4, "<I", v)
        return bytes(b), f"raw: version {v}"
    if what in (2, 3):
        off = 8 if what == 2 else 16
        old = int.from_bytes(data[off:off + 8], "little")
        v = _edge_int(rng, old)
        _u(b, off, "<Q", v)
        return bytes(b), f"raw: {'n_tensors' if what == 2 else 'n_kv'} {old} -> {v % 2**64}"
    if what == 4:
        cut = rng.choice([rng.randrange(len(data)), rng.randrange(lay.data_start + 1),
                          lay.data_start + rng.randrange(max(1, len(data) - lay.data_start))])
        return data[:cut], f"raw: truncated at {cut} of {len(data)}"
    if what in (5, 6) and lay.kv_list:
        kv = rng.choice(lay.kv_list)
        if what == 5:
            v = rng.choice([rng.randrange(14), 2**31, 2**32 - 1, rng.getrandbits(32)])
            at = kv.value_offset if kv.type == T_ARRAY and rng.random() < 0.5 else kv.type_offset
            _u(b, at, "<I", v)
            return bytes(b), f"raw: kv {kv.key} {'element ' if at != kv.type_offset else ''}type -> {v}"
        if kv.type == T_ARRAY:
            v = _edge_int(rng, kv.count)
            _u(b, kv.value_offset + 4, "<Q", v)
            return bytes(b), f"raw: kv {kv.key} array length {kv.count} -> {v % 2**64}"
        v = _edge_int(rng, len(kv.key))
        _u(b, kv.offset, "<Q", v)
        return bytes(b), f"raw: kv {kv.key} key length -> {v % 2**64}"
    if what in (7, 8, 9) and lay.tensors:
        t = rng.choice(lay.tensors)
        if what == 7:
            if rng.random() < 0.4:
                v = rng.choice([0, 5, 8, 2**31, 2**32 - 1])
                _u(b, t.dims_offset, "<I", v)
                return bytes(b), f"raw: tensor {t.name} n_dims -> {v}"
            j = rng.randrange(len(t.dims))
            v = rng.choice([0, -1, 1, 2**31, 2**62, -2**63, t.dims[j] + 1, t.dims[j] * 2, 3])
            _u(b, t.dims_offset + 4 + 8 * j, "<q", v)
            return bytes(b), f"raw: tensor {t.name} dim {j} {t.dims[j]} -> {v}"
        if what == 8:
            v = rng.choice([rng.randrange(50), 4, 5, 31, 36, 43, 2**32 - 1])
            _u(b, t.type_offset, "<I", v)
            return bytes(b), f"raw: tensor {t.name} type {t.type} -> {v}"
        v = rng.choice([t.data_offset + 1, t.data_offset + 32, t.data_offset - 32, 2**63,
                        2**64 - 1, 0, len(data)])
        _u(b, t.offset_offset, "<Q", v)
        return bytes(b), f"raw: tensor {t.name} offset {t.data_offset} -> {v % 2**64}"
    # random byte flips in the metadata and tensor infos
    end = max(25, lay.data_start)
    flips = []
    for _ in range(rng.choice([1, 2, 4, 8])):
        k = rng.randrange(24, end)
        b[k] ^= 1 << rng.randrange(8)
        flips.append(k)
    return bytes(b), f"raw: bit flips at {flips}"


#: base names that stand for files generated per case (self-consistent, random hyperparameters)
GENERATED = ("gen:qwen35", "gen:qwen35moe", "gen:dense")


def generate(kind: str, rng: random.Random) -> Tuple[bytes, str]:
    """A file written by specdec.testing with random hyperparameters: every tensor is shaped
    the way the loader expects from them, so only the values themselves can be wrong."""
    import dataclasses

    from specdec.testing.tiny import TINY_QWEN35, LlamaDims, write_tiny_dense, write_tiny_qwen35

    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        if kind == "gen:dense":
            n_head = rng.choice([1, 2, 3, 4, 8])
            d = LlamaDims(n_vocab=rng.choice([8, 64, 256, 300]), n_embd=rng.choice([16, 32, 48, 64]),
                          n_layer=rng.choice([1, 2, 3]), n_head=n_head,
                          n_head_kv=_plausible(rng, n_head), n_ff=rng.choice([16, 64, 96]))
            if d.head_dim == 0:
                d = dataclasses.replace(d, n_head=1)
            write_tiny_dense(path, dims=d, seed=rng.randrange(100))
        else:
            moe = kind == "gen:qwen35moe"
            n_rot = rng.choice([0, 2, 4, 6, 7, 8, 16])
            sec = [rng.choice([0, 1, 2, 3]) for _ in range(4)]
            if rng.random() < 0.6 and n_rot:   # sections that add up, as converters write them
                sec = [n_rot // 2 - n_rot // 4, n_rot // 4, 0, 0]
            n_head = rng.choice([1, 2, 3, 4, 8])
            d = dataclasses.replace(
                TINY_QWEN35, checked=False, n_vocab=rng.choice([8, 64, 256, 300]),
                n_embd=rng.choice([32, 64, 128]), n_layer=rng.choice([1, 2, 3, 4, 5, 6]),
                n_head=n_head, n_head_kv=_plausible(rng, n_head),
                head_dim=rng.choice([8, 16, 32, 48]), head_dim_v=rng.choice([0, 0, 0, 8, 16]),
                n_rot=n_rot, rope_sections=tuple(sec), n_ff=rng.choice([32, 64, 256]),
                ssm_state=rng.choice([8, 16, 32]), ssm_groups=rng.choice([1, 2, 3, 4]),
                ssm_v_heads=rng.choice([1, 2, 3, 4, 6, 8]), ssm_conv=rng.choice([1, 2, 3, 4, 5]),
                full_attention_interval=rng.choice([1, 2, 3, 4, 4, 5, 100]),
                n_expert=rng.choice([0, 1, 2, 4, 8]) if moe else 0,
                n_expert_used=rng.choice([0, 1, 2, 3, 9]) if moe else 0,
                n_ff_exp=rng.choice([16, 64]) if moe else 0, n_ff_shexp=rng.choice([16, 64]) if moe else 0)
            write_tiny_qwen35(path, dims=d, arch="qwen35moe" if moe else "qwen35",
                              mtp=rng.random() < 0.6, seed=rng.randrange(100))
        with open(path, "rb") as f:
            return f.read(), f"generated {kind[4:]} {d}"
    finally:
        os.unlink(path)


_parsed: Dict[int, Tuple[bytes, GGUFFile]] = {}


def _fresh(data: bytes) -> GGUFFile:
    """``load(data)``, parsed once per base: a case gets its own copy of the entries and
    tensor infos (a 262k-token vocabulary takes seconds to parse, a list copy milliseconds)."""
    hit = _parsed.get(id(data))
    if hit is None or hit[0] is not data:
        hit = _parsed[id(data)] = (data, load(data))
        if len(_parsed) > 16:
            _parsed.pop(next(iter(_parsed)))
    m = hit[1]
    return GGUFFile(m.version,
                 [Entry(e.key, e.type, list(e.value) if isinstance(e.value, list) else e.value,
                        e.arr_type) for e in m.kv],
                 [Tensor(t.name, list(t.dims), t.type, t.data) for t in m.tensors], m.alignment)


def _plausible(rng: random.Random, n_head: int) -> int:
    """KV heads: mostly a divisor of ``n_head`` (so the rest of the file gets exercised)."""
    if rng.random() < 0.75:
        return rng.choice([k for k in range(1, n_head + 1) if n_head % k == 0])
    return rng.choice([1, 2, 3, 4])


def mutate(data: bytes, seed: int, case: int) -> Tuple[bytes, str]:
    """The mutated file of one case (deterministic) and a description of what changed.
    ``data`` may be one of GENERATED instead of a file's bytes."""
    rng = random.Random(seed * 1_000_003 + case)
    if isinstance(data, str):
        data, desc = generate(data, rng)
        if rng.random() < 0.5:   # the generated file itself, bad hyperparameters and all
            return data, desc
        out, more = mutate(data, seed, case + 1_000_000_007)
        return out, f"{desc}; {more}"
    if rng.random() < 0.35:
        return raw_mutation(rng, data)
    m = _fresh(data)
    funcs, weights = zip(*SEMANTIC)
    done = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        done.append(rng.choices(funcs, weights)[0](rng, m, data))
    out = dump(m)
    if rng.random() < 0.1:
        out, desc = raw_mutation(rng, out)
        done.append(desc)
    return out, "; ".join(done)
