"""Prefix reuse: what a join keeps of what its slot held."""
from typing import Optional

import numpy as np

from ._core import Context

class HeldState:
    tokens: np.ndarray
    state: bytes
    window_start: int
    win_n: int
    win_start: int
    win_state: Optional[bytes]
    @property
    def nbytes(self) -> int: ...


class PrefixReuse:
    def __init__(self, ctx: Context, n_swa: int, exact: bool) -> None: ...
