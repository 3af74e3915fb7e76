"""The draft lengths of a round: cdef functions for the controller; from Python, a row's
price in a batch as a confidence floor (``row_floor_of``)."""
from ._policy import BatchCost

def row_floor_of(batch_cost: BatchCost, n_in: int) -> float: ...
