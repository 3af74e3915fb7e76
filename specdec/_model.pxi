# Part of _core (included by _core.pyx): Model, a loaded GGUF file (metadata, tokenizer).

cdef object _missing_special(const llama_vocab * v):
    """Why tokenizing with ``add_special`` would assert, or None: the vocabulary's type or
    flags ask for a special token (BOS, EOS, SEP) that the file does not define."""
    cdef int t = llama_vocab_type_of(v)
    need = []
    if t == 3:   # WPM (BERT): [CLS] ... [SEP] around every text
        need = [("BOS", llama_vocab_bos(v)), ("SEP", llama_vocab_sep(v))]
    elif t != 0:   # SPM, BPE, UGM ... (0: no vocabulary)
        if llama_vocab_get_add_bos(v):
            need.append(("BOS", llama_vocab_bos(v)))
        if llama_vocab_get_add_eos(v):
            need.append(("EOS", llama_vocab_eos(v)))
    missing = [name for name, tok in need if tok == LLAMA_TOKEN_NULL]
    if missing:
        return (f"the tokenizer adds {' and '.join(missing)} to every text but the vocabulary "
                "has no such token")
    return None


# __dealloc__ reads placement (which RPC servers are dead): the cycle collector must not
# clear it first
@cython.no_gc_clear
cdef class Model:
    """Model(path, *, n_gpu_layers=0, split_mode="layer", main_gpu=0, tensor_split=None, rpc_servers=None, rpc_timeout=300.0, use_mmap=True, load_mtp=False, use_extra_bufts=True, vocab_only=False, check="fast")
--

    A GGUF model loaded through libllama: metadata and tokenizer.

    ``load_mtp`` loads the MTP layers (llama.cpp: NextN) that MTP contexts need; without it
    llama.cpp would abort when such a context is created, so ``Context`` checks.
    ``use_extra_bufts=False`` drops the repacked weight layouts (slower, but the
    same kernels for batched and single-token matmuls).
    ``check``: ``"fast"`` checks the file's header and metadata, and turns llama.cpp's
    aborts during the load into exceptions; ``"isolated"`` also loads it and generates a
    few tokens in a child process first (``specdec.probe.check_model``, cached by content
    hash), for files from untrusted sources.
    """

    def __cinit__(self):
        self.model = NULL
        self.vocab = NULL

    def __init__(self, path, *, n_gpu_layers=0, split_mode="layer", main_gpu=0,
                 tensor_split=None, rpc_servers=None, rpc_timeout=300.0, bint use_mmap=True,
                 bint load_mtp=False, bint use_extra_bufts=True, bint vocab_only=False,
                 str check="fast"):
        if self.model != NULL:
            raise RuntimeError("Model is already initialised")
        n_gpu_layers = _int_arg("n_gpu_layers", n_gpu_layers, I32_MIN, I32_MAX)
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        if check not in ("fast", "isolated"):
            raise ValueError(f"check must be 'fast' or 'isolated', got {check!r}")
        path = os.fspath(path)
        if not isinstance(path, str):
            path = os.fsdecode(path)
        plc = Placement.make(n_gpu_layers, split_mode, main_gpu, tensor_split, rpc_servers,
                             rpc_timeout)
        _check_gguf_file(path)
        if check == "isolated":
            from .probe import check_model
            check_model(path)
        cdef llama_model_params p = llama_model_default_params()
        cdef vector[ggml_backend_dev_t] devs = self._devices(plc)
        cdef vector[float] split = vector[float](max(<size_t>1, llama_max_devices()), 0.0)
        for i, x in enumerate(plc.tensor_split):
            split[i] = x
        self._devs = devs
        self._devs.push_back(NULL)
        p.devices = self._devs.data()
        p.n_gpu_layers = plc.n_gpu_layers
        p.split_mode = <llama_split_mode>plc.split_mode_id
        p.main_gpu = plc.main_gpu
        p.tensor_split = split.data() if plc.tensor_split else NULL
        p.load_mode = LLAMA_LOAD_MODE_MMAP if use_mmap else LLAMA_LOAD_MODE_NONE
        p.load_mtp = load_mtp
        p.use_extra_bufts = use_extra_bufts
        p.vocab_only = vocab_only
        self.placement = plc
        self.is_remote = len(plc.rpc_servers) > 0
        self._timeout = plc.rpc_timeout
        self._dead = None
        cdef bytes bpath = os.fsencode(path)
        if b"\0" in bpath:
            raise ValueError("path contains a NUL byte")
        cdef const char * cpath = bpath
        cdef string why
        cdef int rc = SD_REMOTE_OK
        cdef sd_stop_flag stop
        stop.requested = False
        stop.watch = False
        stop.deadline = 0
        if not self.is_remote:
            # a remote load runs on a helper thread that may outlive this frame: no callback
            p.progress_callback = _load_progress
            p.progress_callback_user_data = <void *> &stop
            _stop_begin(&stop)
        _clear_recent()
        try:
            with nogil:
                if self.is_remote:
                    rc = sd_remote_load(cpath, p, &self.model, self._timeout, why)
                else:
                    self.model = sd_model_load(cpath, p)
        finally:
            _stop_end(&stop)
        if rc != SD_REMOTE_OK:
            self.model = NULL
            raise RPCError(f"failed to load model {path} onto {', '.join(plc.rpc_servers)}: "
                           + why.decode("utf-8", "replace"))
        _raise_pending()    # Ctrl-C: the load stopped at the next tensor (the model is freed)
        aborted = _take_abort()
        if aborted is not None:
            raise GGUFError(f"failed to load model {path}: llama.cpp aborted: {aborted}") from \
                LlamaAbortError("loading the model", aborted)
        if self.model == NULL:
            why_s = _recent_errors()
            raise ValueError(f"failed to load model {path}" + (f": {why_s}" if why_s else ""))
        if self.is_remote:
            _remote_models.add(self)
        self.vocab = llama_model_get_vocab(self.model)
        self.path = path
        self.arch = self.meta("general.architecture") or ""
        self.n_vocab = llama_vocab_n_tokens(self.vocab)
        self.n_embd = llama_model_n_embd(self.model)
        self.n_embd_out = llama_model_n_embd_out(self.model)
        self.n_layer = llama_model_n_layer(self.model)
        self.n_mtp_layers = llama_model_n_layer_nextn(self.model)
        self.mtp_loaded = bool(load_mtp) and self.n_mtp_layers > 0
        self.is_recurrent = llama_model_is_recurrent(self.model)
        self.is_hybrid = llama_model_is_hybrid(self.model)
        self.use_extra_bufts = use_extra_bufts
        bad = None if self.n_vocab > 0 else "the model has no vocabulary"
        bad = bad or _missing_special(self.vocab)
        if bad is not None:
            llama_model_free(self.model)
            self.model = NULL
            raise GGUFError(f"failed to load model {path}: {bad}")

    def __dealloc__(self):
        cdef string why
        if self.model != NULL and not self._remote_dead():
            if self.is_remote:
                with nogil:
                    sd_remote_free_model(self.model, self._timeout, why)
            else:
                llama_model_free(self.model)
        self.model = NULL

    def __repr__(self):
        return (f"Model({os.path.basename(self.path or '')!r}, arch={self.arch!r}, "
                f"n_vocab={self.n_vocab}, n_layer={self.n_layer}, n_mtp_layers={self.n_mtp_layers})")

    cdef int _alive(self) except -1:
        if self._remote_dead():
            raise RPCError(self._dead)
        if self.model == NULL:
            raise RuntimeError("Model is not loaded")
        return 0

    cdef vector[ggml_backend_dev_t] _devices(self, plc) except *:
        """llama.cpp's device list for a placement: RPC servers' devices first (fewer
        network transfers), then local GPUs; a device option that cannot be honoured fails
        here, never silently."""
        cdef vector[ggml_backend_dev_t] devs, more
        if plc.rpc_servers and plc.n_gpu_layers == 0:
            raise ValueError("rpc_servers given with n_gpu_layers=0, which keeps every layer on "
                             "this host: give n_gpu_layers=-1 (all) or a layer count")
        for ep in plc.rpc_servers:
            if not llama_supports_rpc():
                raise ValueError("rpc_servers given, but this build has no RPC backend "
                                 "(build with -Drpc=true)")
            more = _rpc_devices(ep, plc.rpc_timeout)
            devs.insert(devs.end(), more.begin(), more.end())
        more = _local_accelerators()
        devs.insert(devs.end(), more.begin(), more.end())
        self.devices = [_device_dict(devs[i]) for i in range(devs.size())]
        if plc.n_gpu_layers != 0 and devs.size() == 0:
            raise ValueError(f"n_gpu_layers={plc.n_gpu_layers} asks for layers on a device, but "
                             f"{_no_device_reason()}; use n_gpu_layers=0 for the CPU")
        if plc.tensor_split and len(plc.tensor_split) > devs.size():
            raise ValueError(f"tensor_split has {len(plc.tensor_split)} entries for "
                             f"{devs.size()} device(s)"
                             + ("" if devs.size() else f" ({_no_device_reason()})"))
        if len(plc.tensor_split) > llama_max_devices():
            raise ValueError(f"tensor_split: at most {llama_max_devices()} devices")
        if plc.main_gpu and plc.main_gpu >= <int>devs.size():
            raise ValueError(f"main_gpu={plc.main_gpu} but there are {devs.size()} device(s)"
                             + ("" if devs.size() else f" ({_no_device_reason()})"))
        if plc.split_mode == "row":
            for i in range(devs.size()):
                if ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(devs[i]),
                                                     b"ggml_backend_split_buffer_type") == NULL:
                    raise ValueError(f"split_mode='row': device {self.devices[i]['name']} has no "
                                     "row-split buffers (llama.cpp has them on CUDA and SYCL); "
                                     "use 'layer'")
        return devs

    cdef bint _remote_dead(self):
        """Whether an RPC failure (of this model, or of another on one of its servers) made
        this model unusable; ``_dead`` says why."""
        if self._dead is None and self.is_remote:
            for ep in self.placement.rpc_servers:
                if ep in _dead_endpoints:
                    self._dead = (f"RPC server {ep} of {os.path.basename(self.path)} failed: "
                                  f"{_dead_endpoints[ep]}; this model and its contexts are "
                                  "unusable, load it again")
        return self._dead is not None

    cdef int _remote_failed(self, int rc, string why, str what) except -1:
        """After a remote call: nothing if it ran, else mark the model dead and raise."""
        if rc == SD_REMOTE_OK:
            return 0
        msg = why.decode("utf-8", "replace")
        if rc == SD_REMOTE_EXCEPTION:
            raise RuntimeError(f"{what} failed: {msg}")
        self._dead = (f"the RPC server(s) of {os.path.basename(self.path)} "
                      f"({', '.join(self.placement.rpc_servers)}) failed during {what}: {msg}; "
                      "this model and its contexts are unusable, load it again")
        for ep in self.placement.rpc_servers:   # which one failed is not known: all are suspect
            _dead_endpoints.setdefault(ep, f"{what}: {msg}")
        raise RPCError(self._dead)

    # --- metadata ---------------------------------------------------------------------

    def meta(self, key: str):
        """A GGUF metadata value as a string, or None."""
        self._alive()
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__name__}")
        cdef bytes k = key.encode("utf-8", "surrogatepass")
        if b"\0" in k:
            raise ValueError("key contains a NUL byte")
        cdef vector[char] buf = vector[char](256)
        cdef int32_t n = llama_model_meta_val_str(self.model, k, buf.data(), buf.size())
        if n < 0:
            return None
        if n >= <int32_t>buf.size():
            buf.resize(n + 1)
            n = llama_model_meta_val_str(self.model, k, buf.data(), buf.size())
        return buf.data()[:n].decode("utf-8", "replace")

    @property
    def description(self) -> str:
        self._alive()
        cdef char buf[256]
        n = llama_model_desc(self.model, buf, sizeof(buf))
        return buf[:max(0, min(n, 255))].decode("utf-8", "replace")

    @property
    def n_ctx_train(self) -> int:
        self._alive()
        return llama_model_n_ctx_train(self.model)

    @property
    def n_swa(self) -> int:
        self._alive()
        return llama_model_n_swa(self.model)

    @property
    def size(self) -> int:
        self._alive()
        return llama_model_size(self.model)

    @property
    def n_params(self) -> int:
        self._alive()
        return llama_model_n_params(self.model)

    @property
    def chat_template(self):
        self._alive()
        cdef const char * t = llama_model_chat_template(self.model, NULL)
        return None if t == NULL else t.decode("utf-8", "replace")

    @property
    def has_mtp_graph(self) -> bool:
        """The architecture has an MTP graph in llama.cpp and the file has MTP layers."""
        return self.arch in MTP_ARCHS and self.n_mtp_layers > 0

    @property
    def supports_mtp(self) -> bool:
        """An MTP context can be created on this model (graph present and layers loaded)."""
        return self.has_mtp_graph and self.mtp_loaded

    @property
    def target_layers(self) -> tuple:
        """The target layers whose inputs a draft model reads (EAGLE-3: llama.cpp's
        target_layer_ids; empty for other models)."""
        self._alive()
        cdef const int32_t * ids = llama_model_target_layer_ids(self.model)
        cdef uint32_t n = llama_model_target_layer_ids_n(self.model)
        return tuple(ids[i] for i in range(n)) if ids != NULL else ()

    @property
    def target_hidden_size(self) -> int:
        """The target hidden size a draft model reads (EAGLE-3), 0 for other models."""
        v = self.meta(f"{self.arch}.target_hidden_size")
        return int(v) if v else 0

    @property
    def supports_partial_rollback(self) -> bool:
        """Tail tokens can be removed from a sequence (attention KV, or recurrent snapshots:
        ``Context(n_rollback=...)``)."""
        if not (self.is_recurrent or self.is_hybrid):
            return True
        return self.arch in PARTIAL_ROLLBACK_ARCHS

    # --- tokenizer --------------------------------------------------------------------

    @property
    def bos(self) -> int:
        return llama_vocab_bos(self.vocab) if self.vocab != NULL else -1

    @property
    def eos(self) -> int:
        return llama_vocab_eos(self.vocab) if self.vocab != NULL else -1

    @property
    def mask(self) -> int:
        """The mask token a block drafter fills its draft positions with (DFlash), or -1."""
        return llama_vocab_mask(self.vocab) if self.vocab != NULL else -1

    @property
    def eot(self) -> int:
        return llama_vocab_eot(self.vocab) if self.vocab != NULL else -1

    @property
    def nl(self) -> int:
        return llama_vocab_nl(self.vocab) if self.vocab != NULL else -1

    @property
    def add_bos(self) -> bool:
        self._alive()
        return llama_vocab_get_add_bos(self.vocab)

    @property
    def eog_tokens(self) -> list:
        """Every token that ends generation (EOS, EOT, and the like)."""
        self._alive()
        return [t for t in range(self.n_vocab) if llama_vocab_is_eog(self.vocab, t)]

    cdef int _check_token(self, object tok) except -1:
        if not isinstance(tok, (int, np.integer)) or isinstance(tok, bool):
            raise TypeError(f"token ids must be ints, got {type(tok).__name__}")
        if tok < 0 or tok >= self.n_vocab:
            raise ValueError(f"token id {tok} out of range [0, {self.n_vocab})")
        return 0

    def is_eog(self, tok) -> bool:
        self._alive()
        self._check_token(tok)
        return llama_vocab_is_eog(self.vocab, tok)

    def is_control(self, tok) -> bool:
        self._alive()
        self._check_token(tok)
        return llama_vocab_is_control(self.vocab, tok)

    def token_text(self, tok) -> str:
        """The vocabulary entry of a token (not its detokenized form)."""
        self._alive()
        self._check_token(tok)
        cdef const char * t = llama_vocab_get_text(self.vocab, tok)
        return "" if t == NULL else t.decode("utf-8", "replace")

    cdef bint is_eog_c(self, llama_token tok) noexcept nogil:
        return llama_vocab_is_eog(self.vocab, tok)

    cdef int piece_c(self, llama_token tok, char * buf, int size) noexcept nogil:
        return sd_token_to_piece(self.vocab, tok, buf, size, 0, False)

    cdef int tokenize_c(self, const char * text, int n, bint parse_special,
                        vector[int32_t] & out) except -1:
        """``n`` bytes of text to ``out`` without BOS/EOS (for drafters that translate text
        between vocabularies); returns the token count."""
        cdef int32_t got
        out.resize(n + 8)
        with nogil:
            got = sd_tokenize(self.vocab, text, n, out.data(), <int32_t>out.size(), False,
                              parse_special)
        _raise_abort("tokenize")
        if got < 0 and got != -2147483648 and got != -2147483647:
            out.resize(-got)
            with nogil:
                got = sd_tokenize(self.vocab, text, n, out.data(), <int32_t>out.size(), False,
                                  parse_special)
            _raise_abort("tokenize")
        if got < 0:
            raise ValueError("tokenization failed")
        out.resize(got)
        return got

    def tokenize(self, text, *, bint add_special=True, bint parse_special=False) -> list:
        """Text (str or UTF-8 bytes) to token ids; ``add_special`` adds BOS where the model wants it."""
        self._alive()
        cdef bytes b = _text_bytes(text)
        if len(b) > 0x3FFFFFFF:
            raise ValueError("text too long to tokenize")
        cdef int32_t n_max = len(b) + 8
        cdef vector[llama_token] out = vector[llama_token](n_max)
        cdef const char * cb = b
        cdef int32_t blen = len(b)
        cdef int32_t n
        with nogil:
            n = sd_tokenize(self.vocab, cb, blen, out.data(), n_max, add_special, parse_special)
        _raise_abort("tokenize")
        if n < 0:
            if n == -2147483648:
                raise ValueError("tokenization overflow")
            out.resize(-n)
            with nogil:
                n = sd_tokenize(self.vocab, cb, blen, out.data(), -n, add_special, parse_special)
            _raise_abort("tokenize")
            if n < 0:
                raise ValueError("tokenization failed")
        return [out[i] for i in range(n)]

    def token_to_piece(self, tok, *, bint special=False) -> bytes:
        """The bytes a token stands for (may be a partial UTF-8 sequence)."""
        self._alive()
        self._check_token(tok)
        cdef char buf[256]
        cdef int n = sd_token_to_piece(self.vocab, tok, buf, sizeof(buf), 0, special)
        _raise_abort("token_to_piece")
        if n < 0:
            big = bytearray(-n)
            n = sd_token_to_piece(self.vocab, tok, <char *>big, len(big), 0, special)
            _raise_abort("token_to_piece")
            return bytes(big[:max(n, 0)])
        return buf[:n]

    def detokenize(self, tokens, *, bint remove_special=False, bint unparse_special=False) -> str:
        """Token ids back to text (invalid UTF-8 is replaced)."""
        self._alive()
        cdef vector[llama_token] toks
        for t in tokens:
            self._check_token(t)
            toks.push_back(t)
        if toks.size() == 0:
            return ""
        cdef int32_t cap = <int32_t>toks.size() * 16 + 64
        cdef vector[char] buf = vector[char](cap)
        cdef int32_t n = sd_detokenize(self.vocab, toks.data(), toks.size(), buf.data(), cap,
                                       remove_special, unparse_special)
        _raise_abort("detokenize")
        if n < 0:
            buf.resize(-n)
            n = sd_detokenize(self.vocab, toks.data(), toks.size(), buf.data(), -n,
                              remove_special, unparse_special)
            _raise_abort("detokenize")
        return buf.data()[:max(n, 0)].decode("utf-8", "replace")

    def vocab_compatible(self, Model other not None) -> bool:
        """Whether ``other`` can draft for this model: llama.cpp's rule (common/speculative.cpp).

        Same vocab type, BOS/EOS ids and add-flags, sizes within 128, and the same
        token text from id 5 on.
        """
        self._alive()
        other._alive()
        cdef const llama_vocab * a = self.vocab
        cdef const llama_vocab * b = other.vocab
        if llama_vocab_type_of(a) != llama_vocab_type_of(b):
            return False
        if (llama_vocab_get_add_bos(a) != llama_vocab_get_add_bos(b)
                or llama_vocab_get_add_eos(a) != llama_vocab_get_add_eos(b)
                or llama_vocab_bos(a) != llama_vocab_bos(b)
                or llama_vocab_eos(a) != llama_vocab_eos(b)):
            return False
        cdef int na = llama_vocab_n_tokens(a), nb = llama_vocab_n_tokens(b)
        if abs(na - nb) > 128:
            return False
        cdef int i
        cdef const char * ta
        cdef const char * tb
        for i in range(5, min(na, nb)):
            ta = llama_vocab_get_text(a, i)
            tb = llama_vocab_get_text(b, i)
            if (ta == NULL) != (tb == NULL):
                return False
            if ta != NULL and string(ta) != string(tb):
                return False
        return True
