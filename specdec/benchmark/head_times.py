"""The LM head alone, on both paths: the lazy head (``_lm_head.h``) and llama.cpp's head in
the graph, timed on the case's target by :func:`specdec.head_choice.measure` (what
``lazy_logits="auto"`` chooses by), so a run says which head this machine favours and by
how much, apart from everything else a decode does."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:
    from .._core import Model

#: the verify batch timed beside the plain step: a draft of 4 and its bonus row
VERIFY_ROWS = 5


def time_heads(model: "Model", threads: int, n_ctx: int) -> Optional[Dict[str, Any]]:
    """Milliseconds of a decode with its logits ready, per head and shape, and the head
    ``auto`` keeps for these timings; None where the lazy head cannot serve the model."""
    from .. import api, head_choice   # (the report renders saved results without the runtime)
    with api.Decoder(model, lazy_logits=True, n_ctx=n_ctx, n_threads=threads) as dec:
        t = head_choice.measure(dec.ctx, plain_rows=1, verify_rows=VERIFY_ROWS)
    if t is None:
        return None
    return {"lazy_1_ms": t.lazy_plain * 1e3, "graph_1_ms": t.graph_plain * 1e3,
            f"lazy_{VERIFY_ROWS}_ms": t.lazy_verify * 1e3,
            f"graph_{VERIFY_ROWS}_ms": t.graph_verify * 1e3,
            "faster": "lazy" if t.lazy_wins else "llama.cpp"}


def head_line(h: Dict[str, Any]) -> str:
    """One line of the report for a case's :func:`time_heads`."""
    v = VERIFY_ROWS
    return (f"LM head alone (ms per decode with its logits ready; lazy / llama.cpp's in the "
            f"graph): 1 row {h['lazy_1_ms']:.2f} / {h['graph_1_ms']:.2f}, {v} rows "
            f"{h[f'lazy_{v}_ms']:.2f} / {h[f'graph_{v}_ms']:.2f}; faster here: {h['faster']}.")
