"""The GGUF layout: one walk over a file's header, metadata and tensor infos.

``parse_gguf`` (and ``_parse`` on a memory map) reads every field once, little-endian, failing
with :class:`GGUFError` past the buffer's end, and records where each field lies, so that
``specdec._gguf_check`` can judge what llama.cpp's loader would trust and the GGUF fuzzer
(``specdec.testing.gguf_fuzz``) can edit a field in place. No tensor data is read. Tensor
types are ggml's own, asked of the linked library (``tensor_types``).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

#: GGUF value types: id -> (name, struct format, size); strings and arrays have no fixed size
VALUE_TYPES: Dict[int, Tuple[str, str, int]] = {
    0: ("u8", "<B", 1), 1: ("i8", "<b", 1), 2: ("u16", "<H", 2), 3: ("i16", "<h", 2),
    4: ("u32", "<I", 4), 5: ("i32", "<i", 4), 6: ("f32", "<f", 4), 7: ("bool", "<?", 1),
    8: ("str", "", 0), 9: ("arr", "", 0), 10: ("u64", "<Q", 8), 11: ("i64", "<q", 8),
    12: ("f64", "<d", 8),
}
T_STRING, T_ARRAY = 8, 9
_U64 = struct.Struct("<Q")

_TYPES: Dict[int, Tuple[str, int, int, bool]] = {}


def tensor_types() -> Dict[int, Tuple[str, int, int, bool]]:
    """ggml's tensor types, asked of the linked ggml (``_core.ggml_type_traits``):
    id -> (name, block size, block bytes, computable by the CPU backend)."""
    if not _TYPES:
        from ._core import ggml_type_traits   # here: _core imports this module
        _TYPES.update(ggml_type_traits())
    return _TYPES


def tensor_nbytes(type_: int, dims) -> int:
    """Bytes of a tensor of ``type_`` and shape ``dims`` (ggml ne order)."""
    _, blck, tsize, _ = tensor_types()[type_]
    n = 1
    for d in dims:
        n *= d
    return n // blck * tsize



MAX_DIMS = 4           # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32


class GGUFError(ValueError):
    """The file is not a GGUF model llama.cpp can load without crashing; says what and where."""


@dataclass
class KV:
    key: str
    type: int                  # value type; for arrays, T_ARRAY
    offset: int                # where the key's length field starts
    type_offset: int           # where the value type field starts
    value_offset: int          # where the value starts (for arrays: the element type field)
    end: int
    arr_type: int = -1
    count: int = 1             # array length (1 for scalars)
    data_offset: int = -1      # arrays: where the elements start
    value: Any = None          # scalars, strings and non-string arrays (as lists); None for string arrays


@dataclass
class TensorInfo:
    name: str
    dims: Tuple[int, ...]
    type: int
    data_offset: int           # relative to the data section
    offset: int                # where the name's length field starts
    dims_offset: int           # where n_dims starts
    type_offset: int
    offset_offset: int
    end: int


@dataclass
class GGUFLayout:
    size: int
    version: int
    n_tensors: int
    n_kv: int
    kvs: Dict[str, KV] = field(default_factory=dict)
    kv_list: List[KV] = field(default_factory=list)
    tensors: List[TensorInfo] = field(default_factory=list)
    alignment: int = DEFAULT_ALIGNMENT
    data_start: int = 0
    tokens: Optional[List[bytes]] = None   # the vocabulary's token strings, raw
    buf: Any = None                        # the file's bytes (valid while checking)

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kvs.get(key)
        return default if kv is None else kv.value


class _Walker:
    """Reads little-endian fields from a buffer, failing with GGUFError past its end."""

    __slots__ = ("buf", "pos", "size")

    def __init__(self, buf, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos
        self.size = len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"truncated file: {what} at byte {self.pos} needs {n} bytes, "
                            f"{self.size - self.pos} left")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = int.from_bytes(self.buf[self.pos:self.pos + 4], "little")
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = int.from_bytes(self.buf[self.pos:self.pos + 8], "little")
        self.pos += 8
        return v

    def string(self, what: str, limit: Optional[int] = None) -> str:
        n = self.u64(f"length of {what}")
        if limit is not None and n > limit:
            raise GGUFError(f"{what} is {n} bytes long, at most {limit} allowed")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{what} is not valid UTF-8: {raw[:40]!r}") from None

    def skip_strings(self, count: int, what: str, *, keep: bool = False) -> List[bytes]:
        """Walk ``count`` strings; returns them (raw bytes) when ``keep``, else []."""
        buf, pos, size = self.buf, self.pos, self.size
        unpack = _U64.unpack_from
        out: List[bytes] = []
        add = out.append
        for i in range(count):
            if pos + 8 > size:
                raise GGUFError(f"truncated file: string {i} of {what} at byte {pos}")
            n = unpack(buf, pos)[0]
            pos += 8
            if n > size - pos:
                raise GGUFError(f"truncated file: string {i} of {what} ({n} bytes) runs past "
                                "the end")
            if keep:
                add(buf[pos:pos + n])
            pos += n
        self.pos = pos
        return out

    def scalar(self, t: int, what: str) -> Any:
        _, fmt, n = VALUE_TYPES[t]
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v


def _parse(buf, *, strings: bool = False) -> GGUFLayout:
    size = len(buf)
    if size < 4 or bytes(buf[:4]) != b"GGUF":
        raise GGUFError(f"not a GGUF file (bad magic {bytes(buf[:4])!r})")
    if size < 24:
        raise GGUFError(f"truncated GGUF header ({size} bytes)")
    w = _Walker(buf, 4)
    version = w.u32("version")
    if version not in (2, 3):
        raise GGUFError(f"unsupported GGUF version {version} (llama.cpp reads 2 and 3)")
    n_tensors = w.u64("tensor count")
    n_kv = w.u64("metadata count")
    # every tensor info takes at least 8+1+4+8+4+8 bytes, every KV at least 8+1+4+1
    if n_tensors > size // 33 or n_kv > size // 14:
        raise GGUFError(f"corrupt GGUF header: n_tensors={n_tensors}, n_kv={n_kv} cannot fit in "
                        f"{size} bytes")
    lay = GGUFLayout(size=size, version=version, n_tensors=n_tensors, n_kv=n_kv, buf=buf)
    for i in range(n_kv):
        start = w.pos
        key = w.string(f"key of metadata entry {i}", limit=1 << 16)
        if not key:
            raise GGUFError(f"metadata entry {i} has an empty key")
        if key in lay.kvs:
            raise GGUFError(f"duplicate metadata key {key!r}")
        type_off = w.pos
        t = w.u32(f"type of {key!r}")
        if t not in VALUE_TYPES:
            raise GGUFError(f"metadata {key!r} has invalid value type {t}")
        kv = KV(key=key, type=t, offset=start, type_offset=type_off, value_offset=w.pos, end=0)
        if t == T_ARRAY:
            at = w.u32(f"element type of {key!r}")
            if at not in VALUE_TYPES or at == T_ARRAY:
                raise GGUFError(f"metadata array {key!r} has invalid element type {at}")
            n = w.u64(f"length of {key!r}")
            kv.arr_type, kv.count, kv.data_offset = at, n, w.pos
            if at == T_STRING:
                if n > (size - w.pos) // 8:
                    raise GGUFError(f"metadata array {key!r} claims {n} strings, more than the "
                                    "file can hold")
                is_vocab = key == "tokenizer.ggml.tokens"
                if strings:
                    kv.value = [w.string(f"{key}[{j}]") for j in range(n)]
                    if is_vocab:
                        lay.tokens = [v.encode("utf-8") for v in kv.value]
                else:
                    raw = w.skip_strings(n, repr(key), keep=is_vocab)
                    if is_vocab:
                        lay.tokens = raw
            else:
                _, fmt, esz = VALUE_TYPES[at]
                if n > (size - w.pos) // esz:
                    raise GGUFError(f"metadata array {key!r} claims {n} elements of {esz} bytes, "
                                    "more than the file can hold")
                if n <= 4096 or strings:
                    kv.value = list(struct.unpack_from(f"<{n}{fmt[1]}", buf, w.pos))
                w.pos += n * esz
        elif t == T_STRING:
            kv.value = w.string(f"value of {key!r}", limit=1 << 26)
        else:
            kv.value = w.scalar(t, f"value of {key!r}")
        kv.end = w.pos
        lay.kvs[key] = kv
        lay.kv_list.append(kv)
    align = lay.kvs.get("general.alignment")
    if align is not None:
        if align.type != 4:
            raise GGUFError(f"general.alignment must be u32, is {VALUE_TYPES[align.type][0]}")
        if align.value == 0 or align.value & (align.value - 1):
            raise GGUFError(f"general.alignment {align.value} is not a power of 2")
        lay.alignment = align.value
    names = set()
    for i in range(n_tensors):
        start = w.pos
        name = w.string(f"name of tensor {i}", limit=1 << 16)
        dims_off = w.pos
        nd = w.u32(f"n_dims of tensor {name!r}")
        if not 1 <= nd <= MAX_DIMS:
            raise GGUFError(f"tensor {name!r} has {nd} dimensions (1..{MAX_DIMS} allowed)")
        w.need(8 * nd, f"dims of tensor {name!r}")
        dims = struct.unpack_from(f"<{nd}q", buf, w.pos)
        w.pos += 8 * nd
        type_off = w.pos
        tt = w.u32(f"type of tensor {name!r}")
        off_off = w.pos
        doff = w.u64(f"data offset of tensor {name!r}")
        lay.tensors.append(TensorInfo(name, tuple(dims), tt, doff, start, dims_off, type_off,
                                      off_off, w.pos))
        if name in names:
            raise GGUFError(f"duplicate tensor name {name!r}")
        names.add(name)
    lay.data_start = (w.pos + lay.alignment - 1) // lay.alignment * lay.alignment
    return lay


def parse_gguf(data, *, strings: bool = True) -> GGUFLayout:
    """The header, metadata and tensor infos of GGUF bytes (or a buffer), with field offsets."""
    return _parse(memoryview(data), strings=strings)
