import os
from typing import Optional, Union

from .._core import Context, Model
from ._base import Drafter
from .translate import Translation

PathLike = Union[str, "os.PathLike[str]"]

class DraftModelDrafter(Drafter):
    @property
    def draft_model(self) -> Optional[Model]: ...
    @property
    def draft_ctx(self) -> Optional[Context]: ...
    @property
    def translation(self) -> Optional[Translation]: ...
    @property
    def translate(self) -> Union[bool, str]: ...
    @translate.setter
    def translate(self, value: Union[bool, str, None]) -> None: ...
    def __init__(self, path: Union[PathLike, Model, None] = None, *, p_min: Optional[float] = None,
                 n_threads: Optional[int] = None, n_gpu_layers: Optional[int] = None,
                 name: str = "draft", translate: Union[bool, str] = False) -> None: ...
    def set_source(self, path: Union[PathLike, Model]) -> None: ...
