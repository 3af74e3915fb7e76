from typing import Any, Sequence

from .mtp import MtpDrafter
from .suffix import SuffixDrafter

class ChainedHeadsMtpDrafter(MtpDrafter):
    def __init__(self, path: Any = None, *, chain_heads: int = 2, **options: Any) -> None: ...

def suffix_count(d: SuffixDrafter, tokens: Sequence[int], seq: int = -1) -> int: ...
def check_suffix_tree(d: SuffixDrafter, seq: int = -1) -> None: ...
