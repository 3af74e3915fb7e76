# Part of _core (included by _core.pyx): a context's llama.cpp parameters, every argument
# checked first. llama.cpp asserts on sizes that do not fit one another (outputs per sequence,
# rollback tokens per ubatch) and on MTP contexts of models without MTP layers: refused here.


cdef llama_context_params _context_params(
        Model model, n_ctx, n_batch, n_ubatch, n_threads, n_threads_batch, n_seq_max, kind,
        n_rollback, mtp_hidden, flash_attn, swa_full, kv_unified, n_outputs_max,
        bint lazy_logits, bint batch_invariant, offload_kqv) except *:
    """``Context.__init__``'s arguments as llama.cpp's parameters (defaults resolved), or a
    ``TypeError`` / ``ValueError`` that names the argument. Callbacks are the caller's."""
    cdef llama_context_params p
    _check_positive("n_ctx", n_ctx)
    _check_positive("n_batch", n_batch)
    n_ubatch = n_batch if n_ubatch is None else n_ubatch
    _check_positive("n_ubatch", n_ubatch)
    _check_positive("n_seq_max", n_seq_max)
    n_threads = n_threads if n_threads is not None else default_threads()
    _check_positive("n_threads", n_threads)
    n_threads_batch = n_threads if n_threads_batch is None else n_threads_batch
    _check_positive("n_threads_batch", n_threads_batch)
    _check_threads(n_threads, n_threads_batch)
    n_rollback = _int_arg("n_rollback", n_rollback, 0, I32_MAX)
    if n_seq_max > 256:
        raise ValueError(f"n_seq_max must be at most 256, got {n_seq_max}")
    n_outputs_max = _int_arg("n_outputs_max", n_outputs_max, 0, I32_MAX)
    if n_ctx > 1 << 24 or n_batch > 1 << 20:
        raise ValueError("n_ctx / n_batch unreasonably large")
    # llama.cpp reserves an output row per sequence within n_batch (capped at n_ctx) and
    # aborts when they do not fit
    if n_seq_max > min(n_batch, n_ctx) or 0 < n_outputs_max < n_seq_max:
        raise ValueError(f"n_seq_max={n_seq_max} needs n_batch, n_ctx (and n_outputs_max if "
                         f"set) of at least {n_seq_max}; got n_batch={n_batch}, "
                         f"n_ctx={n_ctx}, n_outputs_max={n_outputs_max}")
    if kind not in ("default", "mtp"):
        raise ValueError(f"kind must be 'default' or 'mtp', got {kind!r}")
    if mtp_hidden not in (None, "masked", "dense"):
        raise ValueError(f"mtp_hidden must be None, 'masked' or 'dense', got {mtp_hidden!r}")
    is_mtp = kind == "mtp"
    if lazy_logits and is_mtp:
        raise ValueError("lazy_logits is for target contexts, not MTP contexts")
    if lazy_logits and mtp_hidden is not None and model.arch not in LAZY_MTP_ARCHS:
        raise ValueError(f"lazy_logits with MTP hidden states needs an arch whose graph "
                         f"makes them before the LM head ({sorted(LAZY_MTP_ARCHS)}), "
                         f"not {model.arch!r}")
    if is_mtp or mtp_hidden is not None:
        _check_mtp_model(model, is_mtp)
    # llama.cpp caps the batch at the context size it was asked for (before padding it)
    n_batch_eff = min(n_ctx, n_batch)
    n_ubatch_eff = min(n_ubatch, n_batch_eff)
    if n_rollback > 0:
        # split_equal keeps a sequence's last n_rs_seq + 1 tokens in one ubatch and
        # asserts n_ubatch > n_rs_seq + 1 (llama-batch.cpp)
        if n_ubatch_eff <= n_rollback + 1:
            raise ValueError(f"n_rollback={n_rollback} needs n_ubatch >= {n_rollback + 2} (a "
                             f"rollback of n tokens keeps n + 1 in one ubatch); have n_ubatch="
                             f"{n_ubatch_eff} (n_batch={n_batch}, n_ctx={n_ctx})")
        if not (model.is_recurrent or model.is_hybrid):
            raise ValueError(f"n_rollback applies to recurrent/hybrid models; {model.arch!r} "
                             "rolls back its attention KV without it")
        if model.arch not in PARTIAL_ROLLBACK_ARCHS:
            raise ValueError(f"architecture {model.arch!r} has no partial recurrent rollback "
                             "(n_rollback); use state checkpoints")
        if is_mtp:
            raise ValueError("n_rollback is for the target context; the MTP context is plain KV")
    if batch_invariant and model.use_extra_bufts:
        raise ValueError("batch_invariant needs the model loaded with Model(..., "
                         "use_extra_bufts=False): repacked weights run kernels that depend on "
                         "the batch's row count")

    p = llama_context_default_params()
    p.n_ctx = n_ctx
    p.n_batch = n_batch
    p.n_ubatch = min(n_ubatch, n_batch)
    p.n_seq_max = n_seq_max
    p.n_rs_seq = n_rollback
    p.n_outputs_max = n_outputs_max
    p.n_threads = n_threads
    p.n_threads_batch = n_threads_batch
    p.ctx_type = LLAMA_CONTEXT_TYPE_MTP if is_mtp else LLAMA_CONTEXT_TYPE_DEFAULT
    p.no_perf = False
    p.swa_full = swa_full
    if kv_unified is not None:
        p.kv_unified = kv_unified
    if offload_kqv is not None:
        p.offload_kqv = bool(offload_kqv)
    if batch_invariant:
        # llama.cpp hands an op on host weights to a GPU for batches of 32 rows or more (op
        # offload): a verify batch of a CPU layer would then change kernels at 32 rows
        p.op_offload = False
    if flash_attn is not None:
        p.flash_attn_type = (LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                             else LLAMA_FLASH_ATTN_TYPE_DISABLED)
    return p


cdef int _check_mtp_model(Model model, bint is_mtp) except -1:
    """Whether ``model`` can run an MTP context (``is_mtp``) or feed one its hidden states.

    A target only needs the arch's trunk to emit them: a trunk-only file can feed the MTP
    head of a separate MTP-only file (llama.cpp's ``-md``)."""
    if is_mtp and model.n_mtp_layers <= 0:
        raise ValueError(f"model {os.path.basename(model.path)!r} ({model.arch}) has no MTP "
                         "layers")
    if model.arch not in MTP_ARCHS and (is_mtp or model.arch not in LAYER_DRAFT_ARCHS):
        raise ValueError(f"architecture {model.arch!r} has no MTP graph in llama.cpp")
    if is_mtp and not model.mtp_loaded:
        raise ValueError("the model was loaded with load_mtp=False: reload it with "
                         "Model(path, load_mtp=True) to create an MTP context")
    if is_mtp and model.arch not in MTP_MULTI_HEAD_ARCHS and model.n_mtp_layers != 1:
        raise ValueError(f"llama.cpp's {model.arch} MTP graph takes exactly one MTP layer, "
                         f"the model has {model.n_mtp_layers}")
    return 0
