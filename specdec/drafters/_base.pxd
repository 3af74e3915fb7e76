# cython: language_level=3
"""The drafter interface as the controller sees it (C-level hooks)."""
from libc.stdint cimport int32_t
from libcpp.vector cimport vector
from .._core cimport Context, Model, TargetView


cdef class Draft:
    """One proposal: tokens, and optionally a sparse draft distribution per token."""
    cdef vector[int32_t] tokens
    cdef vector[int32_t] q_ids      # ids of position i: q_ids[q_off[i]:q_off[i+1]]
    cdef vector[float] q_probs
    cdef vector[int32_t] q_off
    cdef bint has_probs
    cdef void clear(self) noexcept nogil


cdef class Asks:
    """One round's draft requests to one drafter: per sequence its last token, cap and
    confidence floor, and the Draft its answer goes into."""
    cdef vector[int] seq
    cdef vector[int32_t] last
    cdef vector[int] n_max
    cdef vector[double] p_stop
    cdef list drafts                # Draft per ask
    cdef list errors                # per ask: None, or what failed its draft (``isolate``)
    cdef bint isolate               # an error fails its asks only (else it is raised)
    cdef double t_sync              # seconds the drafter spent catching up, not drafting
    cdef int n(self) noexcept
    cdef int clear(self) except -1
    cdef int add(self, int seq, int32_t last, int n_max, double p_stop, Draft out) except -1
    cdef int fail(self, int j, object e) except -1


cdef class TokenHistory:
    """One sequence's tokens; Python reads them through read-only buffer views."""
    cdef vector[int32_t] v
    cdef int n_exports              # buffer views alive: while any is, the storage never moves
    cdef int n_lent                 # tokens at its end lent for one propose call (not observed)


cdef class Drafter:
    cdef public str name
    cdef readonly int n_vocab
    cdef Context _target                # the target itself, for C-level drafters
    cdef readonly TargetView target     # what Python code of a drafter sees (read only)
    cdef list _hists                    # per sequence: TokenHistory of prompt + accepted tokens
    cdef readonly int n_max             # the longest draft asked for (configure)
    cdef readonly double p_min          # stop a draft below this probability (configure)
    cdef bint _p_min_given              # p_min was given to the drafter: configure keeps it
    cdef public object n_gpu_layers     # a drafter's own model: its layers on devices (has_model)
    cdef readonly int observe_row       # during observe: the batch row of its first token, else -1
    cdef bint _py_begin, _py_observe, _py_propose, _py_accept, _py_reset, _py_propose_batch
    cdef double p_stop                  # this round: the adaptive policy's confidence floor
                                        # (drafters that know their draft's probability
                                        # stop below max(p_min, p_stop); 0: none)
    cdef bint drafts_past_forced        # its C ``_propose`` reads the history and the pending
                                        # token, and keeps nothing of the tokens past
                                        # ``n_observed``: the round may lend it a grammar's
                                        # forced tokens while it proposes (``lend_hist``,
                                        # ``_propose.pyx``)
    cdef double t_sync                  # seconds of the last propose_c spent catching up with
                                        # history rather than drafting (the policy leaves it out)

    cdef int _set_p_min(self, value, double default) except -1
    cdef int _bind_hooks(self) except -1
    cdef int _grow(self, int seq) except -1
    cdef vector[int32_t] * hist(self, int seq) except NULL
    cdef int n_hist_seqs(self) noexcept
    cdef int _clear_hist(self, int seq) except -1
    cdef int _append_hist(self, int seq, const int32_t * toks, int n) except -1
    cdef int lend_hist(self, int seq, int32_t last, const int32_t * forced, int n) except -1
    cdef int take_back_hist(self, int seq) except -1
    cdef int n_observed(self, int seq) except -1
    cdef int bind_c(self, Context target, int n_seq) except -1
    cdef Model own_model(self, object source, Model target, bint load_mtp=*)

    # the controller calls these; they apply the dispatch rule (never overridden)
    cdef int begin_c(self, int seq, const int32_t * toks, int n) except -1
    cdef int observe_c(self, int seq, const int32_t * toks, int n, int row0) except -1
    cdef int propose_c(self, int seq, int32_t last, int n_max, Draft out) except -1
    cdef int propose_batch_c(self, Asks asks) except -1
    cdef int accept_c(self, int seq, int n_accepted) except -1
    cdef int reset_c(self, int seq) except -1

    # built-in drafters implement these
    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1
    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1
    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1
    cdef int _propose_batch(self, Asks asks) except -1
    cdef int _accept(self, int seq, int n_accepted) except -1
    cdef int _reset(self, int seq) except -1
