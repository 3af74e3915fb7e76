# cython: language_level=3
"""A single request's verify batches kept to one shape (see ``_steady_rows.pyx``)."""
from ._core cimport Context
from ._rollback cimport Rollback
from ._seq cimport _Seq

cdef int set_steady(int mode) noexcept
cdef int steady_for(Context ctx, bint exact) except -1
cdef int steady_height(Rollback rollback, _Seq s, int n_ctx_seq) except -1
