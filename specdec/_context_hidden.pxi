# Part of _core (included by _core.pyx): the hidden rows a Context hands to drafts.
#
# MTP hidden states (``mtp_hidden``: "masked", a row per output, or "dense", a row per batch
# entry) feed an MTP head; the inputs of chosen layers feed an EAGLE-3 draft. Each setting is
# checked against what llama.cpp's graph for the architecture can give (it would abort building
# a graph that cannot), and the last decode's rows are read through read-only views.


cdef _set_mtp_hidden(Context self, mode):
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


cdef _mtp_hidden_row(Context self, i):
    i = _int_arg('i', i, I32_MIN, I32_MAX)
    if self._mtp_hidden == 0:
        raise ValueError("MTP hidden states are off: set_mtp_hidden('masked' or 'dense') "
                         "first")
    i = self._row_index(i, "logits" if self._mtp_hidden == 1 else "mtp_hidden")
    cdef float * p = self.mtp_hidden_c(i)
    if p == NULL:
        raise IndexError(f"no MTP hidden state for batch index {i}")
    return _view(self, p, -1, self.model.n_embd_out)


cdef _mtp_hidden_rows(Context self):
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


cdef _set_layer_inputs(Context self, layers):
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


cdef _layer_input_rows(Context self, layer):
    layer = _int_arg("layer", layer, I32_MIN, I32_MAX)
    self._alive()
    if layer not in tuple(self._layer_inp):
        raise ValueError(f"layer {layer}'s inputs are not kept: set_layer_inputs first")
    cdef float * p = self.layer_inp_c(layer, 0)
    if p == NULL:
        raise IndexError("no decode since the layer inputs were turned on")
    return _view(self, p, self._last_n_tokens, self.model.n_embd)
