from typing import Any, Iterable, List, Tuple

from ._controller import Controller
from ._core import Context
from .drafters import Drafter

class CheckedController(Controller):
    def __init__(self, ctx: Context, drafters: Iterable[Drafter] = ..., *, check: bool = False,
                 unsafe_accept_all: bool = False, record: bool = False,
                 **settings: Any) -> None: ...
    @property
    def draft_log(self) -> List[Tuple[int, int, List[int], int]]: ...
