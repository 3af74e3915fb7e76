import os
from typing import Optional, Union

from .._core import Context, Model
from ._base import Drafter

PathLike = Union[str, "os.PathLike[str]"]

class DraftModelDrafter(Drafter):
    @property
    def draft_model(self) -> Optional[Model]: ...
    @property
    def draft_ctx(self) -> Optional[Context]: ...
    def __init__(self, path: Union[PathLike, Model, None] = None, *, p_min: Optional[float] = None,
                 n_threads: Optional[int] = None, n_gpu_layers: Optional[int] = None,
                 name: str = "draft") -> None: ...
    def set_source(self, path: Union[PathLike, Model]) -> None: ...
