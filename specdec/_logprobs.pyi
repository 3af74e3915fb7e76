from typing import List, Tuple

import numpy.typing as npt

def logprobs(logits: npt.ArrayLike, token: int, n_top: int = 0
             ) -> Tuple[float, List[Tuple[int, float]]]: ...
