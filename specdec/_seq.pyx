# cython: language_level=3
# distutils: language = c++
"""A sequence of the controller: one slot of the target context, and the request on it.

Its state comes in three parts, each with its own life:

- ``_SeqMemory``: what the target's memory holds for the slot (positions, the tokens by
  position, the prompt while it is decoded, rollback checkpoints, the prompt-end window a
  later request may cut back to). It outlives a request: prefix reuse keeps it.
- ``_SeqRequest``: what the request asked for (output limits and stops, sampling, penalties,
  grammar, drafters, draft-length policy). A ``join`` makes a new one.
- ``_SeqCounters``: what ``stats`` reports of it. A ``join`` makes new ones; the controller's
  totals are one more.

``_Seq`` holds the three and the state of the round in progress (the draft, its rows in the
verify batch, the accepted count), which the controller's modules (``_propose``,
``_round_budget``, ``_rollback``, ``_prefix_reuse``) read and write without Python.
"""
from libc.stdint cimport int64_t

from ._timing cimport T_TARGET, T_HEAD, T_DRAFT, T_VERIFY, T_CONTROL
from .drafters._base cimport Draft


cdef class _SeqMemory:
    """What the target's memory holds for one slot (see the module docstring)."""

    cdef void forget(self) noexcept:
        """The slot holds nothing (its cells were removed)."""
        self.tokens.clear()
        self.n_past = 0
        self.forget_window()

    cdef void forget_window(self) noexcept:
        self.win_n = 0
        self.win_state.clear()


cdef class _SeqRequest:
    """What a request asked for (see the module docstring); ``new_request`` makes it."""
    pass


cdef _SeqRequest new_request(Model model, prompt, list drafters, int max_tokens, seed,
                             float temperature, int top_k, float top_p, float min_p, stop,
                             stop_ids, int n_max, int n_min, DraftPolicy policy, int logprobs,
                             bint reuse, float repetition_penalty, float presence_penalty,
                             float frequency_penalty, logit_bias, GrammarState grammar):
    """A request of ``Controller.join``'s checked arguments, drafting with ``drafters`` (none:
    plain decoding, whatever ``n_max``); ``policy`` None: a fixed one of its own."""
    cdef _SeqRequest r = _SeqRequest()
    r.drafters = drafters
    r.n_drafters = len(drafters)
    r.model_drafter = r.n_drafters > 0 and bool(drafters[0].has_model)
    if r.n_drafters == 0:
        n_max = 0
    r.policy = policy if policy is not None else DraftPolicy(n_max)
    r.acc = Acceptance(n_max)
    r.acc.begin(r.policy)
    r.n_min = n_min
    r.greedy = temperature <= 0.0
    r.sp.temperature = temperature
    r.sp.top_k = top_k
    r.sp.top_p = top_p
    r.sp.min_p = min_p
    r.rng = Rng(seed)
    r.pen = Penalty(model.n_vocab, prompt, repetition=repetition_penalty,
                    presence=presence_penalty, frequency=frequency_penalty,
                    logit_bias=logit_bias)
    if not r.pen.active:
        r.pen = None
    r.grammar = grammar
    r.out = TextOutput(model, max_tokens, stop, logprobs, stop_ids)
    r.reuse = reuse
    return r


cdef class _SeqCounters:
    """One request's counters, or the controller's totals (``stats``)."""

    cdef void clear(self) noexcept:
        cdef int i
        self.n_prompt = self.n_decoded = 0
        self.rounds = self.drafted = self.accepted = self.draft_rounds = 0
        self.filler = self.redecodes = 0
        self.drafted_at.clear()
        self.accepted_at.clear()
        self.t_prompt = self.t_gen = 0.0
        for i in range(5):
            self.t_part[i] = 0.0

    cdef void count(self, int k, int a) noexcept:
        """A verified draft of ``k`` tokens, ``a`` of them accepted."""
        cdef int i
        self.draft_rounds += 1
        self.drafted += k
        self.accepted += a
        if <int>self.drafted_at.size() < k:
            self.drafted_at.resize(k, 0)
            self.accepted_at.resize(k, 0)
        for i in range(k):
            self.drafted_at[i] += 1
            if i < a:
                self.accepted_at[i] += 1

    cdef dict stats(self, int64_t n_gen, int n_seqs, const double * part):
        """The counters as plain Python values, for ``n_seqs`` requests that generated
        ``n_gen`` tokens; ``part``: the time per part of the round (``_timing.Part``)."""
        cdef double t_gen = max(self.t_gen, 1e-9)
        cdef int64_t drafted = self.drafted
        return {
            "n_prompt": self.n_prompt,
            "n_prompt_decoded": self.n_decoded,
            "n_generated": n_gen,
            "rounds": self.rounds,
            "draft_rounds": self.draft_rounds,
            "filler_rounds": self.filler,
            "redecodes": self.redecodes,
            "drafted": drafted,
            "accepted": self.accepted,
            "acceptance_rate": (<double>self.accepted / drafted) if drafted else None,   # not measured
            "drafted_per_position": [self.drafted_at[i] for i in range(self.drafted_at.size())],
            "accepted_per_position": [self.accepted_at[i] for i in range(self.accepted_at.size())],
            "t_prompt_s": self.t_prompt,
            "t_generate_s": t_gen,
            "t_target_s": part[<int>T_TARGET],
            "t_lm_head_s": part[<int>T_HEAD],
            "t_draft_s": part[<int>T_DRAFT],
            "t_verify_s": part[<int>T_VERIFY],
            "t_controller_s": part[<int>T_CONTROL],
            # the first token comes from the prompt pass; the rest from rounds
            "tokens_per_s": (max(n_gen - n_seqs, 0) / t_gen) if n_gen else 0.0,
        }


cdef class _Seq:
    """One slot and the request on it (see the module docstring)."""

    def __cinit__(self):
        self.mem = _SeqMemory()
        self.cnt = _SeqCounters()
        self.draft = Draft()
        self.row0 = -1


cdef bint emit(_Seq s, Context ctx, int32_t tok, int row) except -1:
    """Append one token to the sequence's output (its logits at ``ctx``'s ``row``, where it
    keeps logprobs); True when it is finished. The first token of a prompt and each of a
    round's tokens go out so."""
    if s.req.pen is not None:
        s.req.pen.push(tok)
    return s.req.out.push(tok, ctx.logits_c(row) if s.req.out.n_top >= 0 else NULL)
