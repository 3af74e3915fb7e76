from typing import Optional

from ._base import Drafter

class NgramDrafter(Drafter):
    @property
    def n(self) -> int: ...
    @property
    def n_min_key(self) -> int: ...
    def __init__(self, n: int = 3, *, n_min_key: Optional[int] = None,
                 name: str = "ngram") -> None: ...
