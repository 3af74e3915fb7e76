"""Draft length: fixed, or adaptive by measured acceptance and measured cost."""
from typing import Any, Dict

class DraftPolicy:
    n_max: int
    adaptive: bool
    predicted_tokens: float
    predicted_time: float
    def __init__(self, n_max: int, adaptive: bool = ...) -> None: ...
    def state(self) -> Dict[str, Any]: ...
