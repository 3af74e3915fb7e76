"""How llama.cpp splits a verify batch into ubatches, and the padding that keeps it whole."""
from typing import Optional, Sequence

def ubatches(rows: Sequence[int], ids: Optional[Sequence[int]] = None, *, sequential: bool = True,
             keep_tail: int = 0, n_ubatch: int = 512) -> int: ...
def padding_height(rows: Sequence[int], ids: Optional[Sequence[int]] = None, *,
                   sequential: bool = True, keep_tail: int = 0, n_ubatch: int = 512,
                   a: float = 1.0, b: float = 1.0, max_rows: int = 1 << 20) -> int: ...
