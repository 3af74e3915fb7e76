"""Mutation fuzzing of model loading: mutated GGUF files, each loaded in a child process.

A mutation edits one or more fields of a valid GGUF file: raw bytes of the header, a
metadata entry's type/length/value, a tensor info's n_dims/dims/type/offset; or the
file's meaning with a consistent structure (a zero or huge hyperparameter, a missing
key, another architecture, a vocabulary whose arrays disagree, a tensor with another
shape). Case ``i`` of seed ``s`` is always the same file, so a crash is reproducible
from its number.

The child loads each file with :class:`specdec.Model`, creates a context and
generates a few tokens, and prints one line per case. llama.cpp aborts the whole
process on a failed ``GGML_ASSERT``, so the parent runs batches of cases in a child,
notes a child that dies (the case it was on is the crash) and starts the next batch
after it. Run by hand::

    python -m specdec.testing.gguf_fuzz --cases 1000 model.gguf [more.gguf ...]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from specdec._gguf_check import (T_ARRAY, T_STRING, VALUE_TYPES, parse_gguf, tensor_nbytes,
                                 tensor_types)

# --------------------------------------------------------------------------------------
# an editable GGUF: metadata, tensor infos and each tensor's data, written back consistently
# --------------------------------------------------------------------------------------


@dataclass
class Entry:
    key: str
    type: int
    value: Any
    arr_type: int = -1


@dataclass
class Tensor:
    name: str
    dims: List[int]
    type: int
    data: bytes


@dataclass
class Model:
    version: int
    kv: List[Entry]
    tensors: List[Tensor]
    alignment: int = 32

    def find(self, key: str) -> Optional[Entry]:
        return next((e for e in self.kv if e.key == key), None)

    def put(self, key: str, type_: int, value: Any, arr_type: int = -1) -> None:
        """Set a metadata entry, adding it if missing."""
        e = self.find(key)
        if e is None:
            self.kv.append(Entry(key, type_, value, arr_type))
        else:
            e.type, e.value, e.arr_type = type_, value, arr_type

    @property
    def arch(self) -> str:
        e = self.find("general.architecture")
        return e.value if e is not None and isinstance(e.value, str) else ""


class Zeros:
    """``n`` zero bytes, never materialised: the data of a header-only base's tensors."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = max(0, n)

    def __len__(self) -> int:
        return self.n

    def __mul__(self, k: int) -> "Zeros":
        return Zeros(self.n * k)

    def __getitem__(self, sl: slice) -> "Zeros":
        return Zeros(len(range(*sl.indices(self.n))))

    def __radd__(self, other: bytes) -> bytes:
        return bytes(other) + bytes(self.n)


class Sparse(bytes):
    """A file given by its header bytes only; the rest, up to ``size``, is zeros.

    Gemma's header over its real tensor infos, with the 250 MB of weights left as a hole
    in the file (all-zero weights load and run): a case costs a header, not a model."""

    size: int

    def __new__(cls, head: bytes, size: int) -> "Sparse":
        obj = super().__new__(cls, head)
        obj.size = max(size, len(head))
        return obj

    def write(self, f) -> None:
        f.write(self)
        f.truncate(self.size)


def header_base(path: str) -> Sparse:
    """The header of a GGUF file (metadata and tensor infos) as a header-only base."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(1 << 20)
        while True:
            try:
                lay = parse_gguf(head, strings=False)
                break
            except Exception:
                if len(head) >= size:
                    raise
                head += f.read(len(head))
    return Sparse(head[:lay.data_start], size)


def load(data: bytes) -> Model:
    lay = parse_gguf(data, strings=True)
    kv = [Entry(k.key, k.type, k.value, k.arr_type) for k in lay.kv_list]
    tensors = []
    for t in lay.tensors:
        n = tensor_nbytes(t.type, t.dims)
        start = lay.data_start + t.data_offset
        blob = Zeros(n) if isinstance(data, Sparse) else data[start:start + n]
        tensors.append(Tensor(t.name, list(t.dims), t.type, blob))
    return Model(lay.version, kv, tensors, lay.alignment)


def _pack_value(t: int, v: Any) -> bytes:
    if t == T_STRING:
        b = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else bytes(v)
        return struct.pack("<Q", len(b)) + b
    fmt = VALUE_TYPES[t][1]
    if t in (6, 12):
        try:
            return struct.pack(fmt, float(v))
        except (TypeError, ValueError, OverflowError):
            return struct.pack(fmt, float("nan"))
    if t == 7:
        return struct.pack(fmt, bool(v))
    bits = 8 * VALUE_TYPES[t][2]
    try:
        v = int(v)
    except (TypeError, ValueError, OverflowError):   # a string left in a retyped entry
        v = len(str(v))
    if fmt[1].isupper():
        v %= 1 << bits
    else:
        v = (v + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
    return struct.pack(fmt, v)


def dump(m: Model) -> bytes:
    out = [b"GGUF", struct.pack("<IQQ", m.version, len(m.tensors), len(m.kv))]
    for e in m.kv:
        out.append(_pack_value(T_STRING, e.key))
        out.append(struct.pack("<I", e.type))
        if e.type == T_ARRAY:
            out.append(struct.pack("<IQ", e.arr_type, len(e.value)))
            out.extend(_pack_value(e.arr_type, x) for x in e.value)
        else:
            out.append(_pack_value(e.type, e.value))
    off = 0
    a = m.alignment
    for t in m.tensors:
        out.append(_pack_value(T_STRING, t.name))
        out.append(struct.pack(f"<I{len(t.dims)}q", len(t.dims), *t.dims))
        out.append(struct.pack("<IQ", t.type, off))
        off += (len(t.data) + a - 1) // a * a
    head = b"".join(out)
    pad = (-len(head)) % a
    if any(isinstance(t.data, Zeros) for t in m.tensors):
        # tensors mutated into bytes are kept as zeros too: a header-only file stays one
        return Sparse(head + b"\0" * pad, len(head) + pad + off)
    body = [head, b"\0" * pad]
    for t in m.tensors:
        body.append(t.data)
        body.append(b"\0" * ((-len(t.data)) % a))
    return b"".join(body)


# --------------------------------------------------------------------------------------
# mutations
# --------------------------------------------------------------------------------------

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


def _hparam_entries(m: Model) -> List[Entry]:
    arch = m.arch
    return [e for e in m.kv if arch and e.key.startswith(arch + ".")]


def _mut_hparam(rng, m: Model, raw: bytes) -> str:
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


def _mut_hparam_array(rng, m: Model, raw: bytes) -> str:
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


def _mut_retype(rng, m: Model, raw: bytes) -> str:
    i = rng.randrange(len(m.kv))
    old = m.kv[i]
    m.kv[i] = _retyped(rng, old)
    return f"retype {old.key}: {old.type}/{old.arr_type} -> {m.kv[i].type}/{m.kv[i].arr_type}"


IMPORTANT = ["general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
             "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
             "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"]


def _mut_delete_key(rng, m: Model, raw: bytes) -> str:
    arch = m.arch
    keys = [e.key for e in m.kv]
    pool = [k for k in keys if k in IMPORTANT or k.startswith(arch + ".")] if rng.random() < 0.8 else keys
    k = rng.choice(pool or keys)
    m.kv = [e for e in m.kv if e.key != k]
    return f"delete key {k}"


def _mut_arch(rng, m: Model, raw: bytes) -> str:
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


def _vocab(m: Model) -> Optional[Entry]:
    e = m.find("tokenizer.ggml.tokens")
    return e if e is not None and e.type == T_ARRAY and isinstance(e.value, list) else None


def _mut_vocab(rng, m: Model, raw: bytes) -> str:
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


def _mut_tensor(rng, m: Model, raw: bytes) -> str:
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
]


def _mut_add_key(rng, m: Model, raw: bytes) -> str:
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


def _mut_tokenizer_specials(rng, m: Model, raw: bytes) -> str:
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


def _mut_tensor_class(rng, m: Model, raw: bytes) -> str:
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


def _mut_alignment(rng, m: Model, raw: bytes) -> str:
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


_parsed: Dict[int, Tuple[bytes, Model]] = {}


def _fresh(data: bytes) -> Model:
    """``load(data)``, parsed once per base: a case gets its own copy of the entries and
    tensor infos (a 262k-token vocabulary takes seconds to parse, a list copy milliseconds)."""
    hit = _parsed.get(id(data))
    if hit is None or hit[0] is not data:
        hit = _parsed[id(data)] = (data, load(data))
        if len(_parsed) > 16:
            _parsed.pop(next(iter(_parsed)))
    m = hit[1]
    return Model(m.version,
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


# --------------------------------------------------------------------------------------
# the child: load each case, use it, report one line
# --------------------------------------------------------------------------------------

def _abs_base(p: str) -> str:
    return "header:" + os.path.abspath(p[7:]) if p.startswith("header:") else os.path.abspath(p)


def _base(p: str):
    """A base as given on the command line: a GGUF path, ``header:PATH`` (its header only,
    the weights zeros) or one of GENERATED."""
    if p in GENERATED:
        return p
    if p.startswith("header:"):
        return header_base(p[len("header:"):])
    return open(p, "rb").read()


def exercise(path: str) -> str:
    """Load a model and use it the way a user would; returns what worked."""
    from specdec import Decoder, Model

    m = Model(path)
    ids = m.tokenize("Hello, world! \u00e9\u4e2d\0", add_special=True, parse_special=True)
    m.detokenize([t for t in ids if 0 <= t < m.n_vocab])
    for t in range(min(m.n_vocab, 8)):
        m.token_to_piece(t)
    dec = Decoder(m, n_ctx=64, n_batch=32, drafter="ngram", n_max=3)
    prompt = [t % m.n_vocab for t in (1, 2, 3, 1, 2, 3, 1, 2)]
    r = dec.generate(prompt, max_tokens=6)
    dec.generate("hello", max_tokens=4)
    what = f"loaded {m.arch} n_vocab={m.n_vocab}, generated {len(r.tokens)}"
    if m.has_mtp_graph:
        r = Decoder(path, n_ctx=64, n_batch=32, drafter="mtp", n_max=2).generate(prompt, max_tokens=4)
        what += f", mtp {len(r.tokens)}"
    return what


def child_main(bases: Sequence[str], seed: int, start: int, count: int, workdir: str,
               precheck: bool = True, case_timeout: int = 30) -> None:
    import logging
    logging.disable(logging.CRITICAL)
    if not precheck:   # to count what llama.cpp alone would crash on
        import specdec._core
        specdec._core._check_gguf_file = lambda path: None
    datas = [_base(p) for p in bases]
    # a mutation may grow a file (a resized tensor, a longer array), never unboundedly
    limit = max([64 << 20] + [2 * getattr(d, "size", len(d)) for d in datas if isinstance(d, bytes)])
    path = os.path.join(workdir, f"case-{os.getpid()}.gguf")
    for i in range(start, start + count):
        data, desc = mutate(datas[i % len(datas)], seed, i)
        with open(path, "wb") as f:
            data.write(f) if isinstance(data, Sparse) else f.write(data)
        print(f"CASE {i} {desc}", flush=True)
        signal.alarm(case_timeout)   # a hang ends the child with SIGALRM: the parent notes it
        if getattr(data, "size", len(data)) > limit:
            raise RuntimeError(f"case {i}: mutated file of {len(data)} bytes")
        try:
            what = exercise(path)
            print(f"OK {i} {what}", flush=True)
        except Exception as e:
            msg = str(e).replace("\n", " ")[:300]
            print(f"ERR {i} {type(e).__name__}: {msg}", flush=True)
        signal.alarm(0)
    os.unlink(path) if os.path.exists(path) else None
    print("DONE", flush=True)


# --------------------------------------------------------------------------------------
# the parent: batches in children, crashes noted and skipped
# --------------------------------------------------------------------------------------

@dataclass
class Report:
    cases: int = 0
    loaded: int = 0
    errors: Dict[str, int] = field(default_factory=dict)
    crashes: List[Dict[str, Any]] = field(default_factory=list)
    unclear: List[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def hangs(self) -> int:
        """Crashes that were a case running past its time limit (SIGALRM)."""
        return sum(c["exit"] in (-signal.SIGALRM, "timeout") for c in self.crashes)

    def summary(self) -> str:
        return (f"{self.cases} mutated files: {self.loaded} loaded and ran, "
                f"{sum(self.errors.values())} rejected with an exception "
                f"({', '.join(f'{k} {v}' for k, v in sorted(self.errors.items()))}), "
                f"{len(self.crashes) - self.hangs} deaths, {self.hangs} hangs, "
                f"{self.seconds:.0f}s")


def run(bases: Sequence[str], cases: int, *, seed: int = 0, batch: int = 200,
        timeout: Optional[float] = None, save_dir: Optional[str] = None, precheck: bool = True,
        case_timeout: int = 30) -> Report:
    """Run ``cases`` mutated files through children; crashes are recorded, not fatal.

    A case running past ``case_timeout`` seconds is a hang (the child ends itself with
    SIGALRM); ``timeout`` bounds a whole batch (default: each case's limit, plus a minute)."""
    rep = Report()
    t0 = time.perf_counter()
    i = 0
    with tempfile.TemporaryDirectory(prefix="specdec-fuzz-") as work:
        while i < cases:
            n = min(batch, cases - i)
            cmd = [sys.executable, "-m", "specdec.testing.gguf_fuzz", "--child", "--seed", str(seed),
                   "--start", str(i), "--count", str(n), "--workdir", work,
                   *(b if b in GENERATED else _abs_base(b) for b in bases)]
            cmd += ["--case-timeout", str(case_timeout)]
            if not precheck:
                cmd.append("--no-precheck")
            try:
                # run in the work dir: ``-m`` puts the cwd first on sys.path, and a source
                # checkout there (CI runs from the repo root) would shadow the installed package
                limit = timeout if timeout is not None else n * case_timeout + 60
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=work,
                                   errors="replace", env=dict(os.environ, GGML_NO_BACKTRACE="1"))
                out, err, rc = p.stdout, p.stderr, p.returncode
            except subprocess.TimeoutExpired as e:
                out = (e.stdout or b"").decode("utf-8", "replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
                err, rc = "timeout", "timeout"
            last, desc = None, ""
            done = False
            for line in out.splitlines():
                tag, _, rest = line.partition(" ")
                if tag == "CASE":
                    num, _, desc = rest.partition(" ")
                    last = int(num)
                elif tag == "OK":
                    rep.cases += 1
                    rep.loaded += 1
                    last = None
                elif tag == "ERR":
                    rep.cases += 1
                    num, _, msg = rest.partition(" ")
                    kind = msg.split(":", 1)[0]
                    rep.errors[kind] = rep.errors.get(kind, 0) + 1
                    if len(msg.split(":", 1)) < 2 or not msg.split(":", 1)[1].strip():
                        rep.unclear.append(f"case {num}: {msg}")
                    last = None
                elif tag == "DONE":
                    done = True
            if done and rc == 0:
                i += n
                print(f"{i}/{cases}: {rep.summary()}", file=sys.stderr, flush=True)
                continue
            crash_at = last if last is not None else i
            rep.cases += 1
            lines = err.strip().splitlines()
            why = [ln for ln in lines if any(w in ln for w in ("GGML_ASSERT", "GGML_ABORT", "error",
                                                                 "terminate", "Fatal", "fault"))]
            tail = "\n".join((why or lines)[-3:])
            rep.crashes.append({"case": crash_at, "mutation": desc if last is not None else "?",
                                "exit": rc, "stderr": tail})
            if save_dir:
                os.makedirs(save_dir, exist_ok=True)
                data = _base(bases[crash_at % len(bases)])
                with open(os.path.join(save_dir, f"crash-{seed}-{crash_at}.gguf"), "wb") as f:
                    out = mutate(data, seed, crash_at)[0]
                    out.write(f) if isinstance(out, Sparse) else f.write(out)
            i = crash_at + 1
    rep.seconds = time.perf_counter() - t0
    return rep


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bases", nargs="+", help="valid GGUF files to mutate")
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--save-dir", help="write each crashing file here")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--case-timeout", type=int, default=30, help="seconds before a case is a hang")
    ap.add_argument("--no-precheck", action="store_true",
                    help="skip specdec's GGUF checks (shows what llama.cpp alone crashes on)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=tempfile.gettempdir(), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child_main(a.bases, a.seed, a.start, a.count, a.workdir, not a.no_precheck, a.case_timeout)
        return 0
    rep = run(a.bases, a.cases, seed=a.seed, batch=a.batch, save_dir=a.save_dir,
              precheck=not a.no_precheck, case_timeout=a.case_timeout)
    if a.json:
        print(json.dumps(rep.__dict__, indent=1))
    else:
        print(rep.summary())
        for c in rep.crashes:
            print(f"CRASH case {c['case']} (exit {c['exit']}): {c['mutation']}\n  {c['stderr']}")
    return 1 if rep.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
