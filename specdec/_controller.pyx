# cython: language_level=3
# distutils: language = c++
"""The speculative controller: draft -> verify -> accept -> rollback -> notify.

Long because the round and the request lifecycle are one cdef class sharing the per-sequence
state (verification, text output and the test hooks live in ``_verify``, ``_output``,
``_checks``); the split along its seams (rollback strategy, sequence state, prefix reuse) is
issue 28's open part.

One loop for every drafter, and for plain decoding (no drafter: every round
verifies just the pending token). Built-in drafters are called through their C
hooks, so a round enters Python only for Python drafters.

The controller holds one sequence per slot of the target context. A request joins a
free slot (``join``: its prompt is decoded, reusing the KV of a common prefix the
slot still holds) and leaves it (``leave``) between rounds; every round (``step``)
verifies all running sequences in one batched decode. Each sequence has its own
sampling, stop strings, ``max_tokens``, drafters, draft-length policy and logprobs.

Per sequence, ``last`` is the token sampled but not yet in the target's memory,
and ``n_past`` the number of tokens that are. A round decodes
``[last, d1..dk]`` at ``n_past..``, keeps ``last, d1..da`` for the ``a`` drafts
the target agrees with (``_verify.Verifier``), emits ``d1..da`` and the target's own
next token (``_output.TextOutput``), and removes the rest from the target's memory.

Recurrent and hybrid targets without partial rollback (mamba2, rwkv, jamba,
qwen3next, ...) roll back by checkpoint: the sequence's recurrent state is saved
before a verify that holds drafts; on a partial accept it is restored, the
attention KV trimmed, and ``last, d1..da, y`` decoded again (see ``_redecode``).

Requests are validated by the API (``specdec._request``); below it, assertions.

"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libcpp.vector cimport vector

import numpy as np

from ._core cimport Model, Context, Batch
from ._llama cimport LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from ._sampling cimport SamplingParams, Rng, argmax
from ._penalty cimport Penalty
from ._policy cimport DraftPolicy, BatchCost
from ._batch_budget cimport Acceptance, allocate
from ._timing cimport Clock, now, lap, T_TARGET, T_HEAD, T_DRAFT, T_VERIFY, T_CONTROL, N_PARTS
from ._output cimport TextOutput, RUNNING, CTX_FULL, FAILED
from ._verify cimport Verifier
from ._grammar cimport GrammarState
from .drafters._base cimport Drafter, Draft, Asks


DEF MARGIN = 0.02     # a draft row must raise the round's token rate by this much (the budget)


def new_policy(int n_max, bint adaptive=False) -> DraftPolicy:
    """A draft-length policy (shared by the requests of one configuration, it keeps learning)."""
    return DraftPolicy(n_max, adaptive=adaptive)


cdef class _Seq:
    pass


cdef class HeldState:
    """What a free slot held, saved by ``Controller.save_held`` for a prompt cache: its
    tokens, the target's state of them, and, with sliding-window layers, the first position
    that state's window holds and the prompt-end checkpoint of the window (``_save_window``),
    which serves a join that cuts back to the prompt's end."""
    cdef readonly object tokens     # int32 array
    cdef readonly bytes state
    cdef readonly int window_start
    cdef readonly int win_n, win_start
    cdef readonly bytes win_state

    @property
    def nbytes(self) -> int:
        return len(self.state) + (len(self.win_state) if self.win_state is not None else 0)


cdef class Controller:
    """Controller(ctx, drafters=(), *, n_max=0, n_min=0, adaptive=False, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, stop=(), exact=False, policy=None, n_ctx_seq=0)
--

    Runs generation for the sequences of a target context.

    ``drafters``: every drafter a sequence may use, bound to ``ctx``. ``exact``: no row's
    logits depend on the batch (see ``_pad``). ``n_ctx_seq``: the tokens a sequence may
    hold (default: the context's own limit; a caller that leaves slack for exact mode's
    padding rows passes less). ``isolate``: an error of a sequence's drafter while it drafts
    ends that sequence only (``finish_reason`` "error", ``error(seq)``), where a single caller
    would rather see it raised. The request settings (``n_max`` .. ``stop``, ``policy``)
    are the defaults of ``start``; ``join`` takes its own.
    """

    def __init__(self, Context ctx not None, drafters=(), *, int n_max=0, int n_min=0,
                 bint adaptive=False, float temperature=0.0, int top_k=0,
                 float top_p=1.0, float min_p=0.0, stop=(), bint exact=False,
                 DraftPolicy policy=None, int n_ctx_seq=0, bint isolate=False):
        if ctx.is_mtp:
            raise ValueError("the controller drives a target context, not an MTP context")
        self.ctx = ctx
        self.model = ctx.model
        self.drafters = list(drafters)
        for d in self.drafters:
            if not isinstance(d, Drafter):
                raise TypeError(f"drafters must be specdec Drafter instances, got {type(d).__name__}")
        if not self.drafters:
            n_max = 0
        # recurrent/hybrid archs without rollback snapshots: checkpoints, whatever the depth
        self.ckpt = not self.model.supports_partial_rollback
        # only the recurrent part (hybrids trim their attention KV with seq_rm)
        self.ckpt_flags = LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        recurrent = self.model.is_recurrent or self.model.is_hybrid
        rs_snapshots = recurrent and not self.ckpt
        self.rs_cap = ctx.n_rollback if rs_snapshots else -1
        if rs_snapshots and n_max > 0 and ctx.n_rollback < n_max:
            raise ValueError(f"n_rollback={ctx.n_rollback} of the target context is too small "
                             f"for drafts of {n_max} tokens: create it with n_rollback >= n_max")
        # A sliding-window cache (swa_full=False) overwrites a cell once it falls out of the
        # window of its sequence's next position, as each ubatch is placed: a verify batch
        # decoded as one ubatch can be rolled back (the rows it replaced are out of the window
        # of every row kept), one split into several cannot. llama.cpp splits a batch into
        # ubatches of n_ubatch rows in order on one KV stream, and by sequence on several.
        window = self.model.n_swa > 0 and not ctx.swa_full
        if window and not (ctx.kv_unified or ctx.n_seq_max == 1):
            raise ValueError("a sliding-window KV cache (swa_full=False) needs one KV stream "
                             "(kv_unified=True): llama.cpp splits a verify batch of several "
                             "streams into ubatches by sequence, and a rollback across them "
                             "would need cells it has overwritten")
        self.max_rows = ctx.n_ubatch if window else ctx.n_batch
        # a cut back to an earlier point needs that point's window (see _kept)
        self.n_swa = self.model.n_swa if not recurrent else 0
        if n_max + 1 > self.max_rows:
            raise ValueError(f"n_max={n_max} needs n_batch >= {n_max + 1} (have {ctx.n_batch}"
                             + (f", n_ubatch {ctx.n_ubatch} with a window cache)" if window else ")"))
        if exact and not ctx.batch_invariant:
            raise ValueError("exact mode needs a batch-invariant target context: "
                             "Context(..., batch_invariant=True) on a Model(..., use_extra_bufts=False)")
        verify_rows = ctx.n_seq_max * max(n_max + 1, 2)
        if exact and 0 <= ctx.invariant_rows < verify_rows:
            raise ValueError("exact mode with layers on RPC servers needs their kernels shown "
                             "batch-invariant for every verify batch: "
                             f"ctx.check_batch_invariance({verify_rows}) (Decoder and Engine run it)")
        if exact and rs_snapshots and ctx.n_rollback < 1:
            raise ValueError("exact mode on a recurrent/hybrid target needs n_rollback >= 1")
        self.exact = exact
        self.pad_equal = exact and not self.ckpt
        self.n_ctx_seq = min(n_ctx_seq, ctx.n_ctx_seq) if n_ctx_seq > 0 else ctx.n_ctx_seq
        self.isolate = isolate
        self.errors = {}
        self.verifier = Verifier(ctx)
        self.batch_cost = BatchCost()
        self.verifier.clock = &self.clock
        stops = [stop] if isinstance(stop, (str, bytes)) else list(stop)
        self.defaults = dict(
            n_max=n_max, n_min=n_min, temperature=temperature, top_k=top_k, top_p=top_p,
            min_p=min_p, stop=[s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in stops],
            policy=policy if policy is not None and policy.n_max == n_max
            and policy.adaptive == adaptive else new_policy(n_max, adaptive))
        self.batch = Batch(ctx.n_batch, n_seq_max=ctx.n_seq_max)
        self.asks = Asks()
        self.seqs = []
        cdef _Seq s
        for i in range(ctx.n_seq_max):
            s = _Seq()
            s.id = i
            s.draft = Draft()
            s.row0 = -1
            self.seqs.append(s)
        self.started = []

    cdef _Seq _seq(self, int seq):
        if not 0 <= seq < len(self.seqs):
            raise IndexError(f"sequence {seq} out of range [0, {len(self.seqs)})")
        return <_Seq> self.seqs[seq]

    # --- requests join and leave between rounds -----------------------------------------

    def join(self, int seq, prompt, *, int max_tokens, seed=0, float temperature=0.0,
             int top_k=0, float top_p=1.0, float min_p=0.0, stop=(), stop_ids=(),
             drafters=None, int n_max=0, int n_min=0, DraftPolicy policy=None, int logprobs=-1,
             bint reuse=False, bint defer=False, float repetition_penalty=1.0,
             float presence_penalty=0.0, float frequency_penalty=0.0, logit_bias=(),
             GrammarState grammar=None) -> int:
        """Begin a request on free slot ``seq``: decode its prompt and sample the first token.

        ``prompt``: checked token ids. ``drafters``: a subset of the controller's, tried
        in order (None: all of them). ``stop``: checked UTF-8 byte strings; ``stop_ids``:
        checked token ids that end it as its EOG tokens do. ``logprobs``:
        -1 none, else how many top alternatives to keep per token. ``reuse``: keep the KV
        of the longest prefix the slot still holds (attention-only targets at any point;
        recurrent/hybrid ones only where the held state ends). ``defer``: decode nothing
        yet; ``prefill`` decodes the prompt a chunk at a time, and rounds leave the
        sequence out until it is all in. Returns the number of prompt tokens to decode.
        The penalties and ``logit_bias`` (checked ``(token, bias)`` pairs) transform each
        verify row for its history (see ``_penalty.pyx``). ``grammar``: a fresh
        ``GrammarState`` the output must match (``specdec.constraint``).
        """
        self.ctx._alive()
        cdef _Seq s = self._seq(seq)
        if s.active:
            raise RuntimeError(f"sequence {seq} is in use: leave() it first")
        cdef int n = len(prompt), c = 0, i
        assert 0 < n < self.n_ctx_seq, "the prompt length is checked by the API"
        assert max_tokens > 0 and n_max >= 0 and n_min >= 0
        cdef vector[int32_t] toks
        toks.resize(n)
        for i in range(n):
            toks[i] = prompt[i]
            assert 0 <= toks[i] < self.model.n_vocab, "prompt token ids are checked by the API"
        if drafters is None:
            s.drafters = self.drafters
        else:
            s.drafters = list(drafters)
            for d in s.drafters:
                assert any(d is e for e in self.drafters), "a sequence drafts with the controller's drafters"
        s.n_drafters = len(s.drafters)
        if s.n_drafters == 0:
            n_max = 0
        assert n_max + 1 <= self.max_rows
        s.policy = policy if policy is not None else new_policy(n_max)
        s.acc = Acceptance(n_max)
        s.acc.begin(s.policy)
        s.n_min = n_min
        s.greedy = temperature <= 0.0
        s.sp.temperature = temperature
        s.sp.top_k = top_k
        s.sp.top_p = top_p
        s.sp.min_p = min_p
        s.rng = Rng(seed)
        s.pen = Penalty(self.model.n_vocab, prompt, repetition=repetition_penalty,
                        presence=presence_penalty, frequency=frequency_penalty,
                        logit_bias=logit_bias)
        if not s.pen.active:
            s.pen = None
        s.grammar = grammar
        s.n_forced = 0
        s.out = TextOutput(self.model, max_tokens, stop, logprobs, stop_ids)
        self.errors.pop(seq, None)
        s.kind = NO_DRAFT
        s.row0 = -1
        s.k = s.n_pad = 0
        s.redo = False
        s.rounds = s.drafted = s.accepted = s.draft_rounds = s.filler = s.redecodes = 0
        s.drafted_at.clear()
        s.accepted_at.clear()
        s.t_gen = 0.0
        for i in range(N_PARTS):
            s.t_part[i] = 0.0
        cdef double t0 = now()
        cdef int c_win = 0
        # the memory must still be what ``mem`` says (a caller may have used the context)
        if reuse and self.ctx.pos_max_c(s.id) == <int>s.mem.size() - 1:
            c = self._kept(s.mem.data(), s.mem.size(), self.ctx.pos_min_c(s.id), toks.data(), n)
            if 0 < s.win_n <= <int>s.mem.size():
                c_win = self._kept(s.mem.data(), s.win_n, s.win_start, toks.data(), n)
            if c_win > c:       # back to the prompt-end window; the other layers hold it all
                try:
                    self.ctx.load_state_c(s.id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, s.win_state)
                    c = c_win
                except ValueError:
                    c = 0
        if c > 0:
            if not self.ctx.seq_rm_c(s.id, c, -1):
                c = 0
        if c == 0:
            self.ctx.seq_rm_c(s.id, -1, -1)
        if c < s.win_n:
            s.win_n = 0
            s.win_state.clear()
        s.mem.resize(c)
        s.active = True
        s.prefilling = True
        s.reuse = reuse
        s.prompt = toks
        s.n_filled = c
        s.n_prompt = n
        s.n_decoded = n - c
        cdef Drafter dr
        try:
            for dr in s.drafters:
                dr.begin_c(s.id, toks.data(), n)
                if c > 0:
                    dr.observe_c(s.id, toks.data(), c, -1)
            s.t_prompt = now() - t0
            self.t_prompt += s.t_prompt
            while s.prefilling and not defer:
                self._prefill_chunk(s, 0)
        except BaseException:
            self.leave(seq)
            raise
        return n - c

    def prefill(self, int seq, int max_tokens=0) -> bool:
        """Decode the next chunk (``n_batch`` tokens, or ``max_tokens``) of the prompt of a
        join with ``defer``; True once it is all in and the first token sampled. A failed
        decode ends the request (the slot is left) and raises."""
        cdef _Seq s = self._seq(seq)
        if not s.active:
            raise RuntimeError(f"sequence {seq} has no request")
        if s.prefilling:
            try:
                self._prefill_chunk(s, max_tokens)
            except BaseException:
                self.leave(seq)
                raise
        return not s.prefilling

    def is_prefilling(self, int seq) -> bool:
        return self._seq(seq).prefilling

    cdef int _kept(self, const int32_t * held, int n_held, int pos_min, const int32_t * toks,
                   int n) noexcept:
        """Tokens of ``toks[:n]`` a join with reuse keeps of a memory holding ``held[:n_held]``
        whose sliding-window layers hold positions ``pos_min..``.

        The last prompt token is decoded again, for its logits. A recurrent state is kept
        only where the memory ends. A cut back to ``c`` keeps the window of position ``c``
        only if those layers still hold it: a window cache drops what falls out of the
        window as it goes, and a saved state holds only the window of its end.
        """
        cdef int c = 0
        while c < n and c < n_held and held[c] == toks[c]:
            c += 1
        if c == n:
            c = n - 1
        if (self.model.is_recurrent or self.model.is_hybrid) and (
                c != n_held or (self.exact and n - c < 2)):
            return 0
        if self.n_swa > 0 and c > 0 and not 0 <= pos_min <= min(c - 1, max(0, c - self.n_swa + 1)):
            return 0
        return c

    def reusable(self, int seq, prompt) -> int:
        """Prompt tokens a join of ``prompt`` on free slot ``seq`` with ``reuse`` would keep."""
        self.ctx._alive()
        cdef _Seq s = self._seq(seq)
        if s.active or s.mem.size() == 0 or self.ctx.pos_max_c(s.id) != <int>s.mem.size() - 1:
            return 0
        cdef vector[int32_t] toks = _tokens(prompt)
        cdef int c = self._kept(s.mem.data(), s.mem.size(), self.ctx.pos_min_c(s.id),
                                toks.data(), toks.size())
        if 0 < s.win_n <= <int>s.mem.size():
            c = max(c, self._kept(s.mem.data(), s.win_n, s.win_start, toks.data(), toks.size()))
        return c

    def kept_prefix(self, HeldState held not None, prompt) -> int:
        """Prompt tokens a join of ``prompt`` with reuse would keep of the slot state
        ``held`` once ``restore_held`` put it back."""
        cdef vector[int32_t] h = _tokens(held.tokens), toks = _tokens(prompt)
        cdef int c = self._kept(h.data(), h.size(), held.window_start, toks.data(), toks.size())
        if 0 < held.win_n <= <int>h.size():
            c = max(c, self._kept(h.data(), held.win_n, held.win_start, toks.data(), toks.size()))
        return c

    cdef int _window_start(self, int seq) except? -2:
        """The first position whose cells a state of ``seq`` saved now holds in the sliding-
        window layers (llama.cpp writes only the window of the last position); 0 without."""
        if self.n_swa == 0:
            return 0
        cdef int p0 = self.ctx.pos_min_c(seq), p1 = self.ctx.pos_max_c(seq)
        return max(p0, p1 - self.n_swa + 1) if p1 >= 0 else 0

    cdef int _save_window(self, _Seq s) except -1:
        """After a prompt is in: keep the window layers' state of its end, so that a later
        join cutting back to the prompt's end (the same prompt again, another answer to the
        same question) keeps the prompt, where the window of the request's own end no longer
        holds it; llama-server's context checkpoints do the same. Only for joins with reuse,
        and where the request may outrun the window: before that, the window of its end
        holds the prompt's."""
        s.win_n = 0
        s.win_state.clear()
        cdef int n = s.mem.size()
        if not s.reuse or self.n_swa == 0 or n < 2 or (
                n + s.out.max_tokens <= self.n_swa):
            return 0
        self.ctx.save_state_c(s.id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, s.win_state)
        s.win_n = n
        s.win_start = self._window_start(s.id)
        return 0

    def leave(self, int seq, *, bint keep=False):
        """End the request on ``seq`` (finished or not); its results stay readable until the
        slot is joined again. ``keep``: keep its KV for a later request's prefix reuse."""
        cdef _Seq s = self._seq(seq)
        s.active = False
        s.row0 = -1
        s.pen = None            # its per-token counts (a vocabulary's worth)
        if s.prefilling:
            s.prefilling = False
            s.prompt.clear()
            keep = False
        if keep and s.out is not None and s.out.finish == CTX_FULL:
            keep = False         # a checkpoint arch may hold a padding row past ``mem``
        if not keep:
            self.ctx.seq_rm_c(s.id, -1, -1)
            s.mem.clear()
            s.n_past = 0
            s.win_n = 0
            s.win_state.clear()

    def save_held(self, int seq):
        """What free slot ``seq`` holds (``held(seq)``), saved for a prompt cache: a
        ``HeldState``, or None when it holds nothing, or its memory is not what ``held``
        says."""
        self.ctx._alive()
        cdef _Seq s = self._seq(seq)
        if s.active:
            raise RuntimeError(f"sequence {seq} is in use")
        if s.mem.size() == 0 or self.ctx.pos_max_c(s.id) != <int>s.mem.size() - 1:
            return None
        cdef HeldState h = HeldState()
        h.tokens = np.asarray(self.held(seq), dtype=np.int32)
        h.window_start = self._window_start(s.id)
        h.state = self.ctx.save_state(s.id)
        if 0 < s.win_n <= <int>s.mem.size():
            h.win_n = s.win_n
            h.win_start = s.win_start
            h.win_state = (<char *> s.win_state.data())[:s.win_state.size()]
        return h

    def restore_held(self, int seq, HeldState held not None) -> bool:
        """Free slot ``seq`` (any slot) holds what ``save_held`` saved again. False, the slot
        then holding nothing, when llama.cpp could not place it (no room in the cache)."""
        self.ctx._alive()
        cdef _Seq s = self._seq(seq)
        if s.active:
            raise RuntimeError(f"sequence {seq} is in use")
        cdef int i, n = len(held.tokens)
        self.leave(seq)
        try:
            self.ctx.load_state(held.state, s.id)
        except ValueError:
            self.ctx.seq_rm_c(s.id, -1, -1)
            return False
        if self.ctx.pos_max_c(s.id) != n - 1:
            self.ctx.seq_rm_c(s.id, -1, -1)
            return False
        s.mem.resize(n)
        for i in range(n):
            s.mem[i] = held.tokens[i]
        s.n_past = n
        if held.win_n > 0:
            s.win_state.assign(<const uint8_t *> (<const char *> held.win_state),
                               <const uint8_t *> (<const char *> held.win_state) + len(held.win_state))
            s.win_n = held.win_n
            s.win_start = held.win_start
        return True

    def start(self, prompts, max_tokens, seeds=None):
        """Begin one request per prompt on sequences 0..n-1 with the constructor's settings
        (every slot is cleared first; the counters of ``stats()`` restart)."""
        assert 0 < len(prompts) <= len(self.seqs)
        if isinstance(max_tokens, int):
            max_tokens = [max_tokens] * len(prompts)
        seeds = [0] * len(prompts) if seeds is None else list(seeds)
        for i in range(len(self.seqs)):
            self.leave(i)
        self.reset_stats()
        d = self.defaults
        for i, p in enumerate(prompts):
            self.join(i, p, max_tokens=max_tokens[i], seed=seeds[i],
                      temperature=d["temperature"], top_k=d["top_k"], top_p=d["top_p"],
                      min_p=d["min_p"], stop=d["stop"], n_max=d["n_max"], n_min=d["n_min"],
                      policy=d["policy"])
        self.started = self.seqs[:len(prompts)]

    cdef int _prefill_chunk(self, _Seq s, int budget) except -1:
        """Decode the next chunk of the prompt; after the last one, sample the first token."""
        cdef double t0 = now()
        cdef int n = s.prompt.size(), i0 = s.n_filled, i
        cdef int m = min(self.ctx.n_batch, n - i0)
        if budget > 0:
            m = min(m, budget)
        if self.exact and n - i0 - m == 1 and m > 2:
            m -= 1      # no 1-token chunk at the end
        cdef Drafter d
        self.batch.clear_c()
        for i in range(m):
            self.batch.add_c(s.prompt[i0 + i], i0 + i, s.id, i0 + i == n - 1)
        # a one-token chunk (a one-token prompt): decode it with a throw-away second row,
        # where the memory can drop it; a target rolled back by checkpoints cannot, and
        # decodes it alone (as every exact-mode run of that prompt does)
        cdef bint pad = self.exact and m == 1 and not self.ckpt
        if pad:
            self.batch.add_c(s.prompt[i0], i0 + 1, s.id, False)
        self.ctx.decode_c(self.batch)
        if pad:
            if not self.ctx.seq_rm_c(s.id, i0 + 1, -1):
                raise RuntimeError("could not drop the padding row")
        for d in s.drafters:
            d.observe_c(s.id, s.prompt.data() + i0, m, 0)
        s.n_filled += m
        if s.n_filled == n:
            s.mem.assign(s.prompt.begin(), s.prompt.end())
            s.n_past = n
            s.prompt.clear()
            s.prefilling = False
            self._save_window(s)
            self.verifier.pen = s.pen
            self.verifier.grammar = s.grammar
            s.last = self.verifier.sample(m - 1, s.greedy, s.sp, s.rng)
            self._emit(s, s.last, m - 1)
        t0 = now() - t0
        s.t_prompt += t0
        self.t_prompt += t0
        return 0

    # --- the round --------------------------------------------------------------------

    cdef bint _emit(self, _Seq s, int32_t tok, int row) except -1:
        """Append one token to the sequence's output; True when it is finished."""
        if s.pen is not None:
            s.pen.push(tok)
        return s.out.push(tok, self.ctx.logits_c(row) if s.out.n_top >= 0 else NULL)

    cdef int _propose(self, list seqs) except -1:
        """Draft for every sequence of the round that asks for a draft (``k_cap > 0``): each
        drafter is called once (``propose_batch_c``) with all the sequences it is asked by,
        so a drafter with a model decodes them together; a sequence whose drafter gave less
        than ``n_min`` tokens asks its next drafter, again all such sequences together. Each
        sequence is charged an equal part of its calls' time, their catch-up left out
        (``t_asked``). Under ``isolate`` a failed draft ends its sequence (``FAILED``)."""
        cdef _Seq s
        cdef Drafter d
        cdef Asks asks = self.asks
        cdef int j, n, level = 0
        cdef double t0, share
        cdef list pending = [], group
        cdef dict groups
        for s in seqs:
            s.draft.clear()
            s.kind = NO_DRAFT
            s.n_forced = 0
            s.t_asked = 0.0
            if s.k_cap > 0 and s.n_drafters > 0:
                pending.append(s)
        while pending:
            groups = {}
            for s in pending:
                if level < s.n_drafters:
                    groups.setdefault(id(s.drafters[level]), []).append(s)
            pending = []
            for group in groups.values():
                d = <Drafter> (<_Seq> group[0]).drafters[level]
                asks.clear()
                asks.isolate = self.isolate
                for s in group:
                    asks.add(s.id, s.last, s.k_cap, s.p_stop, s.draft)
                t0 = now()
                try:
                    d.propose_batch_c(asks)
                finally:
                    n = len(group)
                    share = max(0.0, now() - t0 - asks.t_sync) / n
                    asks.drafts = []
                for j in range(n):
                    s = <_Seq> group[j]
                    s.t_asked += share
                    if asks.errors[j] is not None:
                        # nothing of this round reached the target yet: the others go on
                        s.draft.clear()
                        s.out.set_finish(FAILED)
                        self.errors[s.id] = asks.errors[j]
                        continue
                    if <int>s.draft.tokens.size() > s.k_cap:
                        s.draft.tokens.resize(s.k_cap)
                    if <int>s.draft.tokens.size() >= (s.n_min if s.n_min > 0 else 1):
                        s.kind = DRAFTED
                        s.proposer = level
                    else:
                        s.draft.clear()
                        pending.append(s)
            level += 1
        for s in seqs:
            if s.grammar is not None and s.k_cap > 0 and s.out.finish == RUNNING:
                # the grammar's forced tokens lead the draft, which ends before its first
                # token the grammar refuses (the grammar is after ``last``: verify row 0)
                s.n_forced = s.grammar.fit_draft_c(s.draft, s.k_cap)
                if s.draft.tokens.size() == 0:
                    s.kind = NO_DRAFT
                elif s.kind == NO_DRAFT or s.grammar.replaced:
                    s.kind = FORCED
        return 0

    def step(self) -> int:
        """One round for every running sequence; returns how many are still running."""
        cdef _Seq s
        cdef int i, rows = 0, alive = 0
        cdef double t0 = now()
        cdef double part0[5]
        self.clock.mark = t0          # the caller's time between rounds is not generation time
        for i in range(N_PARTS):
            part0[i] = self.clock.part[i]
        cdef list in_batch = []
        for s in self.seqs:
            if not s.active or s.prefilling or s.out.finish != RUNNING:
                continue
            if s.n_past >= self.n_ctx_seq:
                s.out.set_finish(CTX_FULL)
                continue
            if s.rounds == 0:
                s.policy.begin_request()
            s.k_want = s.policy.cap()
            s.k_cap = min(s.k_want,
                          s.out.max_tokens - s.out.n_tokens,
                          self.n_ctx_seq - s.n_past - 1,
                          self.max_rows - rows - 1)
            if self.rs_cap >= 0:
                s.k_cap = min(s.k_cap, self.rs_cap)
            rows += max(s.k_cap, 0) + 1
            in_batch.append(s)
        self._budget_caps(in_batch)
        for s in in_batch:
            s.p_stop = s.policy.p_stop() if s.k_cap > 0 else 0.0
        lap(&self.clock, T_CONTROL)
        self._propose(in_batch)
        cdef double t_drafted = lap(&self.clock, T_DRAFT)
        in_batch = [s for s in in_batch if s.out.finish == RUNNING]
        for s in in_batch:
            # a cap cut by the limits is not a sample of td(k_want); catching up after rounds
            # without drafts is not a cost of drafting this round (it would stop the drafts
            # for good: the longer the pause, the dearer the next draft would look)
            if s.k_cap == s.k_want:
                s.policy.observe_draft_time(s.k_cap, s.t_asked)
            s.k = s.policy.choose(s.draft.tokens.size(), s.t_asked)
            s.k = max(s.k, s.n_forced)      # forced tokens are near-certain: never cut
        self._budget_rows(in_batch, t_drafted)
        for s in in_batch:
            s.pred_e = s.policy.predicted_tokens
            s.pred_t = s.policy.predicted_time if s.k_cap > 0 else 0.0   # no drafter asked: no sample
            if s.k < <int>s.draft.tokens.size():
                s.draft.tokens.resize(s.k)
                if s.k == 0:
                    s.kind = NO_DRAFT
            s.n_pad = 0
        if not in_batch:
            lap(&self.clock, T_CONTROL)
            self.t_gen += self.clock.mark - t0
            return 0
        if self.exact:
            self._pad(in_batch)
        self.n_rounds += 1
        cdef list group
        for group in self._decode_groups(in_batch, False):
            self._decode_verify(group)
        if self.ckpt:
            for group in self._decode_groups([s for s in self.seqs if s.redo], True):
                self._redecode(group)
        for s in in_batch:
            s.row0 = -1
        lap(&self.clock, T_CONTROL)
        self.t_gen += self.clock.mark - t0
        for s in in_batch:
            s.t_gen += self.clock.mark - t0
            for i in range(N_PARTS):
                s.t_part[i] += self.clock.part[i] - part0[i]
        for s in self.seqs:
            if s.active and not s.prefilling and s.out.finish == RUNNING:
                alive += 1
        return alive

    cdef bint _cost_line(self, int n_in, double * a, double * b) noexcept:
        """The verify batch's cost line ``T(R) = a + b R`` (``BatchCost``), when the budget
        applies: several sequences in the round, batches measured."""
        if n_in < 2 or self.batch_cost.n <= 0.0:
            return False
        self.batch_cost._line(a, b)
        return b[0] > 0.0

    cdef int _budget_caps(self, list seqs) except -1:
        """Before drafting: the caps of the sequences under the adaptive policy, cut to the
        rows that would pay for the whole batch (``_batch_budget``), their draft time
        counted (each sequence's part of its drafter's calls, per token); under load, none.
        A round a sequence's policy explores or probes in keeps its cap."""
        cdef double a, b, tokens, time
        cdef int j
        if not self._cost_line(len(seqs), &a, &b):
            return 0
        cdef _Seq s
        cdef list free = []
        cdef vector[int] k_max, k_out
        cdef vector[double] cost
        tokens = len(seqs)
        time = a + b * len(seqs)
        for s in seqs:
            if s.k_cap <= 0:
                continue
            if s.policy.adaptive and not (s.policy.exploring or s.policy.probing):
                free.append(s)
                k_max.push_back(s.k_cap)
                cost.push_back(b + s.policy._draft_time(s.k_cap) / s.k_cap)
            else:           # a fixed length, an exploration: its rows are spent anyway
                tokens += s.acc.gain(s.k_cap)
                time += b * s.k_cap + s.policy._draft_time(s.k_cap)
        k_out = _allocate(free, k_max, cost, tokens, time)
        for j in range(len(free)):
            (<_Seq> free[j]).k_cap = k_out[j]
        return 0

    cdef int _budget_rows(self, list seqs, double t_drafted) except -1:
        """After drafting: the verify rows of the batch, given to the drafts that pay by
        each request's own acceptance (the drafting time is spent: it counts in the round's
        time, not as a cost of a row), up to what its drafter proposed; an exploring or
        probing sequence verifies what its policy chose."""
        cdef double a, b, tokens, time
        cdef int j
        if not self._cost_line(len(seqs), &a, &b):
            return 0
        cdef _Seq s
        cdef list free = []
        cdef vector[int] k_max, k_out
        cdef vector[double] cost
        tokens = len(seqs)
        time = t_drafted + a + b * len(seqs)
        for s in seqs:
            if s.draft.tokens.size() == 0:
                continue
            if s.policy.adaptive and not (s.policy.exploring or s.policy.probing):
                free.append(s)
                k_max.push_back(s.draft.tokens.size())
                cost.push_back(b)
            else:
                tokens += s.acc.gain(s.k)
                time += b * s.k
        k_out = _allocate(free, k_max, cost, tokens, time)
        for j in range(len(free)):
            s = <_Seq> free[j]
            if max(k_out[j], s.n_forced) != s.k:
                s.k = max(k_out[j], s.n_forced)      # forced tokens are never cut
                s.policy._predict(s.k, s.t_asked)
        return 0

    cdef list _decode_groups(self, list seqs, bint redo):
        """The decodes a round's sequences go in: one, except in exact mode on a target rolled
        back by checkpoints, where each decode holds the sequences with the same rows.

        llama.cpp splits a recurrent batch into ubatches of equal rows per sequence, so a
        sequence with more rows than the others would have its last rows computed in a
        ubatch of their own (a single row takes other kernels, and a gated delta net computes
        a chunk of tokens in another order than the same tokens one chunk): its logits and
        state would depend on the batch. Padding cannot even them there (each padding row
        would make the round a rejection, the state restored and decoded again), so the
        sequences of equal rows are decoded together, each group as when run alone."""
        if not seqs:
            return []
        if not (self.exact and self.ckpt) or len(seqs) == 1:
            return [seqs]
        cdef dict by_rows = {}
        cdef _Seq s
        for s in seqs:
            by_rows.setdefault(s.a + 2 if redo else s.k + 1, []).append(s)
        return list(by_rows.values())

    cdef int _decode_verify(self, list group) except -1:
        """Decode ``last, d1..dk`` (and padding) of every sequence of ``group`` in one
        batch, then verify each."""
        cdef _Seq s
        cdef int i
        self.batch.clear_c()
        for s in group:
            s.row0 = self.batch.b.n_tokens
            self.batch.add_c(s.last, s.n_past, s.id, True)
            for i in range(s.k):
                self.batch.add_c(s.draft.tokens[i], s.n_past + 1 + i, s.id, True)
            for i in range(s.n_pad):
                self.batch.add_c(s.last, s.n_past + 1 + s.k + i, s.id, False)
        lap(&self.clock, T_CONTROL)
        if self.ckpt:
            self._save_checkpoints(group)
        self.ctx.decode_c(self.batch)
        cdef double t_dec = lap(&self.clock, T_TARGET)
        if len(group) > 1:
            self._shared_head(group)
            t_dec += lap(&self.clock, T_HEAD)
        cdef int n_in = len(group), n_rows = self.batch.b.n_tokens
        if n_in > 1:
            self.batch_cost.observe(n_rows, t_dec)
        for s in group:
            s.rounds += 1
            self._verify(s, self.batch_cost.share(t_dec, n_rows, n_in, s.k + 1 + s.n_pad))
        return 0

    cdef int _shared_head(self, list in_batch) except -1:
        """With the lazy LM head, the rows every sequence's verification will read, in two
        passes over the head for the whole batch instead of one or two per sequence: the
        first two rows of each, then the rest of the greedy ones whose first two drafts
        the target agrees with (``Verifier.ready`` would ask for them next)."""
        cdef _Seq s
        cdef int i, n_vocab = self.model.n_vocab
        cdef vector[int] rows
        if not self.ctx._lazy:
            return 0
        for s in in_batch:
            for i in range(min(2, s.k + 1)):
                rows.push_back(s.row0 + i)
        self.ctx.prepare_logits_rows_c(rows)
        rows.clear()
        for s in in_batch:
            if (s.greedy and s.k >= 2
                    and argmax(self.ctx.logits_c(s.row0), n_vocab) == s.draft.tokens[0]
                    and argmax(self.ctx.logits_c(s.row0 + 1), n_vocab) == s.draft.tokens[1]):
                for i in range(2, s.k + 1):
                    rows.push_back(s.row0 + i)
        self.ctx.prepare_logits_rows_c(rows)
        return 0

    cdef int _pad(self, list in_batch) except -1:
        """Exact mode: give every row of the verify batch logits that do not depend on the batch.

        llama.cpp's CPU matmuls take tinyBLAS for two or more rows and vec_dot for
        one, and the two round differently; repacked weights even depend on the row
        count mod 4. With repacking off and never a single row, every row's logits
        are the same whatever the batch, so speculative output equals plain output.

        A sequence with nothing to verify but its pending token gets a free guess (the
        pending token again), verified like a draft. On attention-only targets every
        sequence of the batch then gets the same number of rows, with throw-away rows
        dropped after the decode: a context with a KV stream per sequence, and recurrent
        memory, split the batch into ubatches of equal rows per sequence, and a sequence
        with more rows than the others would have its last ones computed alone. Targets
        rolled back by checkpoints are not padded (a padding row would make every round a
        partial accept, decoded again): their sequences, each of two rows or more, are
        decoded in groups of equal rows instead (``_decode_groups``).
        """
        cdef _Seq s
        cdef int rows = 2
        for s in in_batch:
            if s.k == 0 and s.n_past + 1 < self.n_ctx_seq and s.out.n_tokens < s.out.max_tokens:
                s.draft.tokens.push_back(s.last)
                s.k = 1
                s.kind = FILLER
                self.n_filler += 1
                s.filler += 1
            rows = max(rows, s.k + 1)
        if not self.pad_equal:
            return 0
        for s in in_batch:
            s.n_pad = rows - s.k - 1
        if rows * len(in_batch) > self.max_rows:
            raise RuntimeError(f"exact mode needs n_batch >= {rows * len(in_batch)} for this "
                               f"round (have {self.max_rows})")
        return 0

    cdef int _save_checkpoints(self, list group) except -1:
        """Save the recurrent state of every sequence of ``group`` whose verify holds drafts
        (or the exact-mode filler): a rejected one is rolled back by restoring it."""
        cdef _Seq s
        for s in group:
            s.t_ckpt = 0.0
            s.redo = False
            if s.k > 0:
                lap(&self.clock, T_CONTROL)
                self.ctx.save_state_c(s.id, self.ckpt_flags, s.ckpt)
                s.t_ckpt = lap(&self.clock, T_VERIFY)
        return 0

    cdef int _redecode(self, list group) except -1:
        """Decode ``last, d1..da, y`` again for the sequences of ``group`` (those whose
        checkpoint was restored).

        ``y`` (the target's own token, already emitted) rides along: its row yields the
        next token, so the decode a rejection costs is also the next plain round, and
        the batch always has two rows or more (exact mode never decodes a single row).
        Its cost is charged to the round that rejected, for the policy to weigh.
        """
        cdef _Seq s
        cdef int i, base, n_rows = 0
        cdef int32_t z
        cdef Drafter d
        self.batch.clear_c()
        for s in group:
            if not s.redo:
                continue
            s.row0 = self.batch.b.n_tokens
            base = s.n_past - 1 - s.a
            self.batch.add_c(s.prev, base, s.id, True)
            for i in range(s.a):
                self.batch.add_c(s.draft.tokens[i], base + 1 + i, s.id, True)
            self.batch.add_c(s.last, base + 1 + s.a, s.id, True)
            n_rows += s.a + 2
        if n_rows == 0:
            return 0
        lap(&self.clock, T_CONTROL)
        self.ctx.decode_c(self.batch)
        cdef double t_dec = lap(&self.clock, T_TARGET), t_head
        for s in group:
            if not s.redo:
                continue
            s.redo = False
            self.n_redecode += 1
            s.redecodes += 1
            # exact mode: the lazy head computes two rows, as a verify's first pass does
            self.ctx.prepare_logits_c(s.row0 + s.a, 2)
            t_head = lap(&self.clock, T_HEAD)
            self.verifier.pen = s.pen
            self.verifier.grammar = s.grammar
            z = self.verifier.sample(s.row0 + s.a + 1, s.greedy, s.sp, s.rng)
            s.n_past += 1
            s.mem.push_back(s.last)
            lap(&self.clock, T_VERIFY)
            for i in range(s.n_drafters):
                d = <Drafter> s.drafters[i]
                d.observe_c(s.id, &s.last, 1, s.row0 + s.a + 1)
            lap(&self.clock, T_DRAFT)
            s.t_v += t_dec * (s.a + 2) / n_rows + t_head
            self._observe_policy(s, s.k, s.a, s.a + 2)
            if not self._emit(s, z, s.row0 + s.a + 1):
                s.last = z
            s.row0 = -1
        return 0

    cdef int _verify(self, _Seq s, double t_dec) except -1:
        lap(&self.clock, T_CONTROL)
        cdef double t_v = self.clock.mark
        cdef int a, i, k = s.k
        cdef int32_t y
        cdef Drafter d
        # recurrent memory rolls back once per decode: its padding rows go with the rejected
        # drafts below (a checkpoint arch keeps them: only a sequence that fills its context
        # pads)
        cdef bint rs = self.rs_cap >= 0
        if s.n_pad > 0 and not self.ckpt and not rs:
            if not self.ctx.seq_rm_c(s.id, s.n_past + 1 + k, -1):
                raise RuntimeError("could not drop the padding rows")
        self.verifier.pen = s.pen
        self.verifier.grammar = s.grammar
        if s.greedy:
            a = self.verifier.greedy(s.row0, s.draft, k, &y)
        else:
            a = self.verifier.rejection(s.row0, s.draft, k, s.sp, s.rng, &y)
        # the target's memory keeps ``last, d1..da``; the rest is rolled back
        cdef int keep = s.n_past + 1 + a, n_old = s.n_past
        cdef bint redo = False, finished = False
        if a < k and self.ckpt:
            # back to the state before ``last``; ``_redecode`` decodes the kept tokens again
            self.ctx.load_state_c(s.id, self.ckpt_flags, s.ckpt)
            if not self.ctx.seq_rm_c(s.id, s.n_past, -1):
                raise RuntimeError(f"rollback of sequence {s.id} to {s.n_past} refused by llama.cpp")
            redo = True
        elif a < k or (rs and s.n_pad > 0):
            if not self.ctx.seq_rm_c(s.id, keep, -1):
                raise RuntimeError(f"rollback of sequence {s.id} to {keep} refused by llama.cpp")
        # what the policy weighs is the whole verification: the decode, the lazy head's
        # passes (with gemma's 262k vocab as costly per row as the trunk), the rollback and,
        # on checkpoint archs, saving the checkpoint (the decode again is added by _redecode)
        lap(&self.clock, T_VERIFY)
        t_v = t_dec + self.clock.mark - t_v + s.t_ckpt
        self.scratch.clear()
        self.scratch.push_back(s.last)
        for i in range(a):
            self.scratch.push_back(s.draft.tokens[i])
        s.mem.insert(s.mem.end(), self.scratch.begin(), self.scratch.end())
        lap(&self.clock, T_CONTROL)
        for i in range(s.n_drafters):
            d = <Drafter> s.drafters[i]
            d.observe_c(s.id, self.scratch.data(), a + 1, s.row0)
            if s.kind == DRAFTED and i == s.proposer:
                d.accept_c(s.id, a)
        lap(&self.clock, T_DRAFT)
        s.n_past = keep
        if s.kind == DRAFTED or s.kind == FORCED:   # the exact-mode filler is not a draft
            self._count(s, k, a)
            self._on_verified(s, keep - 1 - a, k, a)
        s.t_v = t_v
        s.a = a
        s.prev = s.last
        # emit d1..da then y, stopping at EOS / stop strings / max_tokens
        for i in range(a):
            if self._emit(s, s.draft.tokens[i], s.row0 + i):
                finished = True
                break
        if not finished:
            finished = self._emit(s, y, s.row0 + a)
            if not finished:
                s.last = y
                s.redo = redo
        if finished and redo:
            # no decode again: the restored memory ends before ``last`` (as ``mem`` must)
            s.n_past = n_old
            s.mem.resize(n_old)
        if not s.redo:
            self._observe_policy(s, k, a, a + 1)
        return 0

    cdef int _count(self, _Seq s, int k, int a) except -1:
        cdef int i
        self.n_draft_rounds += 1
        self.n_drafted += k
        self.n_accepted += a
        s.draft_rounds += 1
        s.drafted += k
        s.accepted += a
        if <int>self.drafted_at.size() < k:
            self.drafted_at.resize(k, 0)
            self.accepted_at.resize(k, 0)
        if <int>s.drafted_at.size() < k:
            s.drafted_at.resize(k, 0)
            s.accepted_at.resize(k, 0)
        for i in range(k):
            self.drafted_at[i] += 1
            s.drafted_at[i] += 1
            if i < a:
                self.accepted_at[i] += 1
                s.accepted_at[i] += 1
        return 0

    cdef int _on_verified(self, _Seq s, int pos, int k, int a) except -1:
        return 0

    cdef int _observe_policy(self, _Seq s, int k, int a, int tokens) except -1:
        """The round's outcome and cost to the policy (not for the exact-mode filler guess)."""
        if s.kind == FILLER or s.kind == FORCED:     # no drafter's proposal
            return 0
        s.acc.observe(k, a)
        s.policy.observe(k, a, s.t_v)
        s.policy.observe_round(s.pred_e, s.pred_t, tokens, s.t_asked + s.t_v)
        return 0

    def run(self):
        """Rounds until every sequence has finished."""
        while self.step() > 0:
            pass

    # --- results ----------------------------------------------------------------------

    def take(self, int seq=0):
        """``(text bytes, token ids, logprobs or None)`` released for ``seq`` since the last
        call (for streaming; text that could still begin a stop string is held back)."""
        return self._out(seq).take()

    def take_text(self, int seq=0) -> bytes:
        """Bytes released for ``seq`` since the last call (see ``take``)."""
        return self._out(seq).take()[0]

    def _out(self, int seq):
        cdef _Seq s = self._seq(seq)
        if s.out is None:
            raise RuntimeError(f"sequence {seq} has had no request")
        return s.out

    def text(self, int seq=0) -> bytes:
        return self._out(seq).text_bytes()

    def tokens(self, int seq=0) -> list:
        return self._out(seq).token_list()

    def logprobs(self, int seq=0):
        """Per token: ``(logprob, [(id, logprob), ...])``; None when the request asked none."""
        out = self._out(seq)
        return out.logprob_list() if out.n_top >= 0 else None

    def error(self, int seq):
        """The error that ended ``seq`` (``isolate``), else None."""
        return self.errors.get(seq)

    def finish_reason(self, int seq=0):
        return self._out(seq).finish_reason

    def is_active(self, int seq) -> bool:
        return self._seq(seq).active

    def n_prompt(self, int seq=0) -> int:
        return self._seq(seq).n_prompt

    def n_decoded(self, int seq=0) -> int:
        """Prompt tokens the last ``join`` of ``seq`` decoded (the rest were reused)."""
        return self._seq(seq).n_decoded

    def n_past(self, int seq=0) -> int:
        return self._seq(seq).n_past

    def held(self, int seq) -> list:
        """The tokens in the target's memory for ``seq``, by position."""
        cdef _Seq s = self._seq(seq)
        return [s.mem[i] for i in range(s.mem.size())]

    @property
    def n_sequences(self) -> int:
        return len(self.started)

    @property
    def n_slots(self) -> int:
        return len(self.seqs)

    @property
    def policy(self) -> DraftPolicy:
        """The default draft-length policy (pass it to the next Controller to keep what it learnt)."""
        return self.defaults["policy"]

    @property
    def policy_state(self) -> dict:
        """The default policy's estimates (acceptance per position, verify and draft times)."""
        return self.defaults["policy"].state()

    def reset_stats(self):
        """Restart the totals of ``stats()``."""
        cdef int i
        self.n_rounds = self.n_drafted = self.n_accepted = self.n_draft_rounds = 0
        self.n_filler = 0
        self.n_redecode = 0
        self.drafted_at.clear()
        self.accepted_at.clear()
        self.t_prompt = self.t_gen = 0.0
        for i in range(N_PARTS):
            self.clock.part[i] = 0.0
        self.t_start = now()

    def stats(self, seq=None) -> dict:
        """Counters as plain Python values: of request ``seq``, or (None) the totals since the
        last ``start`` / ``reset_stats`` over the sequences ``start`` began."""
        cdef _Seq s
        if seq is not None:
            s = self._seq(seq)
            n_gen = s.out.n_tokens if s.out is not None else 0
            return _stats(s.n_prompt, s.n_decoded, n_gen, 1, s.rounds, s.draft_rounds, s.filler, s.redecodes,
                          s.drafted, s.accepted, s.drafted_at, s.accepted_at, s.t_prompt,
                          s.t_gen, s.t_part)
        seqs = self.started
        n_gen = sum((<_Seq>s).out.n_tokens for s in seqs)
        return _stats(sum((<_Seq>s).n_prompt for s in seqs),
                      sum((<_Seq>s).n_decoded for s in seqs), n_gen, len(seqs), self.n_rounds,
                      self.n_draft_rounds, self.n_filler, self.n_redecode, self.n_drafted,
                      self.n_accepted, self.drafted_at, self.accepted_at, self.t_prompt,
                      self.t_gen, self.clock.part)


cdef vector[int] _allocate(list free, vector[int] & k_max, vector[double] & cost, double tokens,
                           double time):
    """``_batch_budget.allocate`` for the sequences ``free`` (their own acceptance gives each
    row's worth): the drafts each gets."""
    cdef int m = len(free), stride = 1, j, i
    cdef vector[int] k_out
    cdef vector[double] gain
    cdef _Seq s
    k_out.assign(m, 0)
    if m == 0:
        return k_out
    for j in range(m):
        stride = max(stride, k_max[j] + 1)
    gain.assign(<size_t>m * stride, 0.0)
    for j in range(m):
        s = <_Seq> free[j]
        for i in range(1, k_max[j] + 1):
            gain[j * stride + i] = s.acc.gain(i)
    allocate(m, k_max.data(), gain.data(), stride, cost.data(), tokens, time, MARGIN, k_out.data())
    return k_out


cdef vector[int32_t] _tokens(seq):
    cdef vector[int32_t] v
    v.reserve(len(seq))
    for t in seq:
        v.push_back(t)
    return v


cdef dict _stats(int64_t n_prompt, int64_t n_decoded, int64_t n_gen, int n_seqs, int64_t rounds,
                 int64_t draft_rounds, int64_t filler, int64_t redecodes, int64_t drafted,
                 int64_t accepted, vector[int64_t] & drafted_at, vector[int64_t] & accepted_at,
                 double t_prompt, double t_gen, double * part):
    t_gen = max(t_gen, 1e-9)
    return {
        "n_prompt": n_prompt,
        "n_prompt_decoded": n_decoded,
        "n_generated": n_gen,
        "rounds": rounds,
        "draft_rounds": draft_rounds,
        "filler_rounds": filler,
        "redecodes": redecodes,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": (<double>accepted / drafted) if drafted else None,   # not measured
        "drafted_per_position": [drafted_at[i] for i in range(drafted_at.size())],
        "accepted_per_position": [accepted_at[i] for i in range(accepted_at.size())],
        "t_prompt_s": t_prompt,
        "t_generate_s": t_gen,
        "t_target_s": part[<int>T_TARGET],
        "t_lm_head_s": part[<int>T_HEAD],
        "t_draft_s": part[<int>T_DRAFT],
        "t_verify_s": part[<int>T_VERIFY],
        "t_controller_s": part[<int>T_CONTROL],
        # the first token comes from the prompt pass; the rest from rounds
        "tokens_per_s": (max(n_gen - n_seqs, 0) / t_gen) if n_gen else 0.0,
    }
