# cython: language_level=3
"""A request's prompt into the target (see ``_prefill.pyx``)."""
from libc.stdint cimport int32_t
from libcpp.vector cimport vector

from ._core cimport Context, Batch
from ._verify cimport Verifier
from ._seq cimport _Seq, _SeqCounters
from ._rollback cimport Rollback
from ._prefix_reuse cimport PrefixReuse


cdef class Prefill:
    cdef Context ctx
    cdef Batch batch             # the controller's: a prompt's chunks and a round never share it
    cdef bint exact              # a prompt's rows decoded as when it runs alone
    cdef Rollback rollback       # whether a throw-away row can be dropped
    cdef PrefixReuse prefix      # the prompt-end window saved for a later join
    cdef _SeqCounters totals     # the controller's totals, which the prompts add to

    cdef int start(self, _Seq s, const vector[int32_t] & toks, int c, double t0) except -1
    cdef int chunks(self, list ss, int budget, Verifier verifier) except -1
    cdef int prompt_in(self, _Seq s, int row, Verifier verifier) except -1
