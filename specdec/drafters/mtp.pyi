import os
from typing import Dict, Literal, Optional, Union

from .._core import Context, Model
from ._target_fed import TargetFedDrafter

PathLike = Union[str, "os.PathLike[str]"]
#: requantized copies of the target's own head (``mtp:q8_0`` ...), derived into the cache
HeadType = Literal["q8_0", "q5_0", "q4_0"]

class MtpDrafter(TargetFedDrafter):
    @property
    def mtp_model(self) -> Optional[Model]: ...
    @property
    def mtp_ctx(self) -> Optional[Context]: ...
    @property
    def n_heads(self) -> int: ...
    def __init__(self, path: Union[HeadType, PathLike, Model, None] = None, *,
                 p_min: Optional[float] = None, n_threads: Optional[int] = None,
                 n_gpu_layers: Optional[int] = None, name: str = "mtp") -> None: ...
    def counters(self) -> Dict[str, Union[int, float]]: ...
