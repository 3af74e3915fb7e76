# cython: language_level=3
from libc.stdint cimport int32_t
from libcpp.vector cimport vector

from ._core cimport Model, Context, Batch
from ._policy cimport BatchCost
from ._batch_floor cimport BatchFloor
from ._batch_length cimport BatchLength
from ._timing cimport Clock
from ._verify cimport Verifier
from ._seq cimport _Seq, _SeqCounters
from ._rollback cimport Rollback
from ._prefix_reuse cimport PrefixReuse
from ._prefill cimport Prefill
from .drafters._base cimport Asks


cdef class Controller:
    cdef readonly Context ctx
    cdef readonly Model model
    cdef list drafters
    cdef Batch batch
    cdef list seqs
    cdef readonly int n_ctx_seq
    cdef readonly int n_swa      # attention-only target with sliding-window layers: their window
    cdef readonly int max_rows   # rows a verify batch may hold (one ubatch with a window cache)
    cdef bint exact
    cdef readonly bint steady    # a lone sequence's verify rows held to one shape (``_steady_rows``)
    cdef Rollback rollback       # how the target's memory forgets rejected drafts
    cdef PrefixReuse prefix      # what a join keeps of what its slot held
    cdef Prefill prompts         # a joined request's prompt into the target (``_prefill``)
    cdef Verifier verifier
    cdef BatchCost batch_cost    # each sequence's part of a verify batch's time, for its policy
    cdef readonly BatchFloor floor   # the batch's rounds with drafts against those without
    cdef readonly BatchLength length # the measured draft length of a batch with a model drafter
    cdef Clock clock
    cdef Asks asks               # one drafter's asks of the round being drafted
    cdef vector[int32_t] scratch
    cdef readonly bint isolate   # a drafter error ends its sequence only (else it is raised)
    cdef dict errors             # seq -> the error that ended it (``isolate``)
    cdef _SeqCounters totals     # over every request since the controller began (``stats()``)

    cdef _Seq _seq(self, int seq)
    cdef int _pad(self, list batch_seqs) except -1
    cdef int _decode_verify(self, list group) except -1
    cdef int _decode_again(self, list group) except -1
    cdef int _verify(self, _Seq s, double t_dec) except -1
    cdef int _observe_policy(self, _Seq s, int k, int a, int tokens) except -1
    cdef int _count(self, _Seq s, int k, int a) except -1
    # hook for tests (specdec._checks records verified drafts); the default does nothing
    cdef int _on_verified(self, _Seq s, int pos, int k, int a) except -1
