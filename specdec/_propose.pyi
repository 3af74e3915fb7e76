"""The round's drafting: a cdef function for the controller; from Python, the catch-up
split the batch's measured length uses (``sat_out_share``)."""
from typing import Iterable, Tuple

def sat_out_share(t_sync: float, rows: Iterable[Tuple[int, int, int]]) -> float: ...
