# Part of _core (included by _core.pyx): Context, llama.cpp's memory and decode outputs.
#
# One cdef class, which Cython cannot split across files (``include`` is refused in a class
# body): this file holds its face (every method with its docstring, the settings, the hot
# ``nogil`` reads of outputs), and the work of the longer methods lives in free functions
# taking the context, one file a concern: opening (_context_open.pxi; its parameters,
# _context_params.pxi), running a batch (_context_decode.pxi), the memory and its checkpoints
# (_context_memory.pxi), the hidden rows drafts read (_context_hidden.pxi), decoding every
# batch shape (_batch_shapes.pxi), the stop flag and the watchdog (_stop.pxi), the lazy LM head
# (_lazy_head.pxi) and the output views (_views.pxi).


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
        _open_context(self, model, n_ctx, n_batch, n_ubatch, n_threads, n_threads_batch,
                      n_seq_max, kind, n_rollback, mtp_hidden, flash_attn, swa_full, kv_unified,
                      n_outputs_max, lazy_logits, batch_invariant, offload_kqv, other)

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
        _set_mtp_hidden(self, mode)

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

    def set_lazy_head(self, on, *, grammar=None, upto=None):
        """Turn the lazy LM head off (every decode then runs llama.cpp's whole graph, its
        own head included) or on again, between decodes. Only a context made with
        ``lazy_logits=True`` has the head to turn on (its graph callback is set at
        creation); ``specdec.head_choice`` turns it off where llama.cpp's head is faster.

        ``grammar``: whether, while it is off, decodes holding rows a grammar masks (the
        controller's, under a constraint) still stop at the norm: the verifier then gets a
        row that allows few tokens as those tokens' logits alone (``masked_logits_c``), far
        cheaper than either whole head (None: unchanged; it starts False).

        ``upto``: while it is off, decodes of at most this many output rows still stop at
        the norm (0: none; None: unchanged). The lazy head reads its whole weight once per
        pass for the rows it computes, llama.cpp's head multiplies every output row in the
        graph: on a CPU where the lazy head wins a plain step and loses a long verify, each
        decode takes the one that is faster for its rows (``head_choice``)."""
        self._alive()
        if upto is not None and (isinstance(upto, bool) or not isinstance(upto, int) or upto < 0):
            raise ValueError(f"upto must be an int >= 0, got {upto!r}")
        if (on or grammar or upto) and not self._head_installed:
            raise ValueError("this context was made without lazy_logits: there is no lazy "
                             "head to turn on")
        self._head.enabled = bool(on)
        if grammar is not None:
            self._head.grammar = bool(grammar)
        if upto is not None:
            self._head.upto = min(upto, 1 << 30)

    @property
    def lazy_head_grammar(self) -> bool:
        """Whether decodes holding a grammar's rows use the lazy head while it is off
        (``set_lazy_head``)."""
        return self._head.grammar

    @property
    def lazy_head_upto(self) -> int:
        """While the lazy head is off, decodes of at most this many output rows use it all
        the same (``set_lazy_head``; 0: none)."""
        return self._head.upto

    @property
    def lazy_logits(self) -> str:
        """The lazy LM head: ``"off"``, ``"pending"`` (enabled, the first decode finds the
        output weight), ``"on"``, ``"on up to N rows"`` (decodes of more output rows run
        llama.cpp's head: ``set_lazy_head(upto=N)``), or why it cannot run on this model."""
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

    def interrupt(self):
        """Ask a running decode to stop (safe from any thread); it raises ``KeyboardInterrupt``.
        A SIGINT (Ctrl-C) stops a decode on the main thread the same way, between graph nodes."""
        self._stop.requested = True

    # --- decode -----------------------------------------------------------------------

    cdef int decode_c(self, Batch batch, bint grammar=False) except -1:
        """Validate, decode with the GIL released, record which rows have outputs.
        ``grammar``: the batch holds rows a grammar masks (``set_lazy_head``)."""
        return _decode(self, batch, grammar)

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
        _set_layer_inputs(self, layers)

    @property
    def layer_inputs(self) -> tuple:
        """The layers whose inputs every decode keeps (``set_layer_inputs``)."""
        return tuple(self._layer_inp)

    def layer_input_rows(self, layer):
        """The last decode's input to ``layer``: a read-only (rows, n_embd) view, one row per
        batch entry, valid until the next decode."""
        return _layer_input_rows(self, layer)

    cdef int encode_c(self, Batch batch) except -1:
        """Run a draft model's encoder (EAGLE-3: target features in, ``g`` rows out as the
        dense MTP hidden rows) over ``batch``'s embedding rows, GIL released."""
        return _encode(self, batch)

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
        return _mtp_hidden_row(self, i)

    def mtp_hidden_rows(self):
        """Every MTP hidden row of the last decode as one (rows, n_embd) view (dense: one per
        entry)."""
        return _mtp_hidden_rows(self)

    # --- memory -----------------------------------------------------------------------

    cdef int seq_rm_c(self, llama_seq_id seq, llama_pos p0, llama_pos p1) except -1:
        """Remove positions [p0, p1) of ``seq``; 1 if done, 0 if llama.cpp refused."""
        return _seq_rm(self, seq, p0, p1)

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
        _seq_cp(self, src, dst, p0, p1)

    def seq_keep(self, seq):
        _seq_keep(self, seq)

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
        _check_seq(self, seq, False)
        return llama_memory_seq_pos_min(self.mem, seq)

    def seq_pos_max(self, seq) -> int:
        """The last position held for ``seq``, -1 when empty."""
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        self._alive()
        _check_seq(self, seq, False)
        return llama_memory_seq_pos_max(self.mem, seq)

    def clear(self, bint data=True):
        """Forget every sequence."""
        _clear(self, data)

    # --- checkpoints ------------------------------------------------------------------

    cdef int save_state_c(self, llama_seq_id seq, uint32_t flags, vector[uint8_t] & out) except -1:
        return _save_state(self, seq, flags, out)

    cdef int load_state_c(self, llama_seq_id seq, uint32_t flags, const vector[uint8_t] & data) except -1:
        return _load_state(self, seq, flags, data)

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
        _warm_up(self, max_rows)

    # --- exact mode over RPC ------------------------------------------------------------

    def check_batch_invariance(self, max_rows) -> int:
        """Show that a row's logits do not depend on how many rows share its batch, for
        batches of 2 to ``max_rows`` rows (every count up to 34, then around each power of
        two, where kernels switch, and ``max_rows``), on sequence 0 of an empty context,
        which it leaves empty. Returns 0 when they held (``invariant_rows`` then covers
        ``max_rows``), else the first row count at which a row changed. For a context whose
        layers sit on a GPU or RPC servers: their kernels are the device's own."""
        return _check_batch_invariance(self, max_rows)
