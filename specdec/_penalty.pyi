"""Type stubs for ``_penalty.pyx``: penalties and logit_bias on one verify row's logits."""
from typing import Iterable, Sequence, Tuple

import numpy as np
import numpy.typing as npt

class Penalty:
    def __init__(self, n_vocab: int, prompt: Sequence[int] = (), *, repetition: float = 1.0,
                 presence: float = 0.0, frequency: float = 0.0,
                 logit_bias: Iterable[Tuple[int, float]] = ()) -> None: ...
    def push_py(self, tok: int) -> None: ...
    def transform(self, logits: npt.ArrayLike, before: Sequence[int] = ()) -> np.ndarray: ...
    @property
    def is_active(self) -> bool: ...
