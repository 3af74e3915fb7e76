"""A cheaper MTP head: the target's NextN block and vocab projection, requantized.

One MTP draft step reads the whole head from memory: the NextN block and the
``n_vocab x n_embd`` output projection, which dominates (on the mid bigram
qwen35 in F16, 94 MB per step, ~6 ms on 2 cores when the target's decode has
evicted it from cache). Drafts only need the head's argmax to be *usually*
right, since the target verifies every one, so a Q8_0/Q4_0 copy of the head
drafts nearly as well at a fraction of the bandwidth. The copy is an MTP-only
GGUF (``token_embd``, ``output_norm``, ``output`` and the NextN block, like
``convert_hf_to_gguf.py --mtp-only``), written once with the ``gguf`` package
from the target's own tensors and cached next to the other specdec files.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .. import cache
from .._progress import progress

#: head types ``mtp:TYPE`` accepts, lower case, and the ggml type each writes
HEAD_TYPES = ("q8_0", "q5_0", "q4_0")
_BLK = re.compile(r"^blk\.(\d+)\.")
_FLOAT = {"F32", "F16", "BF16"}


def _qtype(name: str):
    import gguf

    try:
        return gguf.GGMLQuantizationType[name.upper()]
    except KeyError:
        raise ValueError(f"unknown MTP head type {name!r}; choose from {', '.join(HEAD_TYPES)}") from None


def derive_mtp_head_gguf(src: str | os.PathLike[str], head_type: str = "q4_0",
                         out: str | os.PathLike[str] | None = None) -> Path:
    """Write (once) an MTP-only GGUF of ``src`` with its matrices in ``head_type``.

    2-D weights whose rows fit the type's blocks are requantized (dequantized
    first when already quantized); norms, ``token_embd`` (read one row per token)
    and anything else are copied as they are.
    """
    import gguf
    from gguf.quants import dequantize, quantize

    if head_type.lower() not in HEAD_TYPES:
        raise ValueError(f"unknown MTP head type {head_type!r}; choose from {', '.join(HEAD_TYPES)}")
    qt = _qtype(head_type)
    src = Path(src)
    cached = out is None
    if out is None:
        out = cache.derived_path("mtp-head", qt.name.lower(),
                                 cache.content_key(src, "mtp-head", qt.name))
        if cache.lookup(out) is not None:
            return out
    out = Path(out)
    if not cached and out.exists():
        return out
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    n_block = int(reader.fields[f"{arch}.block_count"].contents())
    nextn = reader.fields.get(f"{arch}.nextn_predict_layers")
    n_nextn = int(nextn.contents()) if nextn else 0
    if n_nextn <= 0:
        raise ValueError(f"{src.name!r} has no MTP (NextN) layers to derive a head from")
    first_nextn = n_block - n_nextn
    block, _ = gguf.GGML_QUANT_SIZES[qt]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    w = gguf.GGUFWriter(tmp, arch)
    try:
        for name, field in reader.fields.items():
            if name.startswith("GGUF.") or name == "general.architecture":
                continue
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
        head = [t for t in reader.tensors
                if not ((m := _BLK.match(t.name)) and int(m.group(1)) < first_nextn)]  # no trunk
        for t in progress(iterable=head, desc=f"deriving the MTP head ({qt.name})", unit="tensor"):
            ttype = gguf.GGMLQuantizationType(t.tensor_type)
            requant = (len(t.shape) == 2 and t.name != "token_embd.weight"
                       and int(t.shape[0]) % block == 0 and ttype != qt)
            if not requant:
                w.add_tensor(t.name, t.data, raw_dtype=ttype)
                continue
            rows = int(t.shape[1])
            if ttype.name in _FLOAT:
                f = t.data.astype("float32").reshape(rows, -1)
            else:
                f = dequantize(t.data, ttype).reshape(rows, -1)
            q = quantize(f, qt)
            w.add_tensor(t.name, q, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    if cached:
        return cache.publish(tmp, out, source=src, kind="mtp-head", head_type=qt.name.lower())
    os.replace(tmp, out)
    return out
