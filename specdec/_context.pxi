# Part of _core (included by _core.pyx): Context, llama.cpp's memory and decode outputs.
# Long because it is one cdef class, which Cython cannot split across files (over 600 lines); what
# is not a method lives apart (_context_params.pxi, _lazy_head.pxi, _views.pxi).

#: the decode watchdog (Context.decode_timeout = 0): a decode may take this many times what
#: the context's slowest decode so far would take for its tokens, and at least WATCHDOG_MIN_S;
#: before any decode has finished, WATCHDOG_FIRST_S. Checked between graph nodes.
cdef double WATCHDOG_FACTOR = 100.0
cdef double WATCHDOG_MIN_S = 30.0
cdef double WATCHDOG_FIRST_S = 600.0


cdef cbool _abort_cb(void * data) noexcept nogil:
    return sd_stop_now(<const sd_stop_flag *> data)


cdef cbool _load_progress(float progress, void * data) noexcept nogil:
    return not sd_stop_now(<const sd_stop_flag *> data)


# __dealloc__ frees through self.model (remote or local, and the model must outlive it):
# the cycle collector must not clear it first
@cython.no_gc_clear
cdef class Context:
    """Context(model, *, n_ctx=4096, n_batch=512, n_ubatch=None, n_threads=None, n_threads_batch=None, n_seq_max=1, kind="default", n_rollback=0, mtp_hidden=None, flash_attn=None, swa_full=True, kv_unified=None, n_outputs_max=0, lazy_logits=False, batch_invariant=False, offload_kqv=None, other=None)
--

    A llama.cpp context: KV / recurrent memory and the decode loop's outputs.

    ``kind="mtp"`` makes a context that runs the model's MTP head (its own KV,
    MTP layers only). ``n_rollback`` lets the last decode of a recurrent/hybrid
    model be rolled back by up to that many tokens per sequence (llama.cpp keeps
    that many recurrent-state snapshots, ``n_rs_seq``; qwen35 and kin); on
    qwen35/qwen35moe each decode writes only those its batch can need
    (``rollback_trim``). ``mtp_hidden`` turns on the target's hidden states for MTP:
    ``"masked"`` (rows for output tokens only) or ``"dense"`` (one row per batch entry).
    ``other`` is the target context an EAGLE-3 draft without its own token embeddings or
    LM head borrows them from (llama.cpp: ``ctx_other``); ``set_layer_inputs`` makes a target
    keep the layer inputs such a draft reads, and ``encode`` runs the draft's encoder.
    ``batch_invariant=True`` makes every row of a batch of 2 rows or more come out
    bit-identical whatever else the batch holds (exact mode), weights not repacked
    (``Model(use_extra_bufts=False)``); see ``_batch_invariant.h``. That holds on the CPU.
    Layers on a GPU or on RPC servers compute by that device's kernels, which pick their
    algorithm by row count: ``check_batch_invariance`` tests them (``specdec rpc-server
    --batch-invariant`` makes a server's hold), and ``invariant_rows`` says how far that was
    shown. ``backends`` names the backends that compute the context's rows.

    ``swa_full=False`` gives a model's sliding-window layers a cache of about one window per
    sequence (llama.cpp's default) instead of every position. llama.cpp then overwrites a
    cell as soon as it falls out of the window of its sequence's next position, so a sequence
    can be cut back (``seq_rm``) only within its last decoded ubatch, or to a point whose
    window is still held (``seq_pos_min``): ``Controller`` keeps to that. Decoder and Engine
    keep every position: on the CPU the window saved under 3% of a decode (gemma3-270m, 8
    sequences of 1,000-1,600 tokens; flash attention skips masked cells), and a prompt that
    comes back would find the window of its end overwritten. A sequence's state
    (``save_state``) holds only the window of its last position either way.

    The decode watchdog stops a decode that runs far past what the context's decodes take
    (between graph nodes, as ``interrupt`` does) and raises ``DecodeTimeoutError``: a graph
    that never finishes is an error, not a hang. ``decode_timeout`` (seconds, settable) fixes
    the limit; 0 (the default) adapts it: 100 times what this context's slowest decode so far
    would take for the batch's tokens, at least 30 s, and 600 s before any decode has
    finished; a negative value turns the watchdog off.

    The context holds ``n_ctx`` positions (``n_ctx_seq`` per sequence), as asked: llama.cpp
    allocates whole multiples of 256, and the core refuses positions past the size asked for.
    llama.cpp caps ``n_batch`` at ``n_ctx``.
    """

    def __cinit__(self):
        self.ctx = NULL
        self._busy = 0
        self._stop.requested = False
        self._stop.watch = False
        self._stop.since = 0
        self._stop.deadline = 0
        self.decode_timeout = 0
        self._s_per_token = 0
        self._n_views = 0
        self._closed_ctx = NULL
        self._head = new sd_lm_head()
        self._lazy = False
        self._aborted = None

    def __init__(self, Model model not None, *, n_ctx=4096, n_batch=512, n_ubatch=None,
                 n_threads=None, n_threads_batch=None, n_seq_max=1, kind="default", n_rollback=0,
                 mtp_hidden=None, flash_attn=None, swa_full=True, kv_unified=None,
                 n_outputs_max=0, bint lazy_logits=False, bint batch_invariant=False,
                 offload_kqv=None, Context other=None):
        if self.ctx != NULL:
            raise RuntimeError("Context is already initialised")
        model._alive()
        cdef llama_context_params p = _context_params(
            model, n_ctx, n_batch, n_ubatch, n_threads, n_threads_batch, n_seq_max, kind,
            n_rollback, mtp_hidden, flash_attn, swa_full, kv_unified, n_outputs_max, lazy_logits,
            batch_invariant, offload_kqv)
        n_rollback = p.n_rs_seq
        n_threads = p.n_threads
        n_outputs_max = p.n_outputs_max
        cdef bint is_mtp = p.ctx_type == LLAMA_CONTEXT_TYPE_MTP
        if other is not None:
            if model.arch not in LAYER_DRAFT_ARCHS | BLOCK_DRAFT_ARCHS:
                raise ValueError(f"other= is for draft models that borrow the target's "
                                 f"embeddings and LM head "
                                 f"({sorted(LAYER_DRAFT_ARCHS | BLOCK_DRAFT_ARCHS)}), not "
                                 f"{model.arch!r}")
            other._alive()
            p.ctx_other = other.ctx
        p.abort_callback = _abort_cb
        p.abort_callback_data = <void *> &self._stop
        if lazy_logits:
            self._head.enabled = True
            self._head_installed = True
            self._head.batch_invariant = batch_invariant
            self._head.n_threads = n_threads
            p.cb_eval = sd_lm_head_cb
            p.cb_eval_user_data = <void *> self._head
        _clear_recent()
        cdef string why
        cdef int rrc = SD_REMOTE_OK
        cdef bint remote = model.is_remote
        with nogil:
            if remote:
                rrc = sd_remote_init(model.model, p, &self.ctx, model._timeout, why)
            else:
                self.ctx = sd_init_from_model(model.model, p)
        if rrc != SD_REMOTE_OK:
            self.ctx = NULL
            model._remote_failed(rrc, why, "context creation")
        _raise_abort("creating the context")
        if self.ctx == NULL:
            why_s = _recent_errors()
            raise ValueError("failed to create the context" + (f": {why_s}" if why_s else ""))
        why_graph = sd_check_graph(self.ctx, _computable_types())
        if not why_graph.empty():
            self._free_ptr(self.ctx)
            self.ctx = NULL
            raise GGUFError(f"model {os.path.basename(model.path or '')} cannot be computed: "
                            f"{why_graph.decode('utf-8', 'replace')}")
        self.model = model
        self.other = other
        self.backends = [b.decode("utf-8", "replace") for b in sd_backend_names(self.ctx)]
        self.swa_full = bool(swa_full)
        self.kv_unified = p.kv_unified
        self.invariant_rows = 0
        if batch_invariant:
            # the CPU's kernels are made batch-invariant here; a GPU's and RPC servers' follow
            # their own rules: check_batch_invariance() finds out, and invariant_rows stays 0
            # (not known) until it has
            self.invariant_rows = 0 if sd_set_cpu_ref_kernels(self.ctx, True) else -1
        self.batch_invariant = batch_invariant
        self.mem = llama_get_memory(self.ctx)
        # llama.cpp allocates whole multiples of 256 positions; the context holds what was asked
        self.n_ctx = min(llama_n_ctx(self.ctx), n_ctx)
        self.n_ctx_seq = min(llama_n_ctx_seq(self.ctx),
                             n_ctx if p.kv_unified else n_ctx // n_seq_max)
        self.n_batch = llama_n_batch(self.ctx)
        self.n_ubatch = llama_n_ubatch(self.ctx)
        self.n_seq_max = llama_n_seq_max(self.ctx)
        self.n_rollback = llama_n_rs_seq(self.ctx)
        self._seq_ntok = vector[int32_t](self.n_seq_max, 0)
        self.n_threads = n_threads
        self.is_mtp = is_mtp
        self.n_vocab = model.n_vocab
        self._n_embd_in = model.n_embd_out if is_mtp else llama_model_n_embd_inp(model.model)
        self._needs_rollback_guard = (model.is_recurrent or model.is_hybrid) and not is_mtp
        # one KV stream of an attention-only target: llama.cpp's split_simple, batch order
        self._lazy_multi = ((p.kv_unified or self.n_seq_max == 1) and mtp_hidden is None
                            and not (model.is_recurrent or model.is_hybrid))
        self._rollback_trim = self._rollback_trim_possible()
        self._interleaved_ref = sd_flash_attn(self.ctx) and not batch_invariant
        self._rollback_budget = vector[int32_t](self.n_seq_max, 0)
        self._last_n_tokens = 0
        self._mtp_hidden = 0
        self._n_feat = (len(model.target_layers) * model.n_embd
                        if model.arch in BLOCK_DRAFT_ARCHS else 0)
        self.causal_attn = True
        # llama.cpp asserts a decode's outputs fit n_outputs_max (0: n_batch; encoders: n_batch)
        self._n_outputs_max = (n_outputs_max if n_outputs_max > 0
                               and not llama_model_has_encoder(model.model) else self.n_batch)
        if self.n_rollback > 0 and self.n_ubatch <= self.n_rollback + 1:
            raise ValueError(f"n_rollback={self.n_rollback} needs n_ubatch >= "
                             f"{self.n_rollback + 2}, "
                             f"llama.cpp made n_ubatch={self.n_ubatch}")
        if n_rollback > 0 and self.n_rollback != n_rollback:
            raise ValueError(f"llama.cpp kept n_rollback={self.n_rollback}, not {n_rollback}")
        if is_mtp:
            self.set_mtp_hidden(mtp_hidden or "masked")
        elif mtp_hidden is not None:
            self.set_mtp_hidden(mtp_hidden)

    def __dealloc__(self):
        if self.ctx != NULL:
            self._free()
        if self._closed_ctx != NULL:
            self._free_ptr(self._closed_ctx)
            self._closed_ctx = NULL
        del self._head
        self._head = NULL

    cdef void _free_ptr(self, llama_context * ctx) noexcept:
        # a context of a model whose RPC server died is left allocated (see RPCError)
        cdef string why
        cdef Model m = self.model
        if m is None or not m._remote_dead():
            if m is not None and m.is_remote:
                with nogil:
                    sd_remote_free_context(ctx, m._timeout, why)
            else:
                llama_free(ctx)

    cdef void _free(self) noexcept:
        self._free_ptr(self.ctx)
        self.ctx = NULL

    def close(self):
        """Free llama.cpp's context now. While a view of its outputs (``logits()`` ...) is
        alive the memory is kept, and freed with the last view; the context is closed either way."""
        self._enter()
        try:
            if self.ctx != NULL:
                self._closed_ctx = self.ctx
                self.ctx = NULL
                self._free_closed()
        finally:
            self._leave()

    cdef void _free_closed(self) noexcept:
        if self._closed_ctx != NULL and self._n_views == 0:
            self._free_ptr(self._closed_ctx)
            self._closed_ctx = NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"Context(kind={'mtp' if self.is_mtp else 'default'!r}, n_ctx={self.n_ctx}, "
                f"n_batch={self.n_batch}, n_seq_max={self.n_seq_max}, "
                f"n_rollback={self.n_rollback})")

    cdef int _enter(self) except -1:
        # the GIL makes this check-and-set atomic between Python threads
        if self._busy:
            raise ContextBusyError("this Context is in use by another thread; use one Context "
                                   "per thread")
        self._busy = 1
        return 0

    cdef void _leave(self) noexcept:
        self._busy = 0

    cdef int _alive(self) except -1:
        if self.ctx == NULL:
            if self._aborted is not None:
                raise LlamaAbortError("this Context is unusable after llama.cpp aborted in "
                                      f"{self._aborted[0]}", self._aborted[1])
            raise RuntimeError("Context is closed")
        if self.other is not None and self.other.ctx == NULL:
            # llama.cpp's draft graph reads the target's weights through it
            raise RuntimeError("the target context this draft context borrows from is closed")
        if self.model.is_remote:
            self.model._alive()
        return 0

    cdef int _check_abort(self, str what) except -1:
        """After a guarded call: if llama.cpp aborted in it, the context's state is
        half-updated; free it (as ``close``) and raise LlamaAbortError."""
        aborted = _take_abort()
        if aborted is None:
            return 0
        self._aborted = (what, aborted)
        self._last_n_tokens = 0
        self._out_row.clear()
        self._leave()   # the call that aborted is over, whether or not it was entered
        self.close()
        raise LlamaAbortError(f"{what} on this Context; it is freed and unusable", aborted)

    # --- settings ---------------------------------------------------------------------

    def set_mtp_hidden(self, mode):
        """Hidden states for MTP: None (off), "masked" (output rows) or "dense" (every row)."""
        self._alive()
        if mode not in (None, "masked", "dense"):
            raise ValueError(f"mode must be None, 'masked' or 'dense', got {mode!r}")
        if mode is not None:
            _check_mtp_model(self.model, False)
            if self._head.enabled and self.model.arch not in LAZY_MTP_ARCHS:
                raise ValueError(f"MTP hidden states and lazy_logits go together only on "
                                 f"{sorted(LAZY_MTP_ARCHS)}")
        # most of llama.cpp's MTP graphs keep every row in h_nextn, so "masked" on their MTP
        # context is only right when every row is an output and "dense" is right for mixed
        # batches; the pruned ones keep only the output rows, which "masked" reads
        if self.is_mtp and mode is None:
            raise ValueError("an MTP context always outputs its hidden states")
        if self.is_mtp and mode == "dense" and self.model.arch in MTP_PRUNED_ARCHS:
            raise ValueError(f"{self.model.arch}'s MTP graph keeps hidden states of output rows "
                             "only: its MTP context reads them with mtp_hidden='masked'")
        self._mtp_hidden = 0 if mode is None else (1 if mode == "masked" else 2)
        llama_set_embeddings_nextn(self.ctx, mode is not None, mode == "masked")

    @property
    def mtp_hidden(self):
        """Which hidden states for MTP the decodes keep: None, "masked" or "dense"."""
        return (None, "masked", "dense")[self._mtp_hidden]

    @property
    def rollback_trim(self):
        """Whether decode graphs write only the recurrent snapshots their batch can roll back
        (``min(n_rollback, tokens per sequence - 1)``; none for one-token decodes) instead of
        all ``n_rollback``. On by default where supported (``ROLLBACK_TRIM_ARCHS``, see
        ``_rs_graph.h``); outputs are the same either way, it only saves time."""
        return self._rollback_trim

    @rollback_trim.setter
    def rollback_trim(self, value):
        value = bool(value)
        if value and not self._rollback_trim_possible():
            raise ValueError(f"rollback_trim needs n_rollback > 0 and an arch in "
                             f"{sorted(ROLLBACK_TRIM_ARCHS)}")
        self._rollback_trim = value

    def _rollback_trim_possible(self):
        return self.n_rollback > 0 and self.model.arch in ROLLBACK_TRIM_ARCHS

    def set_mtp_head(self, index):
        """Pick which of the model's MTP heads an MTP context runs (multi-head archs only)."""
        self._alive()
        index = _int_arg("index", index, I32_MIN, I32_MAX)
        if not self.is_mtp:
            raise ValueError("set_mtp_head applies to MTP contexts")
        if not 0 <= index < self.model.n_mtp_layers:
            raise ValueError(f"MTP head {index} out of range [0, {self.model.n_mtp_layers})")
        if index and self.model.arch not in MTP_MULTI_HEAD_ARCHS:
            raise ValueError(f"{self.model.arch} runs a single MTP head")
        llama_set_nextn_layer_offset(self.ctx, index)

    def set_causal_attn(self, bint value):
        """Causal attention (the default) or not: without it every row of a decode attends to
        the whole sequence, its later rows included (DFlash drafts a block that way), and a
        decode takes at most ``n_ubatch`` tokens (llama.cpp asserts it)."""
        self._alive()
        llama_set_causal_attn(self.ctx, value)
        self.causal_attn = value

    def set_threads(self, n_threads, n_threads_batch=None):
        self._alive()
        _check_positive("n_threads", n_threads)
        nb = n_threads if n_threads_batch is None else n_threads_batch
        _check_positive("n_threads_batch", nb)
        _check_threads(n_threads, nb)
        llama_set_n_threads(self.ctx, n_threads, nb)
        self.n_threads = n_threads
        self._head.n_threads = n_threads

    def set_lazy_head(self, on, *, grammar=None):
        """Turn the lazy LM head off (every decode then runs llama.cpp's whole graph, its
        own head included) or on again, between decodes. Only a context made with
        ``lazy_logits=True`` has the head to turn on (its graph callback is set at
        creation); ``specdec.head_choice`` turns it off where llama.cpp's head is faster.

        ``grammar``: whether, while it is off, decodes holding rows a grammar masks (the
        controller's, under a constraint) still stop at the norm: the verifier then gets a
        row that allows few tokens as those tokens' logits alone (``masked_logits_c``), far
        cheaper than either whole head (None: unchanged; it starts False)."""
        self._alive()
        if (on or grammar) and not self._head_installed:
            raise ValueError("this context was made without lazy_logits: there is no lazy "
                             "head to turn on")
        self._head.enabled = bool(on)
        if grammar is not None:
            self._head.grammar = bool(grammar)

    @property
    def lazy_head_grammar(self) -> bool:
        """Whether decodes holding a grammar's rows use the lazy head while it is off
        (``set_lazy_head``)."""
        return self._head.grammar

    @property
    def lazy_logits(self) -> str:
        """The lazy LM head: ``"off"``, ``"pending"`` (enabled, the first decode finds the
        output weight), ``"on"``, or why it cannot run on this model."""
        return _lazy_head_status(self._head)

    @property
    def lazy_logits_kernel(self) -> str:
        """The lazy head's kernel: ``"fused-q8_0"`` (a Q8_0 head, every hidden row of a pass
        per weight row, checked bit-identical to ggml's vec_dot at first use), ``"vec_dot"``
        (ggml's own, per row pair), or ``""`` before the first lazy decode's logits."""
        return _lazy_head_kernel(self._head)

    @property
    def lazy_logits_masked_rows(self) -> int:
        """Rows the lazy head computed for a grammar's allowed tokens only, so far
        (``Context.masked_logits_c``)."""
        return self._head.n_masked

    @property
    def lazy_logits_passes(self) -> tuple:
        """``(passes, rows)``: passes the lazy head made over its whole weight so far, and the
        rows they computed (a pass reads every weight row once, whatever rows ride along)."""
        return (self._head.n_passes, self._head.n_whole)

    cdef double _watchdog_limit(self, int n) noexcept:
        """Seconds a decode of ``n`` tokens may run: ``decode_timeout`` when set, else
        WATCHDOG_FACTOR times what this context's slowest decode so far would take (at least
        WATCHDOG_MIN_S), or WATCHDOG_FIRST_S before any decode has finished."""
        if self.decode_timeout > 0:
            return self.decode_timeout
        if self._s_per_token <= 0:
            return WATCHDOG_FIRST_S
        return max(WATCHDOG_MIN_S, WATCHDOG_FACTOR * self._s_per_token * n)

    cdef double _arm_watchdog(self, int n) noexcept:
        cdef double t = sd_monotonic_s()
        self._stop.deadline = t + self._watchdog_limit(n) if self.decode_timeout >= 0 else 0
        return t

    cdef double _disarm_watchdog(self, double t_start, int n, int rc) noexcept:
        """Learn this decode's rate; returns the limit when the watchdog stopped it, else 0."""
        cdef double dt = sd_monotonic_s() - t_start
        cdef double limit = self._stop.deadline - t_start
        cdef bint hit = rc != 0 and self._stop.deadline > 0 and sd_past_deadline(&self._stop)
        self._stop.deadline = 0
        if rc == 0 and n > 0:
            self._s_per_token = max(self._s_per_token, dt / n)
        return limit if hit else 0

    def interrupt(self):
        """Ask a running decode to stop (safe from any thread); it raises ``KeyboardInterrupt``.
        A SIGINT (Ctrl-C) stops a decode on the main thread the same way, between graph nodes."""
        self._stop.requested = True

    # --- decode -----------------------------------------------------------------------

    cdef int _check_batch(self, Batch batch) except -1:
        """What llama.cpp would assert on (in its compute threads, beyond any handler), refused
        here; counts each sequence's tokens into ``_seq_ntok``. Returns the output rows."""
        cdef int n = batch.b.n_tokens
        cdef int i, k, n_out = 0
        cdef llama_seq_id s
        cdef llama_pos p
        if n <= 0:
            raise ValueError("cannot decode an empty batch")
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        if self.is_mtp or self.model.arch in LAYER_DRAFT_ARCHS:
            if batch.n_embd != self._n_embd_in:
                raise ValueError(f"an MTP or EAGLE-3 draft context needs batches with a token "
                                 f"and a hidden row of {self._n_embd_in} floats per entry "
                                 f"(Batch(n_embd=...)), got n_embd={batch.n_embd}")
        elif batch.n_embd != 0 and batch.n_embd != self._n_feat:
            raise ValueError("this context decodes token batches; the batch carries embedding rows"
                             + (f" of {batch.n_embd} floats, not feature rows of {self._n_feat}"
                                if self._n_feat else ""))
        if not self.causal_attn and n > self.n_ubatch:
            raise ValueError(f"with non-causal attention a decode takes at most n_ubatch="
                             f"{self.n_ubatch} tokens, got {n}")
        cdef bint feats = self._n_feat > 0 and batch.n_embd == self._n_feat
        for s in range(self.n_seq_max):
            self._seq_ntok[s] = 0
        for i in range(n):
            n_out += batch.b.logits[i] != 0
            if not feats and (batch.b.token[i] < 0 or batch.b.token[i] >= self.n_vocab):
                raise ValueError(f"token id {batch.b.token[i]} at batch index {i} out of range "
                                 f"[0, {self.n_vocab})")
            p = batch.b.pos[i]
            if p < 0:
                raise ValueError(f"negative position {p} at batch index {i}")
            if batch.b.n_seq_id[i] < 1 or batch.b.n_seq_id[i] > self.n_seq_max:
                raise ValueError(f"batch index {i} has {batch.b.n_seq_id[i]} sequence ids")
            for k in range(batch.b.n_seq_id[i]):
                s = batch.b.seq_id[i][k]
                if s < 0 or s >= self.n_seq_max:
                    raise ValueError(f"sequence id {s} out of range [0, {self.n_seq_max})")
                if p >= self.n_ctx_seq:
                    raise ContextFullError(f"position {p} of sequence {s} is past the context "
                                           f"size n_ctx={self.n_ctx_seq}")
                self._seq_ntok[s] += 1
        if n_out > self._n_outputs_max:
            raise ValueError(f"the batch asks for {n_out} output rows; this context holds at most "
                             f"{self._n_outputs_max} (n_outputs_max)")
        return n_out

    cdef int decode_c(self, Batch batch, bint grammar=False) except -1:
        """Validate, decode with the GIL released, record which rows have outputs.
        ``grammar``: the batch holds rows a grammar masks (``set_lazy_head``)."""
        self._alive()
        cdef int n = batch.b.n_tokens
        cdef int n_out = self._check_batch(batch)
        cdef int i, k, n_seqs_in = 0, most = 0
        cdef llama_seq_id s
        for s in range(self.n_seq_max):
            n_seqs_in += self._seq_ntok[s] > 0
            most = max(most, self._seq_ntok[s])
        _lazy_head_begin(self._head, n, self.n_ubatch, n_seqs_in, self._lazy_multi, grammar)
        self._lazy = False
        # the snapshots the batch can need: a sequence of m tokens rolls back at most m - 1
        cdef bint trim = self._rollback_trim
        cdef uint32_t n_trim = <uint32_t>min(self.n_rollback, most - 1)
        cdef bint remote = self.model.is_remote
        # rows of 3+ sequences, none of them a tile's worth, in ubatches of a tile or more: the
        # tiled attention would compute each tile against all their KV (see _batch_invariant.h)
        cdef bint ref = (self._interleaved_ref and n_seqs_in >= 3 and most < SD_FA_TILE_Q
                         and min(n, self.n_ubatch) >= SD_FA_TILE_Q)
        cdef double timeout = self.model._timeout
        cdef int rrc = SD_REMOTE_OK
        cdef string why
        cdef int32_t rc = 0
        cdef double t_start, timed_out
        # a DFlash draft's feature rows go in alone: llama.cpp reads a batch with tokens as tokens
        cdef llama_batch b = batch.b
        if self._n_feat > 0 and batch.n_embd == self._n_feat:
            b.token = NULL
        self._enter()
        try:
            self._stop.requested = False
            t_start = self._arm_watchdog(n)
            _stop_begin(&self._stop)
            with nogil:
                if remote:
                    rrc = sd_remote_decode(self.ctx, b, trim, n_trim, self.n_rollback, &rc,
                                           timeout, why)
                else:
                    if trim:
                        sd_set_graph_n_rs_seq(self.ctx, n_trim)
                    if ref:
                        sd_set_cpu_ref_kernels(self.ctx, True)
                    rc = sd_decode(self.ctx, b)
                    if ref:
                        sd_set_cpu_ref_kernels(self.ctx, False)
                    if trim:
                        sd_set_graph_n_rs_seq(self.ctx, <uint32_t>self.n_rollback)
        finally:
            _stop_end(&self._stop)
            self._leave()
        timed_out = self._disarm_watchdog(t_start, n, rc)
        # the outputs of the previous decode are gone, whatever this one did
        self._last_n_tokens = 0
        self._out_row.clear()
        if rrc != SD_REMOTE_OK:
            self.model._remote_failed(rrc, why, "a decode")
        self._check_abort("decode")
        if rc != 0:
            for s in range(self.n_seq_max):
                self._rollback_budget[s] = 0
            if rc == 1:
                raise ContextFullError(f"no room in the KV cache for {n} tokens (n_ctx={self.n_ctx})")
            if rc == 2 and timed_out:
                raise DecodeTimeoutError(
                    f"a decode of {n} tokens ran past the watchdog's {timed_out:.3g} s and was "
                    "stopped (Context.decode_timeout)")
            if rc == 2:
                # Ctrl-C: Python raises its KeyboardInterrupt here; interrupt(): ours
                requested = self._stop.requested
                self._stop.requested = False
                if not requested:
                    _raise_pending()
                raise KeyboardInterrupt("decode interrupted")
            why_s = _recent_errors()
            raise DecodeError(f"llama_decode failed ({rc})" + (f": {why_s}" if why_s else ""))
        self._lazy = _lazy_head_finish(self._head, n_out, self.n_vocab) == 1
        self._last_n_tokens = n
        self.n_decodes += 1
        if n != self._shape_rows or n_out != self._shape_out or most != self._shape_most:
            self.n_shape_changes += 1
            self._shape_rows, self._shape_out, self._shape_most = n, n_out, most
        self._layer_inp_ok = not self._layer_inp.empty()
        self._out_row.resize(n)
        k = 0
        for i in range(n):
            self._out_row[i] = k if batch.b.logits[i] else -1
            k += batch.b.logits[i] != 0
        for s in range(self.n_seq_max):
            self._rollback_budget[s] = (min(self.n_rollback, self._seq_ntok[s] - 1)
                                        if self._seq_ntok[s] > 0 else 0)
        if _pending:
            _raise_pending()
        return 0

    def decode(self, Batch batch not None):
        """Decode a batch (GIL released). Outputs are readable until the next decode."""
        self.decode_c(batch)

    cdef float * logits_c(self, int i) noexcept nogil:
        if i < 0 or i >= self._last_n_tokens or self._out_row[i] < 0:
            return NULL
        if self._lazy:
            return _lazy_head_logits(self._head, self._out_row[i], self.n_vocab)
        return llama_get_logits_ith(self.ctx, i)

    cdef float * masked_logits_c(self, int i, const uint32_t * bits) noexcept nogil:
        """Batch row ``i``'s logits for the tokens set in ``bits`` only (the rest -inf), if
        the lazy head has not computed the row yet; else NULL (read ``logits_c`` and mask)."""
        if not self._lazy or i < 0 or i >= self._last_n_tokens or self._out_row[i] < 0:
            return NULL
        cdef int r = self._out_row[i]
        if self._head.done[r]:
            return NULL
        sd_lm_head_compute_masked(self._head, r, bits)
        return self._head.logits.data() + <size_t>r * self.n_vocab

    cdef bint logits_ready_c(self, int i) noexcept nogil:
        """Whether reading batch row ``i``'s logits costs nothing more (a lazy row not
        computed yet costs a pass over the head)."""
        if not self._lazy or i < 0 or i >= self._last_n_tokens or self._out_row[i] < 0:
            return True
        return self._head.done[self._out_row[i]] != 0

    cdef void prepare_logits_c(self, int i0, int n) noexcept nogil:
        """Compute the logits of batch rows ``i0 .. i0+n-1`` in one pass (lazy head only)."""
        if not self._lazy or n <= 0 or i0 < 0 or i0 + n > self._last_n_tokens:
            return
        cdef int r0 = -1, r1 = -1, i
        for i in range(i0, i0 + n):
            if self._out_row[i] >= 0:
                if r0 < 0:
                    r0 = self._out_row[i]
                r1 = self._out_row[i] + 1
        if r0 >= 0:
            sd_lm_head_compute(self._head, r0, r1)

    cdef void prepare_logits_rows_c(self, const vector[int] & rows) noexcept nogil:
        """Compute the logits of the given batch rows in one pass (lazy head only)."""
        if not self._lazy:
            return
        cdef vector[int] out
        cdef size_t j
        for j in range(rows.size()):
            if 0 <= rows[j] < self._last_n_tokens and self._out_row[rows[j]] >= 0:
                out.push_back(self._out_row[rows[j]])
        if out.size():
            sd_lm_head_compute_rows(self._head, out.data(), <int>out.size())

    def prepare_logits(self, i0, n):
        """Compute the logits of ``n`` rows from batch index ``i0`` at once: with
        ``lazy_logits`` one pass over the LM head serves them all; otherwise a no-op."""
        i0 = _int_arg('i0', i0, I32_MIN, I32_MAX)
        n = _int_arg('n', n, I32_MIN, I32_MAX)
        self._alive()
        self.prepare_logits_c(i0, n)

    cdef float * mtp_hidden_c(self, int i) noexcept nogil:
        if self._mtp_hidden == 0 or i < 0 or i >= self._last_n_tokens:
            return NULL
        if self._mtp_hidden == 1 and self._out_row[i] < 0:
            return NULL
        return llama_get_embeddings_nextn_ith(self.ctx, i)

    cdef float * layer_inp_c(self, int lid, int i) noexcept nogil:
        """Row ``i`` of the last decode's input to layer ``lid`` (NULL unless kept)."""
        cdef size_t k
        if not self._layer_inp_ok or i < 0 or i >= self._last_n_tokens:
            return NULL
        for k in range(self._layer_inp.size()):
            if self._layer_inp[k] == lid:
                return llama_get_embeddings_layer_inp(self.ctx, <uint32_t>lid) + \
                    <size_t>i * self.model.n_embd
        return NULL

    def set_layer_inputs(self, layers):
        """Keep the input of each of ``layers`` for every row of every decode (``()``: none).

        EAGLE-3 drafts read them (llama.cpp: ``llama_set_embeddings_layer_inp``). Only
        architectures whose graph hands them out can (``LAYER_INPUT_ARCHS``): on the others
        llama.cpp would abort building the graph."""
        self._alive()
        ids = tuple(layers or ())
        for lid in ids:
            if isinstance(lid, bool) or not isinstance(lid, (int, np.integer)):
                raise TypeError(f"layer ids must be ints, got {lid!r}")
        if ids:
            if self.is_mtp or self.model.arch not in LAYER_INPUT_ARCHS:
                raise ValueError(f"architecture {self.model.arch!r} does not hand out its layer "
                                 f"inputs in llama.cpp (those that do: {sorted(LAYER_INPUT_ARCHS)})")
            bad = [lid for lid in ids if not 0 <= lid < self.model.n_layer]
            if bad:
                raise ValueError(f"layer ids {bad} do not exist in the target, which has "
                                 f"{self.model.n_layer} layers (0..{self.model.n_layer - 1})")
        cdef int32_t lid_c
        for lid_c in self._layer_inp:
            llama_set_embeddings_layer_inp(self.ctx, <uint32_t>lid_c, False)
        self._layer_inp.clear()
        for lid in dict.fromkeys(ids):
            llama_set_embeddings_layer_inp(self.ctx, <uint32_t>lid, True)
            self._layer_inp.push_back(lid)
        self._layer_inp_ok = False

    @property
    def layer_inputs(self) -> tuple:
        """The layers whose inputs every decode keeps (``set_layer_inputs``)."""
        return tuple(self._layer_inp)

    def layer_input_rows(self, layer):
        """The last decode's input to ``layer``: a read-only (rows, n_embd) view, one row per
        batch entry, valid until the next decode."""
        layer = _int_arg("layer", layer, I32_MIN, I32_MAX)
        self._alive()
        if layer not in tuple(self._layer_inp):
            raise ValueError(f"layer {layer}'s inputs are not kept: set_layer_inputs first")
        cdef float * p = self.layer_inp_c(layer, 0)
        if p == NULL:
            raise IndexError("no decode since the layer inputs were turned on")
        return _view(self, p, self._last_n_tokens, self.model.n_embd)

    cdef int encode_c(self, Batch batch) except -1:
        """Run a draft model's encoder (EAGLE-3: target features in, ``g`` rows out as the
        dense MTP hidden rows) over ``batch``'s embedding rows, GIL released."""
        self._alive()
        if self.model.arch not in LAYER_DRAFT_ARCHS:
            raise ValueError(f"encode runs the encoder of {sorted(LAYER_DRAFT_ARCHS)} drafts, "
                             f"not of {self.model.arch!r}")
        cdef int n = batch.b.n_tokens
        cdef int width = len(self.model.target_layers) * self.model.target_hidden_size
        if batch.n_embd != width:
            raise ValueError(f"the encoder takes rows of {width} floats (target layers x target "
                             f"hidden size), the batch has {batch.n_embd}")
        if not 1 <= n <= self.n_ubatch:
            raise ValueError(f"an encode takes 1..{self.n_ubatch} rows (n_ubatch), got {n}")
        if self._mtp_hidden != 2:
            raise ValueError("the encoder's rows come out as MTP hidden rows: "
                             "set_mtp_hidden('dense') first")
        cdef llama_batch eb = batch.b
        eb.token = NULL     # features only
        cdef int32_t rc = 0
        cdef double t_start, timed_out
        self._head.active = False   # the encoder graph has no LM head to stop at
        self._lazy = False
        self._enter()
        t_start = self._arm_watchdog(n)
        try:
            with nogil:
                rc = sd_encode(self.ctx, eb)
        finally:
            self._leave()
        timed_out = self._disarm_watchdog(t_start, n, rc)
        self._last_n_tokens = 0
        self._out_row.clear()
        self._check_abort("encode")
        if timed_out and rc != 0:
            raise DecodeTimeoutError(f"an encode of {n} rows ran past the watchdog's "
                                     f"{timed_out:.3g} s and was stopped")
        if rc != 0:
            why_s = _recent_errors()
            raise DecodeError(f"llama_encode failed ({rc})" + (f": {why_s}" if why_s else ""))
        self._last_n_tokens = n
        self._out_row.assign(n, -1)     # hidden rows only, no logits
        self.n_encodes += 1
        return 0

    def encode(self, Batch batch not None):
        """Run the draft encoder over ``batch``'s embedding rows (see ``encode_c``)."""
        self.encode_c(batch)

    cdef int _row_index(self, int i, str what) except -1:
        self._alive()
        if i < 0:
            i += self._last_n_tokens
        if not 0 <= i < self._last_n_tokens:
            raise IndexError(f"batch index {i} out of range for the last decode "
                             f"({self._last_n_tokens} tokens)")
        if what == "logits" and self._out_row[i] < 0:
            raise IndexError(f"batch index {i} was not marked for output")
        return i

    def logits(self, i=-1):
        """The logits of batch entry ``i`` of the last decode: a read-only view, valid until the next decode."""
        i = _int_arg('i', i, I32_MIN, I32_MAX)
        i = self._row_index(i, "logits")
        cdef float * p = self.logits_c(i)
        if p == NULL:
            raise IndexError(f"no logits for batch index {i}")
        return _view(self, p, -1, self.n_vocab)

    def mtp_hidden_row(self, i=-1):
        """The hidden state for MTP of batch entry ``i``: a read-only view."""
        i = _int_arg('i', i, I32_MIN, I32_MAX)
        if self._mtp_hidden == 0:
            raise ValueError("MTP hidden states are off: set_mtp_hidden('masked' or 'dense') "
                             "first")
        i = self._row_index(i, "logits" if self._mtp_hidden == 1 else "mtp_hidden")
        cdef float * p = self.mtp_hidden_c(i)
        if p == NULL:
            raise IndexError(f"no MTP hidden state for batch index {i}")
        return _view(self, p, -1, self.model.n_embd_out)

    def mtp_hidden_rows(self):
        """Every MTP hidden row of the last decode as one (rows, n_embd) view (dense: one per
        entry)."""
        if self._mtp_hidden == 0:
            raise ValueError("MTP hidden states are off")
        self._alive()
        cdef int rows = self._last_n_tokens
        cdef int i
        if self._mtp_hidden == 1:
            rows = 0
            for i in range(self._last_n_tokens):
                rows += self._out_row[i] >= 0
        if rows == 0:
            raise IndexError("the last decode produced no MTP hidden rows")
        cdef float * p = llama_get_embeddings_nextn(self.ctx)
        if p == NULL:
            raise IndexError("no MTP hidden states")
        return _view(self, p, rows, self.model.n_embd_out)

    # --- memory -----------------------------------------------------------------------

    cdef int _check_seq(self, llama_seq_id seq, bint allow_all) except -1:
        if allow_all and seq == -1:
            return 0
        if seq < 0 or seq >= self.n_seq_max:
            raise ValueError(f"sequence id {seq} out of range [0, {self.n_seq_max})")
        return 0

    cdef int seq_rm_c(self, llama_seq_id seq, llama_pos p0, llama_pos p1) except -1:
        """Remove positions [p0, p1) of ``seq``; 1 if done, 0 if llama.cpp refused."""
        self._alive()
        self._check_seq(seq, True)
        cdef llama_pos pmax
        cdef int rollback, s
        cdef int s0 = 0 if seq == -1 else seq
        cdef int s1 = self.n_seq_max if seq == -1 else seq + 1
        if self._needs_rollback_guard and p0 > 0 and p1 < 0:
            # partial removal of a recurrent state: only the last decode, by its snapshots
            for s in range(s0, s1):
                pmax = llama_memory_seq_pos_max(self.mem, s)
                rollback = pmax - (p0 - 1)
                if rollback > 0 and rollback > self._rollback_budget[s]:
                    raise ValueError(
                        f"cannot roll sequence {s} back by {rollback} tokens: the last decode "
                        f"allows {self._rollback_budget[s]} (n_rollback={self.n_rollback}, only "
                        "the tokens of the last decode, once)")
        cdef bint ok = sd_memory_seq_rm(self.mem, seq, p0, p1)
        self._check_abort("seq_rm")
        if ok and self._needs_rollback_guard:
            for s in range(s0, s1):
                self._rollback_budget[s] = 0
        return 1 if ok else 0

    def seq_rm(self, seq, p0=-1, p1=-1) -> bool:
        """Remove positions [p0, p1) (negative = open) of ``seq`` (-1: every sequence)."""
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        p0 = _int_arg('p0', p0, I32_MIN, I32_MAX)
        p1 = _int_arg('p1', p1, I32_MIN, I32_MAX)
        self._enter()
        try:
            return self.seq_rm_c(seq, p0, p1) == 1
        finally:
            self._leave()

    def seq_cp(self, src, dst, p0=-1, p1=-1):
        src = _int_arg('src', src, I32_MIN, I32_MAX)
        dst = _int_arg('dst', dst, I32_MIN, I32_MAX)
        p0 = _int_arg('p0', p0, I32_MIN, I32_MAX)
        p1 = _int_arg('p1', p1, I32_MIN, I32_MAX)
        self._alive()
        self._check_seq(src, False)
        self._check_seq(dst, False)
        if self._needs_rollback_guard and (p0 >= 0 or p1 >= 0):
            raise ValueError("recurrent state can only be copied whole (p0 = p1 = -1)")
        if self.n_seq_max > 1 and src != dst and (p0 > 0 or 0 < p1 < llama_n_ctx_seq(self.ctx) - 1):
            # with one KV stream per sequence llama.cpp aborts on a partial cross-stream copy
            # (its test: the range must cover the stream's whole allocated size)
            raise ValueError("with several sequences only whole sequences can be copied "
                             "(p0 = p1 = -1)")
        self._enter()
        try:
            sd_memory_seq_cp(self.mem, src, dst, p0, p1)
        finally:
            self._leave()
        self._check_abort("seq_cp")

    def seq_keep(self, seq):
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        self._alive()
        self._check_seq(seq, False)
        self._enter()
        try:
            sd_memory_seq_keep(self.mem, seq)
        finally:
            self._leave()
        self._check_abort("seq_keep")

    cdef llama_pos pos_max_c(self, llama_seq_id seq) noexcept nogil:
        if self.ctx == NULL:        # closed, or freed after an abort: it holds nothing
            return -1
        return llama_memory_seq_pos_max(self.mem, seq)

    cdef llama_pos pos_min_c(self, llama_seq_id seq) noexcept nogil:
        if self.ctx == NULL:
            return -1
        return llama_memory_seq_pos_min(self.mem, seq)

    def seq_pos_min(self, seq) -> int:
        """The first position held for ``seq``, -1 when empty (with a sliding-window cache,
        the first the window layers hold)."""
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        self._alive()
        self._check_seq(seq, False)
        return llama_memory_seq_pos_min(self.mem, seq)

    def seq_pos_max(self, seq) -> int:
        """The last position held for ``seq``, -1 when empty."""
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        self._alive()
        self._check_seq(seq, False)
        return llama_memory_seq_pos_max(self.mem, seq)

    def clear(self, bint data=True):
        """Forget every sequence."""
        self._alive()
        cdef string why
        cdef int rrc = SD_REMOTE_OK
        self._enter()
        try:
            if self.model.is_remote:
                with nogil:
                    rrc = sd_remote_clear(self.ctx, data, self.model._timeout, why)
                self.model._remote_failed(rrc, why, "clearing the memory")
            else:
                sd_memory_clear(self.mem, data)
            for s in range(self.n_seq_max):
                self._rollback_budget[s] = 0
            self._last_n_tokens = 0
        finally:
            self._leave()
        self._check_abort("clear")

    # --- checkpoints ------------------------------------------------------------------

    cdef int save_state_c(self, llama_seq_id seq, uint32_t flags, vector[uint8_t] & out) except -1:
        self._alive()
        self._check_seq(seq, False)
        cdef size_t n = sd_state_seq_get_size(self.ctx, seq, flags)
        self._check_abort("save_state")
        out.resize(n)
        cdef size_t got = 0
        cdef string why
        cdef int rrc = SD_REMOTE_OK
        with nogil:
            if self.model.is_remote:
                rrc = sd_remote_state_get(self.ctx, out.data(), n, seq, flags, &got,
                                          self.model._timeout, why)
            else:
                got = sd_state_seq_get_data(self.ctx, out.data(), n, seq, flags)
        self.model._remote_failed(rrc, why, "saving a state")
        self._check_abort("save_state")
        if got != n:
            raise RuntimeError(f"saving the state of sequence {seq} failed")
        return 0

    cdef int load_state_c(self, llama_seq_id seq, uint32_t flags, const vector[uint8_t] & data) except -1:
        self._alive()
        self._check_seq(seq, False)
        cdef size_t got = 0
        cdef string why
        cdef int rrc = SD_REMOTE_OK
        with nogil:
            if self.model.is_remote:
                rrc = sd_remote_state_set(self.ctx, data.data(), data.size(), seq, flags, &got,
                                          self.model._timeout, why)
            else:
                got = sd_state_seq_set_data(self.ctx, data.data(), data.size(), seq, flags)
        self.model._remote_failed(rrc, why, "restoring a state")
        self._check_abort("load_state")
        if got == 0:
            raise ValueError(f"restoring the state of sequence {seq} failed (wrong or corrupt data)")
        for s in range(self.n_seq_max):
            self._rollback_budget[s] = 0
        return 0

    def save_state(self, seq=0, *, bint partial=False) -> bytes:
        """A checkpoint of one sequence. ``partial`` keeps only the recurrent/SWA parts,
        for rolling back hybrid models whose attention KV is trimmed with ``seq_rm``."""
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        cdef vector[uint8_t] out
        self._enter()
        try:
            self.save_state_c(seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0, out)
        finally:
            self._leave()
        return (<char *> out.data())[:out.size()] if out.size() else b""

    def load_state(self, data, seq=0, *, bint partial=False):
        """Restore a checkpoint made by ``save_state`` (with the same ``partial``)."""
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        cdef bytes b = bytes(data)
        if len(b) == 0:
            raise ValueError("empty state")
        cdef vector[uint8_t] buf = vector[uint8_t](len(b))
        memcpy(buf.data(), <const char *> b, len(b))
        self._enter()
        try:
            self.load_state_c(seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0, buf)
        finally:
            self._leave()

    # --- perf -------------------------------------------------------------------------

    def perf(self) -> dict:
        """llama.cpp's own counters: prompt/eval times (ms) and token counts."""
        self._alive()
        cdef llama_perf_context_data d = llama_perf_context(self.ctx)
        return {"t_load_ms": d.t_load_ms, "t_p_eval_ms": d.t_p_eval_ms, "t_eval_ms": d.t_eval_ms,
                "n_p_eval": d.n_p_eval, "n_eval": d.n_eval, "n_reused": d.n_reused}

    def perf_reset(self):
        self._alive()
        llama_perf_context_reset(self.ctx)

    def warm_up(self, max_rows) -> None:
        """Decode a batch of every row count from 1 to ``max_rows`` (every row an output, as
        in a verify) on sequence 0 of an empty context, which it leaves empty. The first
        decode of a batch shape pays a one-off set-up: over RPC one round trip per new tensor
        shape (about 60 ms a row count at 2 ms one-way latency); after this, the first
        requests' verifies, and the draft-length policy's first samples, do not."""
        max_rows = _int_arg('max_rows', max_rows, I32_MIN, I32_MAX)
        self._alive()
        if not 1 <= max_rows <= min(self.n_batch, self.n_ctx_seq - 1):
            raise ValueError(f"max_rows must be in [1, {min(self.n_batch, self.n_ctx_seq - 1)}], "
                             f"got {max_rows}")
        if any(self.seq_pos_max(s) >= 0 for s in range(self.n_seq_max)):
            raise ValueError("warm_up needs an empty context")
        batch = Batch(max_rows)
        for n in range(1, max_rows + 1):
            self.seq_rm(0)
            batch.clear()
            for i in range(n):
                batch.add((i * 7919 + 17) % self.n_vocab, i, 0, True)
            self.decode(batch)
        self.seq_rm(0)

    # --- exact mode over RPC ------------------------------------------------------------

    def check_batch_invariance(self, max_rows) -> int:
        """Show that a row's logits do not depend on how many rows share its batch, for
        batches of 2 to ``max_rows`` rows (every count up to 34, then around each power of
        two, where kernels switch, and ``max_rows``), on sequence 0 of an empty context,
        which it leaves empty. Returns 0 when they held (``invariant_rows`` then covers
        ``max_rows``), else the first row count at which a row changed. For a context whose
        layers sit on a GPU or RPC servers: their kernels are the device's own."""
        max_rows = _int_arg('max_rows', max_rows, I32_MIN, I32_MAX)
        self._alive()
        if not self.batch_invariant:
            raise ValueError("check_batch_invariance needs Context(..., batch_invariant=True)")
        if max_rows < 2:
            raise ValueError(f"max_rows must be >= 2, got {max_rows}")
        if max_rows > min(self.n_ubatch, self.n_batch):
            raise ValueError(f"max_rows={max_rows} exceeds n_ubatch={self.n_ubatch} or "
                             f"n_batch={self.n_batch}: a bigger batch would be split")
        if self.invariant_rows < 0 or 0 < max_rows <= self.invariant_rows:
            return 0
        if any(self.seq_pos_max(s) >= 0 for s in range(self.n_seq_max)):
            raise ValueError("check_batch_invariance needs an empty context")
        n_prefix = min(8, self.n_ctx_seq - max_rows)
        if n_prefix < 1:
            raise ValueError(f"n_ctx={self.n_ctx} is too small to check batches of {max_rows} rows")
        toks = [(i * 7919 + 17) % self.n_vocab for i in range(n_prefix + max_rows)]
        sizes = sorted({n for n in range(2, min(max_rows, 34) + 1)}
                       | {n for p in (32, 64, 128, 256, 512, 1024) for n in (p - 1, p, p + 1)
                          if 2 <= n <= max_rows} | {max_rows}, reverse=True)
        batch = Batch(max(n_prefix, max_rows))
        ref = None
        try:
            for n in sizes:
                self.seq_rm(0)
                batch.clear()
                for i in range(n_prefix):
                    batch.add(toks[i], i, 0, i == n_prefix - 1)
                self.decode(batch)
                batch.clear()
                for i in range(n):
                    batch.add(toks[n_prefix + i], n_prefix + i, 0, True)
                self.decode(batch)
                rows = np.stack([np.array(self.logits(i)) for i in range(n)])
                if ref is None:
                    ref = rows
                elif not np.array_equal(rows.view(np.uint32), ref[:n].view(np.uint32)):
                    return n
        finally:
            self.seq_rm(0)
        self.invariant_rows = max_rows
        return 0
