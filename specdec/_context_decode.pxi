# Part of _core (included by _core.pyx): running a Context's graph over a batch.
#
# ``decode`` and ``encode`` release the GIL, so everything llama.cpp would assert on (in its
# compute threads, beyond any handler) is refused first; the run is guarded by the stop flag
# (``_stop.pxi``), an abort is turned into an exception (``_check_abort``), and afterwards the
# context records which rows have outputs and how far each sequence can be rolled back.


cdef int _check_batch(Context self, Batch batch) except -1:
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


cdef int _decode(Context self, Batch batch, bint grammar) except -1:
    self._alive()
    cdef int n = batch.b.n_tokens
    cdef int n_out = _check_batch(self, batch)
    cdef int i, k, n_seqs_in = 0, most = 0
    cdef llama_seq_id s
    for s in range(self.n_seq_max):
        n_seqs_in += self._seq_ntok[s] > 0
        most = max(most, self._seq_ntok[s])
    _lazy_head_begin(self._head, n, n_out, self.n_ubatch, n_seqs_in, self._lazy_multi, grammar)
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
        t_start = _arm_watchdog(self, n)
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
    timed_out = _disarm_watchdog(self, t_start, n, rc)
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


cdef int _encode(Context self, Batch batch) except -1:
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
    t_start = _arm_watchdog(self, n)
    try:
        with nogil:
            rc = sd_encode(self.ctx, eb)
    finally:
        self._leave()
    timed_out = _disarm_watchdog(self, t_start, n, rc)
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
