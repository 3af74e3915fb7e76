# cython: language_level=3
from libc.stdint cimport int32_t
from libcpp.string cimport string
from libcpp.vector cimport vector
from ._core cimport Model

cpdef enum Finish:
    RUNNING = 0
    STOP_EOG = 1      # the model's end-of-generation token
    STOP_STRING = 2   # a stop string or a stop token id
    LENGTH = 3        # max_tokens
    CTX_FULL = 4      # the sequence filled its context
    FAILED = 5        # its drafter failed (the controller keeps the error)


cdef class TextOutput:
    cdef Model model
    cdef vector[string] stops
    cdef vector[int32_t] stop_ids  # tokens that end the sequence, as its EOG tokens do
    cdef readonly int max_tokens
    cdef readonly int finish
    cdef vector[int32_t] tokens
    cdef vector[size_t] ends      # text length after each token of ``tokens``
    cdef string text
    cdef size_t n_taken           # tokens released by ``take``
    cdef size_t text_taken        # bytes released by ``take``
    cdef readonly int n_top       # logprobs: -1 none, else the top-k alternatives kept
    cdef vector[float] lp         # per token: its logprob
    cdef vector[int32_t] top_ids  # per token: n_top ids, best first
    cdef vector[float] top_lp

    cdef bint push(self, int32_t tok, const float * logits) except -1
    cdef size_t _held(self) noexcept
    cdef void _truncate(self, size_t n) noexcept
