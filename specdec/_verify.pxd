# cython: language_level=3
from libc.stdint cimport int32_t
from libcpp.vector cimport vector
from ._core cimport Context
from ._sampling cimport SamplingParams, Rng, Distribution
from ._penalty cimport Penalty
from ._timing cimport Clock
from ._grammar cimport GrammarState
from .drafters._base cimport Draft


cdef class Verifier:
    cdef Context ctx
    cdef int n_vocab
    cdef Distribution dist
    cdef Clock * clock
    cdef Penalty pen         # the verified sequence's penalties and bias (None: none)
    cdef GrammarState grammar    # the verified sequence's grammar (None: unconstrained)
    cdef vector[int32_t] q_ids   # a draft position's distribution under the grammar
    cdef vector[float] q_probs
    cdef int v_end               # one past the last row of the verification under way (0: none)
    cdef int v_passes            # passes over the head _ready_rows made in it

    cdef float * row_logits(self, int row) except NULL
    cdef void _ready_rows(self, int row) noexcept nogil
    cdef int32_t sample(self, int row, bint greedy, const SamplingParams & sp, Rng rng,
                        const int32_t * before=*, int n_before=*) except -1
    cdef int greedy(self, int row0, Draft draft, int k, int32_t * y) except -1
    cdef int rejection(self, int row0, Draft draft, int k, const SamplingParams & sp, Rng rng,
                       int32_t * y) except -1
    cdef int _one_by_one(self, int row0, Draft draft, int k, bint greedy,
                         const SamplingParams & sp, Rng rng, int32_t * y) except -1
    cdef bint _row(self, int row0, Draft draft, int k, int a, bint greedy,
                   const SamplingParams & sp, Rng rng, int32_t * y) except -1
    cdef int _distribution(self, int row, const SamplingParams & sp, const int32_t * before,
                           int n_before) except -1
    cdef int prefetch(self, list seqs) except -1
    cdef int lockstep(self, list seqs) except -1
    cdef void _lap(self, int part) noexcept nogil
    cdef int ready(self, int row0, int a, int k, int n_ready) noexcept nogil
    cdef float _q(self, Draft draft, int pos, int32_t x) noexcept nogil
    cdef float _mask_q(self, Draft draft, int pos) except? -1
    # hooks for tests (specdec._checks overrides them); the defaults cost a virtual call
    cdef bint _accepts(self, double u, float px, float qx) noexcept
    cdef int _on_argmax(self, int row, int32_t y) except -1


cdef int set_sparse_head(int n) noexcept
cdef bint set_lockstep(bint on) noexcept
cdef bint sparse_rows(list seqs) except -1
