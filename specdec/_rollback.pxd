# cython: language_level=3
"""How a target context's memory forgets a round's rejected drafts (see ``_rollback.pyx``)."""
from libc.stdint cimport uint32_t

from ._core cimport Context, Batch
from ._timing cimport Clock
from ._seq cimport _Seq


cdef class Rollback:
    cdef Context ctx
    cdef Clock * clock
    cdef bint exact
    cdef int cap_drafts(self, int k) noexcept
    cdef bint drops_rows(self) noexcept
    cdef bint pads_rows(self) noexcept
    cdef int pad(self, list seqs, int rows, int max_rows) except -1
    cdef list groups(self, list seqs, bint redo)
    cdef int before_decode(self, list group) except -1
    cdef int drop_padding(self, _Seq s) except -1
    cdef bint after_verify(self, _Seq s, int a) except -1
    cdef int decode_again(self, Batch batch, list group) except -1


cdef class TrimRollback(Rollback):
    pass


cdef class SnapshotRollback(Rollback):
    cdef int n_rollback


cdef class CheckpointRollback(Rollback):
    cdef uint32_t flags


cdef Rollback rollback_for(Context ctx, int n_max, bint exact)
