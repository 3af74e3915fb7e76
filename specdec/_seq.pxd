# cython: language_level=3
"""A sequence of the controller, as its modules share it (see ``_seq.pyx``)."""
from libc.stdint cimport int32_t, int64_t, uint8_t
from libcpp.vector cimport vector

from ._core cimport Model, Context
from ._sampling cimport SamplingParams, Rng
from ._penalty cimport Penalty
from ._policy cimport DraftPolicy
from ._batch_budget cimport Acceptance
from ._output cimport TextOutput
from ._grammar cimport GrammarState
from .drafters._base cimport Draft


cdef enum DraftKind:
    NO_DRAFT = 0    # the round verifies the pending token only
    DRAFTED = 1     # a drafter's proposal (``proposer``: its index in the sequence's drafters)
    FILLER = 2      # exact mode: a free guess (the pending token again) filling the batch
    FORCED = 3      # the tokens the sequence's grammar forces, no drafter's proposal


cdef class _SeqMemory:
    cdef int n_past              # tokens in the target's memory
    cdef vector[int32_t] tokens  # those tokens, by position (prefix reuse compares them)
    cdef vector[int32_t] prompt  # the prompt while prefilling
    cdef int n_filled            # prompt tokens in the memory so far
    cdef vector[uint8_t] ckpt    # recurrent state before the current verify (checkpoint rollback)
    # a join with reuse: the prompt-end checkpoint of the sliding-window layers
    # (``_prefix_reuse``), their state after the prompt ``tokens[:win_n]`` (0: none), holding
    # positions ``win_start..``
    cdef vector[uint8_t] win_state
    cdef int win_n, win_start
    cdef void forget(self) noexcept
    cdef void forget_window(self) noexcept


cdef class _SeqRequest:
    cdef TextOutput out          # max_tokens, stop strings and ids, logprobs; the text so far
    cdef Rng rng
    cdef SamplingParams sp
    cdef bint greedy
    cdef Penalty pen             # penalties and logit_bias (None: none)
    cdef GrammarState grammar    # what the output must match (None: anything)
    cdef list drafters           # the sequence's drafters, tried in order
    cdef int n_drafters
    cdef bint model_drafter      # its first drafter has a model (drafts a batch per decode)
    cdef int n_min
    cdef DraftPolicy policy
    cdef Acceptance acc          # this request's own acceptance (the batch budget weighs it)
    cdef bint probe_owed         # its sequence is due a probe of its own while its policy
                                 # drafts nothing (``_round_budget.wanted``)
    cdef bint reuse              # joined with prefix reuse


cdef _SeqRequest new_request(Model model, prompt, list drafters, int max_tokens, seed,
                             float temperature, int top_k, float top_p, float min_p, stop,
                             stop_ids, int n_max, int n_min, DraftPolicy policy, int logprobs,
                             bint reuse, float repetition_penalty, float presence_penalty,
                             float frequency_penalty, logit_bias, GrammarState grammar)


cdef class _SeqCounters:
    cdef int64_t n_prompt, n_decoded  # prompt tokens, and how many of them were decoded
    cdef int64_t rounds, drafted, accepted, draft_rounds, filler, redecodes
    cdef vector[int64_t] drafted_at, accepted_at
    cdef double t_prompt, t_gen
    cdef double t_part[5]
    cdef void clear(self) noexcept
    cdef void count(self, int k, int a) noexcept
    cdef dict stats(self, int64_t n_gen, int n_seqs, const double * part)


cdef class _Seq:
    cdef int id
    cdef bint active             # joined, not left
    cdef bint prefilling         # joined, its prompt not all decoded yet (``prefill``)
    cdef _SeqMemory mem
    cdef _SeqRequest req
    cdef _SeqCounters cnt
    # the round
    cdef int32_t last            # sampled, not yet in the target's memory
    cdef Draft draft
    cdef DraftKind kind
    cdef int proposer
    cdef int n_forced            # draft tokens the grammar forced this round (they lead it)
    cdef int n_lead              # forced tokens its drafter was given as context this round
                                 # (its proposal follows them; ``_propose``)
    cdef int row0                # batch index of ``last`` in the current verify batch (-1: none)
    cdef int k_want, k_cap       # drafts the policy wants, and the cap asked for
    cdef bint probe              # this round is its request's own probe: it verifies what it
                                 # drafted, as its policy's probes do
    cdef int k_lim               # the round's limits on drafts (tokens left, context, rows)
    cdef bint batch_len          # the cap is the batch's measured length (``_batch_length``):
                                 # every draft is verified, the policy does not cut it
    cdef int k_room              # the most a grammar's forced tokens may take (the round's
                                 # limits, not the policy's cap: they are free and accepted)
    cdef double p_stop           # the policy's confidence floor for the drafter
    cdef int k                   # drafts in the current verify batch
    cdef int n_pad               # throw-away rows after them (exact mode)
    cdef double t_asked          # time spent drafting this round (catch-up left out)
    cdef double t_caught         # its part of the drafters' catch-up this round (a probe's cost)
    cdef double t_caught_out     # ... of which the rows its drafters sat out (plain rounds), not
                                 # its prompt (``_propose.sat_out_part``)
    cdef int n_asked_at          # ``mem.n_past`` when its drafters were last asked for a draft
                                 # (-1: not yet in this request: its prompt is still to catch up)
    cdef double pred_e, pred_t   # the policy's prediction for the round (pred_t 0: none)
    cdef double t_ckpt           # saving the checkpoint of this round (checkpoint rollback)
    cdef bint redo               # a partial accept restored the checkpoint: decode again
    cdef int32_t prev            # the ``last`` of the current verify
    cdef int a                   # drafts accepted in the current verify
    cdef bint verified           # ``a`` and ``y`` are its outcome already (a grammar's
    cdef int32_t y               # sequences, verified in lockstep: ``Verifier.lockstep``)
    cdef double t_v              # the current verify's cost so far


cdef bint emit(_Seq s, Context ctx, int32_t tok, int row) except -1
