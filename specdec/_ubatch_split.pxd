# cython: language_level=3
"""How llama.cpp splits a verify batch into ubatches (see ``_ubatch_split.pyx``)."""
from libcpp.vector cimport vector

from ._policy cimport BatchCost
from ._rollback cimport Rollback


cdef int count_ubatches(const vector[int] & rows, const vector[int] & ids, bint sequential,
                        int keep_tail, int n_ubatch) noexcept
cdef int pad_height(const vector[int] & rows, const vector[int] & ids, bint sequential,
                    int keep_tail, int n_ubatch, double a, double b, int max_rows) noexcept
cdef int even_rows(Rollback rollback, BatchCost batch_cost, list seqs, int max_rows) except -1
