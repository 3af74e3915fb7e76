# Part of _core (included by _core.pyx): opening a Context (``Context.__init__``'s work).
#
# The checked parameters (``_context_params.pxi``) given to llama.cpp, locally or on an RPC
# server; a graph llama.cpp could not compute refused before a decode would abort in it; and
# the sizes llama.cpp really gave read back, with the fields the decodes rely on derived once.


cdef int _open_context(Context self, Model model, n_ctx, n_batch, n_ubatch, n_threads,
                       n_threads_batch, n_seq_max, kind, n_rollback, mtp_hidden, flash_attn,
                       swa_full, kv_unified, n_outputs_max, bint lazy_logits,
                       bint batch_invariant, offload_kqv, Context other) except -1:
    """``Context.__init__`` (its arguments as it takes them)."""
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
    return 0
