from typing import Any, Iterable, List, Tuple

from ._controller import Controller
from ._policy import DraftPolicy
from ._core import Context
from .drafters import Drafter

class CheckedController(Controller):
    def __init__(self, ctx: Context, drafters: Iterable[Drafter] = ..., *, check: bool = False,
                 unsafe_accept_all: bool = False, record: bool = False,
                 **settings: Any) -> None: ...
    @property
    def draft_log(self) -> List[Tuple[int, int, List[int], int]]: ...


class DrivenPolicy(DraftPolicy):
    def _py_cap(self) -> int: ...
    def _py_choose(self, proposed: int, t_drafted: float) -> int: ...
    def _py_observe(self, k: int, a: int, t_verify: float, t_drafted: float = ...) -> None: ...
    def _py_observe_round(self, predicted_tokens: float, predicted_time: float, tokens: int,
                          t: float) -> None: ...
