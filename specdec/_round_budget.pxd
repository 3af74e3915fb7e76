# cython: language_level=3
"""The draft lengths of a round (see ``_round_budget.pyx``)."""
from ._policy cimport BatchCost


cdef int draft_caps(BatchCost batch_cost, list seqs) except -1
cdef int draft_lengths(BatchCost batch_cost, list seqs, double t_drafted) except -1
cdef bint set_row_floor(bint on) noexcept
