# cython: language_level=3
"""The draft lengths of a round (see ``_round_budget.pyx``)."""
from ._policy cimport BatchCost
from ._seq cimport _Seq


cdef int wanted(_Seq s, long round_id) except -1
cdef void observed(_Seq s, int k, int a) noexcept
cdef int observe_drafter(_Seq s, int k, int a, int tokens) except -1
cdef double expected_less_accepted(_Seq s) noexcept
cdef int draft_caps(BatchCost batch_cost, list seqs) except -1
cdef int draft_lengths(BatchCost batch_cost, list seqs, double t_drafted) except -1
cdef bint set_row_floor(bint on) noexcept
cdef bint set_shared_request_probe(bint on) noexcept
