"""An editable GGUF for the fuzzer: metadata, tensor infos and each tensor's data, parsed
(:func:`load`), changed in place, and written back consistently (:func:`dump`): offsets,
counts and padding follow whatever a mutation changed. :func:`header_base` keeps a big
model's header only, its weights zeros that are never held in memory (:class:`Sparse`).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any, List, Optional

from specdec._gguf_layout import T_ARRAY, T_STRING, VALUE_TYPES, parse_gguf, tensor_nbytes


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
class GGUFFile:
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


def load(data: bytes) -> GGUFFile:
    lay = parse_gguf(data, strings=True)
    kv = [Entry(k.key, k.type, k.value, k.arr_type) for k in lay.kv_list]
    tensors = []
    for t in lay.tensors:
        n = tensor_nbytes(t.type, t.dims)
        start = lay.data_start + t.data_offset
        blob = Zeros(n) if isinstance(data, Sparse) else data[start:start + n]
        tensors.append(Tensor(t.name, list(t.dims), t.type, blob))
    return GGUFFile(lay.version, kv, tensors, lay.alignment)


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


def dump(m: GGUFFile) -> bytes:
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
