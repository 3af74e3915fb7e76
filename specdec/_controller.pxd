# cython: language_level=3
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libcpp.vector cimport vector

from ._core cimport Model, Context, Batch
from ._sampling cimport SamplingParams, Rng
from ._penalty cimport Penalty
from ._policy cimport DraftPolicy, BatchCost
from ._batch_budget cimport Acceptance
from ._timing cimport Clock, N_PARTS
from ._output cimport TextOutput
from ._verify cimport Verifier
from ._grammar cimport GrammarState
from .drafters._base cimport Draft, Asks


cdef enum DraftKind:
    NO_DRAFT = 0    # the round verifies the pending token only
    DRAFTED = 1     # a drafter's proposal (``proposer``: its index in the sequence's drafters)
    FILLER = 2      # exact mode: a free guess (the pending token again) filling the batch
    FORCED = 3      # the tokens the sequence's grammar forces, no drafter's proposal


cdef class _Seq:
    cdef int id
    cdef bint active         # joined, not left
    cdef int32_t last        # sampled, not yet in the target's memory
    cdef int n_past          # tokens in the target's memory
    cdef vector[int32_t] mem     # those tokens, by position (prefix reuse compares them)
    cdef int n_prompt, n_decoded  # prompt tokens, and how many of them were decoded (not reused)
    cdef bint prefilling     # joined, its prompt not all decoded yet (``prefill``)
    cdef vector[int32_t] prompt  # the prompt while prefilling
    cdef int n_filled        # prompt tokens in the memory so far
    cdef TextOutput out
    cdef Rng rng
    cdef SamplingParams sp
    cdef Penalty pen         # penalties and logit_bias (None: none)
    cdef bint greedy
    cdef list drafters       # the sequence's drafters, tried in order
    cdef int n_drafters
    cdef int n_min
    cdef DraftPolicy policy
    cdef Acceptance acc      # this request's own acceptance (the batch budget weighs it)
    cdef Draft draft
    cdef DraftKind kind
    cdef int proposer
    cdef GrammarState grammar    # what the output must match (None: anything)
    cdef int n_forced        # draft tokens the grammar forced this round (they lead it)
    cdef int row0            # batch index of ``last`` in the current verify batch (-1: none)
    cdef int k_want, k_cap   # this round: drafts the policy wants, and the cap asked for
    cdef double p_stop       # this round: the policy's confidence floor for the drafter
    cdef int k               # drafts in the current verify batch
    cdef int n_pad           # throw-away rows after them (exact mode)
    cdef double t_asked      # time spent drafting this round (catch-up left out)
    cdef double pred_e, pred_t   # the policy's prediction for the round (pred_t 0: none)
    cdef vector[uint8_t] ckpt    # recurrent state before the current verify (checkpoint archs)
    # a join with reuse: the prompt-end checkpoint of the sliding-window layers (_save_window),
    # their state after the prompt ``mem[:win_n]`` (0: none), holding positions ``win_start..``
    cdef bint reuse
    cdef vector[uint8_t] win_state
    cdef int win_n, win_start
    cdef double t_ckpt
    cdef bint redo           # a partial accept restored the checkpoint: decode again
    cdef int32_t prev        # the ``last`` of the current verify
    cdef int a               # drafts accepted in the current verify
    cdef double t_v          # the current verify's cost so far
    # this request's counters
    cdef int64_t rounds, drafted, accepted, draft_rounds, filler, redecodes
    cdef vector[int64_t] drafted_at, accepted_at
    cdef double t_prompt, t_gen
    cdef double t_part[5]


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
    cdef bint pad_equal      # exact mode on attention-only targets: equal rows per sequence
    cdef int rs_cap          # max rollback per round (n_rollback), -1 unlimited
    cdef bint ckpt           # roll back by state checkpoints (recurrent without n_rollback)
    cdef uint32_t ckpt_flags
    cdef Verifier verifier
    cdef BatchCost batch_cost    # each sequence's part of a verify batch's time, for its policy
    cdef Clock clock
    cdef Asks asks           # one drafter's asks of the round being drafted
    cdef vector[int32_t] scratch
    cdef dict defaults       # request settings of the constructor, for ``start``
    cdef readonly bint isolate   # a drafter error ends its sequence only (else it is raised)
    cdef dict errors         # seq -> the error that ended it (``isolate``)
    cdef list started        # the sequences of the last ``start`` (``stats()`` sums them)
    # totals since the last ``start`` / ``reset_stats``
    cdef int64_t n_rounds, n_drafted, n_accepted, n_draft_rounds, n_filler, n_redecode
    cdef vector[int64_t] drafted_at, accepted_at
    cdef double t_prompt, t_start, t_gen

    cdef _Seq _seq(self, int seq)
    cdef int _kept(self, const int32_t * held, int n_held, int pos_min, const int32_t * toks,
                   int n) noexcept
    cdef int _window_start(self, int seq) except? -2
    cdef int _save_window(self, _Seq s) except -1
    cdef int _prefill_chunk(self, _Seq s, int budget) except -1
    cdef bint _emit(self, _Seq s, int32_t tok, int row) except -1
    cdef int _propose(self, list seqs) except -1
    cdef bint _cost_line(self, int n_in, double * a, double * b) noexcept
    cdef int _budget_caps(self, list seqs) except -1
    cdef int _budget_rows(self, list seqs, double t_drafted) except -1
    cdef int _pad(self, list batch_seqs) except -1
    cdef int _shared_head(self, list in_batch) except -1
    cdef list _decode_groups(self, list seqs, bint redo)
    cdef int _decode_verify(self, list group) except -1
    cdef int _save_checkpoints(self, list group) except -1
    cdef int _redecode(self, list group) except -1
    cdef int _verify(self, _Seq s, double t_dec) except -1
    cdef int _observe_policy(self, _Seq s, int k, int a, int tokens) except -1
    cdef int _count(self, _Seq s, int k, int a) except -1
    # hook for tests (specdec._checks records verified drafts); the default does nothing
    cdef int _on_verified(self, _Seq s, int pos, int k, int a) except -1
