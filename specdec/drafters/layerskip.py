"""Layer-skip self-drafting: the target's own first N layers as its draft model.

The draft GGUF is written with the ``gguf`` package from the target's own
tensors (first ``N`` blocks, the embeddings, the final norm and the output
head), so it needs no second checkpoint and shares the vocabulary exactly. It
is cached next to the other specdec files, keyed by the target file and N.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .. import cache
from .._core import Context
from .._progress import shown
from .draft_model import DraftModelDrafter

_BLK = re.compile(r"^blk\.(\d+)\.")
#: in the cache key: bumped when what a draft derived from the same file holds changes, so an
#: older draft is not reused (2: a vocabulary as long as the block count is kept whole, d266f9e)
FORMAT = 2


def derive_layerskip_gguf(src: str | os.PathLike[str], n_layers: int,
                          out: str | os.PathLike[str] | None = None) -> Path:
    """Write (once) a GGUF with the first ``n_layers`` blocks of ``src``; returns its path."""
    import gguf

    src = Path(src)
    cached = out is None
    if out is None:
        out = cache.derived_path("layerskip", f"L{n_layers}",
                                 cache.content_key(src, "layerskip", FORMAT, n_layers))
        if cache.lookup(out) is not None:
            return out
    out = Path(out)
    if not cached and out.exists():
        return out
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    n_block = int(reader.fields[f"{arch}.block_count"].contents())
    nextn = reader.fields.get(f"{arch}.nextn_predict_layers")
    n_trunk = n_block - (int(nextn.contents()) if nextn else 0)
    if n_trunk < 2:
        raise ValueError(f"layerskip:{n_layers}: the target has {n_trunk} layer; a layer-skip "
                         "draft keeps fewer layers than the target, so it needs 2 or more")
    if not 1 <= n_layers < n_trunk:
        raise ValueError(f"layerskip:{n_layers}: the target has {n_trunk} layers; keep 1..{n_trunk - 1}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    w = gguf.GGUFWriter(tmp, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name.endswith(".nextn_predict_layers"):
            continue
        vtype = field.types[0]
        value = field.contents()
        if name == f"{arch}.block_count":
            value = n_layers
        sub = None
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            # per-layer settings are the arch's own keys; a vocabulary (tokenizer.ggml.*)
            # as long as the block count is not one of them
            if name.startswith(f"{arch}.") and len(value) == n_block:
                value = value[:n_layers]
        w.add_key_value(name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        m = _BLK.match(t.name)
        if m and int(m.group(1)) >= n_layers:
            continue
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=shown())
    w.close()
    if cached:
        return cache.publish(tmp, out, source=src, kind="layerskip", n_layers=n_layers)
    os.replace(tmp, out)
    return out


class LayerSkipDrafter(DraftModelDrafter):
    """``layerskip:N``: draft with the target's first N layers (derived at bind time)."""

    def __init__(self, n_layers=None, *, p_min: float | None = None, n_threads=None):
        if n_layers is None:
            raise ValueError("layerskip needs the number of layers to keep: layerskip:N")
        self.n_layers = int(n_layers)
        super().__init__(None, p_min=p_min, n_threads=n_threads, name="layerskip")

    def bind(self, target: Context, n_seq: int = 1) -> None:
        self.set_source(str(derive_layerskip_gguf(target.model.path, self.n_layers)))
        super().bind(target, n_seq)

