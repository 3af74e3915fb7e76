"""A request's prompt into the target: the join's start, the chunks, the first token (cdef
methods only; the controller's ``join``, ``prefill`` and ``prefill_together`` drive it)."""
from ._core import Batch, Context
from ._prefix_reuse import PrefixReuse
from ._rollback import Rollback
from ._seq import _SeqCounters

class Prefill:
    def __init__(self, ctx: Context, batch: Batch, exact: bool, rollback: Rollback,
                 prefix: PrefixReuse, totals: _SeqCounters) -> None: ...
