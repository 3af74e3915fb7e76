# cython: language_level=3
# distutils: language = c++
"""The speculative controller: draft -> verify -> accept -> rollback -> notify.

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

The round's parts live in their own modules, this class holding them together (see
docs/architecture.md): ``_seq`` (a sequence's memory, request, counters and round),
``_propose`` (drafting), ``_round_budget`` (draft lengths), ``_verify``, ``_output``,
``_rollback`` (one strategy per context: KV trim, recurrent snapshots, or checkpoint +
decode again), ``_prefix_reuse``, ``_prefill`` (a prompt's path: the join's start, chunked
prefill, the first token) and, apart from this class, ``_checks`` (the test driver).

Requests are validated by the API (``specdec._request``); below it, assertions.
"""
from libc.stdint cimport int32_t
from libcpp.vector cimport vector

from ._core cimport Model, Context, Batch
from ._policy cimport DraftPolicy, BatchCost
from ._round_budget cimport wanted, observe_drafter, draft_caps, draft_lengths
from ._timing cimport now, lap, T_TARGET, T_HEAD, T_DRAFT, T_VERIFY, T_CONTROL, N_PARTS
from ._output cimport RUNNING, CTX_FULL
from ._verify cimport Verifier, sparse_rows
from ._grammar cimport GrammarState
from ._seq cimport (_Seq, _SeqRequest, _SeqCounters, new_request, emit, NO_DRAFT, DRAFTED,
                   FILLER, FORCED)
from ._rollback cimport rollback_for
from ._ubatch_split cimport even_rows
from ._steady_rows cimport steady_for, steady_height
from ._prefix_reuse cimport PrefixReuse, HeldState
from ._prefill cimport Prefill
from ._propose cimport propose
from .drafters._base cimport Drafter, Asks


cdef long _round_serial = 0     # rounds of every controller: a round's id for the policies


def new_policy(int n_max, bint adaptive=False) -> DraftPolicy:
    """A draft-length policy (shared by the requests of one configuration, it keeps learning)."""
    return DraftPolicy(n_max, adaptive=adaptive)


cdef class Controller:
    """Controller(ctx, drafters=(), *, n_max=0, exact=False, n_ctx_seq=0, isolate=False)
--

    Runs generation for the sequences of a target context.

    ``drafters``: every drafter a sequence may use, bound to ``ctx``. ``n_max``: the
    longest draft a request will ask for, checked against the context now (``join`` takes
    each request's own). ``exact``: no row's logits depend on the batch (see ``_pad``).
    ``n_ctx_seq``: the tokens a sequence may hold (default: the context's own limit; a
    caller that leaves slack for exact mode's padding rows passes less). ``isolate``: an
    error of a sequence's drafter while it drafts ends that sequence only (``finish_reason``
    "error", ``error(seq)``), where a single caller would rather see it raised.
    """

    def __init__(self, Context ctx not None, drafters=(), *, int n_max=0, bint exact=False,
                 int n_ctx_seq=0, bint isolate=False):
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
        self.rollback = rollback_for(ctx, n_max, exact)
        self.rollback.clock = &self.clock
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
        # a cut back to an earlier point needs that point's window (see _prefix_reuse)
        recurrent = self.model.is_recurrent or self.model.is_hybrid
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
        self.exact = exact
        self.steady = steady_for(ctx, exact)
        self.prefix = PrefixReuse(ctx, self.n_swa, exact)
        self.n_ctx_seq = min(n_ctx_seq, ctx.n_ctx_seq) if n_ctx_seq > 0 else ctx.n_ctx_seq
        self.isolate = isolate
        self.errors = {}
        self.verifier = Verifier(ctx)
        self.batch_cost = BatchCost()
        self.floor = BatchFloor(ctx.n_seq_max)
        self.length = BatchLength(ctx.n_seq_max, self.steady)
        self.verifier.clock = &self.clock
        self.totals = _SeqCounters()
        self.batch = Batch(ctx.n_batch, n_seq_max=ctx.n_seq_max)
        self.asks = Asks()
        self.prompts = Prefill(ctx, self.batch, exact, self.rollback, self.prefix, self.totals)
        self.seqs = []
        cdef _Seq s
        for i in range(ctx.n_seq_max):
            s = _Seq()
            s.id = i
            self.seqs.append(s)

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
        cdef int n = len(prompt), c, i
        assert 0 < n < self.n_ctx_seq, "the prompt length is checked by the API"
        assert max_tokens > 0 and n_max >= 0 and n_min >= 0
        cdef vector[int32_t] toks
        toks.resize(n)
        for i in range(n):
            toks[i] = prompt[i]
            assert 0 <= toks[i] < self.model.n_vocab, "prompt token ids are checked by the API"
        if drafters is None:
            drafters = self.drafters
        else:
            drafters = list(drafters)
            for d in drafters:
                assert any(d is e for e in self.drafters), "a sequence drafts with the controller's drafters"
        assert (n_max if drafters else 0) + 1 <= self.max_rows
        cdef _SeqRequest r = new_request(
            self.model, prompt, drafters, max_tokens, seed, temperature, top_k, top_p, min_p,
            stop, stop_ids, n_max, n_min, policy, logprobs, reuse, repetition_penalty,
            presence_penalty, frequency_penalty, logit_bias, grammar)
        s.req = r
        s.cnt = _SeqCounters()
        self.errors.pop(seq, None)
        s.kind = NO_DRAFT
        s.n_forced = 0
        s.row0 = -1
        s.k = s.n_pad = 0
        s.n_asked_at = -1
        s.redo = False
        cdef double t0 = now()
        c = self.prefix.join(s, toks.data(), n, reuse)
        try:
            self.prompts.start(s, toks, c, t0)
            while s.prefilling and not defer:
                self.prompts.chunks([s], 0, self.verifier)
        except BaseException:
            self.leave(seq)
            raise
        return n - c

    def prefill(self, int seq, int max_tokens=0) -> bool:
        """Decode the next chunk (``n_batch`` tokens, or ``max_tokens``) of the prompt of a
        join with ``defer``; True once it is all in and the first token sampled. A failed
        decode ends the request (the slot is left) and raises."""
        return self.prefill_together([seq], max_tokens)[0]

    def prefill_together(self, seqs, int max_tokens=0) -> list:
        """``prefill`` of several deferred joins in one decode: the next chunks of their
        prompts in order, together at most ``n_batch`` tokens (or ``max_tokens``), so that
        prompt tails that arrive together cost one decode, not one each (a decode's fixed
        cost is that of several rows). In exact mode only the first goes in (a prompt's rows
        are decoded as when it runs alone). Returns, per sequence, whether its prompt is all
        in and its first token sampled. A failed decode ends the requests it held (their
        slots are left) and raises."""
        cdef list ss = []
        cdef _Seq s
        for seq in seqs:
            s = self._seq(seq)
            if not s.active:
                raise RuntimeError(f"sequence {seq} has no request")
            ss.append(s)
        cdef list todo = [s for s in ss if s.prefilling]
        if self.exact:
            todo = todo[:1]
        if todo:
            try:
                self.prompts.chunks(todo, max_tokens, self.verifier)
            except BaseException:
                for s in todo:
                    self.leave(s.id)
                raise
        return [not s.prefilling for s in ss]

    def leave(self, int seq, *, bint keep=False):
        """End the request on ``seq`` (finished or not); its results stay readable until the
        slot is joined again. ``keep``: keep its KV for a later request's prefix reuse."""
        cdef _Seq s = self._seq(seq)
        s.active = False
        s.row0 = -1
        if s.req is not None:
            s.req.pen = None         # its per-token counts (a vocabulary's worth)
        if s.prefilling:
            s.prefilling = False
            s.mem.prompt.clear()
            keep = False
        if keep and s.req is not None and s.req.out.finish == CTX_FULL:
            keep = False         # a checkpoint arch may hold a padding row past ``mem``
        if not keep:
            self.ctx.seq_rm_c(s.id, -1, -1)
            s.mem.forget()

    # --- prefix reuse (``_prefix_reuse``) ------------------------------------------------

    def reusable(self, int seq, prompt) -> int:
        """Prompt tokens a join of ``prompt`` on free slot ``seq`` with ``reuse`` would keep."""
        self.ctx._alive()
        return self.prefix.reusable(self._seq(seq), prompt)

    def kept_prefix(self, HeldState held not None, prompt) -> int:
        """Prompt tokens a join of ``prompt`` with reuse would keep of the slot state
        ``held`` once ``restore_held`` put it back."""
        return self.prefix.kept_prefix(held, prompt)

    def save_held(self, int seq):
        """What free slot ``seq`` holds (``held(seq)``), saved for a prompt cache: a
        ``HeldState``, or None when it holds nothing, or its memory is not what ``held``
        says."""
        self.ctx._alive()
        cdef _Seq s = self._seq(seq)
        if s.active:
            raise RuntimeError(f"sequence {seq} is in use")
        return self.prefix.save(s)

    def restore_held(self, int seq, HeldState held not None) -> bool:
        """Free slot ``seq`` (any slot) holds what ``save_held`` saved again. False, the slot
        then holding nothing, when llama.cpp could not place it (no room in the cache)."""
        self.ctx._alive()
        cdef _Seq s = self._seq(seq)
        if s.active:
            raise RuntimeError(f"sequence {seq} is in use")
        self.leave(seq)
        return self.prefix.restore(s, held)

    # --- the round --------------------------------------------------------------------

    def step(self) -> int:
        """One round for every running sequence; returns how many are still running."""
        cdef _Seq s
        cdef int i, room, rows = 0, alive = 0
        cdef double t0 = now()
        cdef double part0[5]
        self.clock.mark = t0          # the caller's time between rounds is not generation time
        for i in range(N_PARTS):
            part0[i] = self.clock.part[i]
        cdef list in_batch = []
        global _round_serial
        _round_serial += 1       # a policy shared by this round's sequences counts it once
        for s in self.seqs:
            if not s.active or s.prefilling or s.req.out.finish != RUNNING:
                continue
            if s.mem.n_past >= self.n_ctx_seq:
                s.req.out.set_finish(CTX_FULL)
                continue
            wanted(s, _round_serial)
            room = self.rollback.cap_drafts(min(s.req.out.max_tokens - s.req.out.n_tokens,
                                                self.n_ctx_seq - s.mem.n_past - 1,
                                                self.max_rows - rows - 1))
            s.k_lim = room
            s.k_cap = min(s.k_want, room)
            # a grammar's forced tokens cost no drafting and are accepted: a sequence that
            # drafts takes them up to its n_max whatever the policy's cap (0 included)
            s.k_room = (min(s.req.policy.n_max, room)
                        if s.req.grammar is not None and s.req.n_drafters > 0 else 0)
            rows += max(s.k_cap, s.k_room, 0) + 1
            in_batch.append(s)
        # a batch drafted by a model: its length measured (``_batch_length``); else the
        # batch's floor may hold the adaptive drafts
        if not self.length.judge(in_batch):
            self.floor.judge(in_batch)
        draft_caps(self.batch_cost, in_batch)
        lap(&self.clock, T_CONTROL)
        propose(self.asks, in_batch, self.isolate, self.errors)
        cdef double t_drafted = lap(&self.clock, T_DRAFT)
        in_batch = [s for s in in_batch if s.req.out.finish == RUNNING]
        draft_lengths(self.batch_cost, in_batch, t_drafted)
        if not in_batch:
            lap(&self.clock, T_CONTROL)
            self.totals.t_gen += self.clock.mark - t0
            return 0
        if self.exact:
            self._pad(in_batch)
        else:
            even_rows(self.rollback, self.batch_cost, in_batch, self.max_rows)
            if self.steady and len(in_batch) == 1:
                steady_height(self.rollback, <_Seq> in_batch[0], self.n_ctx_seq)
        self.totals.rounds += 1
        cdef list group
        for group in self.rollback.groups(in_batch, False):
            self._decode_verify(group)
        for group in self.rollback.groups([s for s in self.seqs if s.redo], True):
            self._decode_again(group)
        for s in in_batch:
            s.row0 = -1
        lap(&self.clock, T_CONTROL)
        self.totals.t_gen += self.clock.mark - t0
        self.floor.settle(in_batch, self.clock.mark - t0)
        self.length.settle(in_batch, self.clock.mark - t0)
        for s in in_batch:
            s.cnt.t_gen += self.clock.mark - t0
            for i in range(N_PARTS):
                s.cnt.t_part[i] += self.clock.part[i] - part0[i]
        for s in self.seqs:
            if s.active and not s.prefilling and s.req.out.finish == RUNNING:
                alive += 1
        return alive

    cdef int _decode_verify(self, list group) except -1:
        """Decode ``last, d1..dk`` (and padding) of every sequence of ``group`` in one
        batch, then verify each."""
        cdef _Seq s
        cdef int i
        # a lone sequence held to one shape (``_steady_rows``) gives its padding outputs too;
        # padding that keeps several sequences' batch whole (``even_rows``) needs none
        cdef bint pad_out = self.steady and len(group) == 1
        self.batch.clear_c()
        for s in group:
            s.row0 = self.batch.b.n_tokens
            self.batch.add_c(s.last, s.mem.n_past, s.id, True)
            for i in range(s.k):
                self.batch.add_c(s.draft.tokens[i], s.mem.n_past + 1 + i, s.id, True)
            for i in range(s.n_pad):
                self.batch.add_c(s.last, s.mem.n_past + 1 + s.k + i, s.id, pad_out)
        lap(&self.clock, T_CONTROL)
        self.rollback.before_decode(group)
        self.ctx.decode_c(self.batch, sparse_rows(group))
        cdef double t_dec = lap(&self.clock, T_TARGET)
        if len(group) > 1:
            self.verifier.prefetch(group)
            t_dec += lap(&self.clock, T_HEAD)
        # the sequences under a grammar are verified together (their head passes shared);
        # the time is the decode's, shared by rows as the rest of it
        cdef double t_lock = self.clock.mark
        self.verifier.lockstep(group)
        lap(&self.clock, T_VERIFY)
        t_dec += self.clock.mark - t_lock
        cdef int n_in = len(group), n_rows = self.batch.b.n_tokens
        if n_in > 1:
            self.batch_cost.observe(n_rows, t_dec)
        for s in group:
            s.cnt.rounds += 1
            self._verify(s, self.batch_cost.share(t_dec, n_rows, n_in, s.k + 1 + s.n_pad))
        return 0

    cdef int _pad(self, list in_batch) except -1:
        """Exact mode: give every row of the verify batch logits that do not depend on the batch.

        llama.cpp's CPU matmuls take tinyBLAS for two or more rows and vec_dot for
        one, and the two round differently; repacked weights even depend on the row
        count mod 4. With repacking off and never a single row, every row's logits
        are the same whatever the batch, so speculative output equals plain output.

        A sequence with nothing to verify but its pending token gets a free guess (the
        pending token again), verified like a draft. The rollback strategy then evens the
        rows of the batch's sequences (``Rollback.pad``, ``Rollback.groups``).
        """
        cdef _Seq s
        cdef int rows = 2
        for s in in_batch:
            if s.k == 0 and s.mem.n_past + 1 < self.n_ctx_seq and s.req.out.n_tokens < s.req.out.max_tokens:
                s.draft.tokens.push_back(s.last)
                s.k = 1
                s.kind = FILLER
                self.totals.filler += 1
                s.cnt.filler += 1
            rows = max(rows, s.k + 1)
        return self.rollback.pad(in_batch, rows, self.max_rows)

    cdef int _decode_again(self, list group) except -1:
        """After a checkpoint was restored (``CheckpointRollback``): decode ``last, d1..da, y``
        again for the sequences of ``group``, and sample the next token from ``y``'s row.
        Its cost is charged to the round that rejected, for the policy to weigh."""
        cdef _Seq s
        cdef int i, n_rows = self.rollback.decode_again(self.batch, group)
        cdef int32_t z
        cdef Drafter d
        if n_rows == 0:
            return 0
        cdef double t_dec = lap(&self.clock, T_TARGET), t_head
        for s in group:
            if not s.redo:
                continue
            s.redo = False
            self.totals.redecodes += 1
            s.cnt.redecodes += 1
            # exact mode: the lazy head computes two rows, as a verify's first pass does
            self.ctx.prepare_logits_c(s.row0 + s.a, 2)
            t_head = lap(&self.clock, T_HEAD)
            self.verifier.pen = s.req.pen
            self.verifier.grammar = s.req.grammar
            z = self.verifier.sample(s.row0 + s.a + 1, s.req.greedy, s.req.sp, s.req.rng)
            s.mem.n_past += 1
            s.mem.tokens.push_back(s.last)
            lap(&self.clock, T_VERIFY)
            for i in range(s.req.n_drafters):
                d = <Drafter> s.req.drafters[i]
                d.observe_c(s.id, &s.last, 1, s.row0 + s.a + 1)
            lap(&self.clock, T_DRAFT)
            s.t_v += t_dec * (s.a + 2) / n_rows + t_head
            self._observe_policy(s, s.k, s.a, s.a + 2)
            if not emit(s, self.ctx, z, s.row0 + s.a + 1):
                s.last = z
            s.row0 = -1
        return 0

    cdef int _verify(self, _Seq s, double t_dec) except -1:
        lap(&self.clock, T_CONTROL)
        cdef double t_v = self.clock.mark
        cdef int a, i, k = s.k
        cdef int32_t y
        cdef Drafter d
        self.rollback.drop_padding(s)
        self.verifier.pen = s.req.pen
        self.verifier.grammar = s.req.grammar
        if s.verified:
            a, y = s.a, s.y
            s.verified = False
        elif s.req.greedy:
            a = self.verifier.greedy(s.row0, s.draft, k, &y)
        else:
            a = self.verifier.rejection(s.row0, s.draft, k, s.req.sp, s.req.rng, &y)
        # the target's memory keeps ``last, d1..da``; the rest is rolled back (or, with
        # checkpoints, all of it, and ``last, d1..da`` decoded again: ``_decode_again``)
        cdef int keep = s.mem.n_past + 1 + a, n_old = s.mem.n_past
        cdef bint finished = False
        cdef bint redo = self.rollback.after_verify(s, a)
        # what the policy weighs is the whole verification: the decode, the lazy head's
        # passes (with gemma's 262k vocab as costly per row as the trunk), the rollback and,
        # on checkpoint archs, saving the checkpoint (the decode again is added later)
        lap(&self.clock, T_VERIFY)
        t_v = t_dec + self.clock.mark - t_v + s.t_ckpt
        self.scratch.clear()
        self.scratch.push_back(s.last)
        for i in range(a):
            self.scratch.push_back(s.draft.tokens[i])
        s.mem.tokens.insert(s.mem.tokens.end(), self.scratch.begin(), self.scratch.end())
        lap(&self.clock, T_CONTROL)
        for i in range(s.req.n_drafters):
            d = <Drafter> s.req.drafters[i]
            d.observe_c(s.id, self.scratch.data(), a + 1, s.row0)
            if s.kind == DRAFTED and i == s.proposer:
                # of its own proposal: one drafted past a forced run follows ``n_lead`` tokens
                d.accept_c(s.id, max(0, a - s.n_lead))
        lap(&self.clock, T_DRAFT)
        s.mem.n_past = keep
        if s.kind == DRAFTED or s.kind == FORCED:   # the exact-mode filler is not a draft
            self._count(s, k, a)
            self._on_verified(s, keep - 1 - a, k, a)
        s.t_v = t_v
        s.a = a
        s.prev = s.last
        # emit d1..da then y, stopping at EOS / stop strings / max_tokens
        for i in range(a):
            if emit(s, self.ctx, s.draft.tokens[i], s.row0 + i):
                finished = True
                break
        if not finished:
            finished = emit(s, self.ctx, y, s.row0 + a)
            if not finished:
                s.last = y
                s.redo = redo
        if finished and redo:
            # no decode again: the restored memory ends before ``last`` (as ``tokens`` must)
            s.mem.n_past = n_old
            s.mem.tokens.resize(n_old)
        if not s.redo:
            self._observe_policy(s, k, a, a + 1)
        return 0

    cdef int _count(self, _Seq s, int k, int a) except -1:
        self.totals.count(k, a)
        s.cnt.count(k, a)
        return 0

    cdef int _on_verified(self, _Seq s, int pos, int k, int a) except -1:
        return 0

    cdef int _observe_policy(self, _Seq s, int k, int a, int tokens) except -1:
        """The round's outcome and cost to the policy (not for the exact-mode filler guess)."""
        if s.kind == FILLER or s.kind == FORCED:     # no drafter's proposal
            return 0
        return observe_drafter(s, k, a, tokens)

    # --- results ----------------------------------------------------------------------

    def take(self, int seq=0):
        """``(text bytes, token ids, logprobs or None)`` released for ``seq`` since the last
        call (for streaming; text that could still begin a stop string is held back)."""
        return self._out(seq).take()

    def _out(self, int seq):
        cdef _Seq s = self._seq(seq)
        if s.req is None:
            raise RuntimeError(f"sequence {seq} has had no request")
        return s.req.out

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

    def prompt_left(self, int seq) -> int:
        """Prompt tokens of a deferred join not decoded yet (0 once its prompt is all in)."""
        cdef _Seq s = self._seq(seq)
        return <int> s.mem.prompt.size() - s.mem.n_filled if s.prefilling else 0

    def held(self, int seq) -> list:
        """The tokens in the target's memory for ``seq``, by position."""
        cdef _Seq s = self._seq(seq)
        return [s.mem.tokens[i] for i in range(s.mem.tokens.size())]

    def stats(self, seq=None) -> dict:
        """Counters as plain Python values: of request ``seq``, or (None) the totals of every
        request and round since the controller began (their token rate is not measured)."""
        cdef _Seq s
        if seq is None:
            return self.totals.stats(0, 0, self.clock.part)
        s = self._seq(seq)
        n_gen = s.req.out.n_tokens if s.req is not None else 0
        return s.cnt.stats(n_gen, 1, s.cnt.t_part)

