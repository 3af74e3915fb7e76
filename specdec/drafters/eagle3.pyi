import os
from typing import Dict, Optional, Tuple, Union

from .._core import Context, Model
from ._target_fed import TargetFedDrafter

PathLike = Union[str, "os.PathLike[str]"]

class Eagle3Drafter(TargetFedDrafter):
    @property
    def draft_model(self) -> Optional[Model]: ...
    @property
    def draft_ctx(self) -> Optional[Context]: ...
    @property
    def layers(self) -> Optional[Tuple[int, ...]]: ...
    def __init__(self, path: Union[PathLike, Model, None] = None, *,
                 p_min: Optional[float] = None, n_threads: Optional[int] = None,
                 n_gpu_layers: Optional[int] = None, name: str = "eagle3") -> None: ...
    def counters(self) -> Dict[str, int]: ...
