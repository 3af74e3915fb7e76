# cython: language_level=3
"""Token translation between a draft model's vocabulary and the target's (see translate.pyx)."""
from libc.stdint cimport int32_t
from libcpp.string cimport string
from libcpp.vector cimport vector
from .._core cimport Model
from ._base cimport Draft


cdef class Translation:
    cdef readonly Model target
    cdef readonly Model draft
    cdef readonly str mode              # "ids" or "text"
    cdef vector[vector[int32_t]] ctx    # per sequence: draft tokens the draft context should hold
    cdef vector[int32_t] out            # the draft of the current propose, in target tokens
    cdef bint eog                       # the draft ended with its end-of-generation token

    cdef int bind(self, int n_seq) except -1
    cdef int begin(self, int seq) except -1
    cdef vector[int32_t] * observe(self, int seq, const int32_t * toks, int n) except NULL
    cdef vector[int32_t] * context(self, int seq, int32_t last) except NULL
    cdef int budget(self, int n_max) noexcept
    cdef int draft_start(self, int seq) except -1
    cdef int draft_add(self, int32_t y) except -2
    cdef int draft_finish(self, Draft out, int n_max) except -1


cdef class IdTranslation(Translation):
    cdef vector[int32_t] d2t            # draft id -> target id, -1: none
    cdef vector[int32_t] t2d_off        # target id -> draft ids t2d_ids[t2d_off[t]:t2d_off[t+1]]
    cdef vector[int32_t] t2d_ids
    cdef vector[int32_t] n_done         # per sequence: draft tokens of observed history

    cdef int _append(self, int seq, int32_t t) except -1


cdef class TextTranslation(Translation):
    cdef string tpiece                  # target token texts, concatenated (tpiece_off)
    cdef vector[int32_t] tpiece_off
    cdef vector[char] t_extends         # per target id: its text is a proper prefix of another's
    cdef string dpiece                  # draft token texts (control tokens: empty)
    cdef vector[int32_t] dpiece_off
    cdef vector[char] d_control
    cdef int32_t d_bos, t_bos, t_eos
    cdef int window
    cdef vector[string] text            # per sequence: the target's text (observed tokens)
    cdef vector[string] covered         # per sequence: the text ctx[seq] tokenizes
    cdef vector[vector[int32_t]] ends   # per sequence: each ctx token's end offset in covered
    cdef vector[int32_t] n_sure         # per sequence: covered[:n_sure] is observed text
    cdef string pending                 # bytes of the target text the draft context lacks
    cdef string dtext                   # text of the current draft
    cdef vector[int32_t] ttoks          # scratch: target tokens of dtext
    cdef vector[int32_t] scratch
    cdef int n_final                    # target tokens of dtext when the text ends there

    cdef int _sync(self, int seq, const string & full) except -1
    cdef int _add_text(self, int seq, const int32_t * toks, int n, string & dst) except -1
