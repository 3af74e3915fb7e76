# Part of _core (included by _core.pyx): what a Context's memory holds, per sequence.
#
# Removing, copying and keeping positions, forgetting everything, and a sequence's state saved
# and restored (the checkpoints that roll back a recurrent target without snapshots). A
# recurrent state can only be cut back within its last decode, by its snapshots, once
# (``_rollback_budget``); past that llama.cpp would leave it wrong, so it is refused here.


cdef int _check_seq(Context self, llama_seq_id seq, bint allow_all) except -1:
    if allow_all and seq == -1:
        return 0
    if seq < 0 or seq >= self.n_seq_max:
        raise ValueError(f"sequence id {seq} out of range [0, {self.n_seq_max})")
    return 0


cdef int _seq_rm(Context self, llama_seq_id seq, llama_pos p0, llama_pos p1) except -1:
    self._alive()
    _check_seq(self, seq, True)
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


cdef _seq_cp(Context self, src, dst, p0, p1):
    src = _int_arg('src', src, I32_MIN, I32_MAX)
    dst = _int_arg('dst', dst, I32_MIN, I32_MAX)
    p0 = _int_arg('p0', p0, I32_MIN, I32_MAX)
    p1 = _int_arg('p1', p1, I32_MIN, I32_MAX)
    self._alive()
    _check_seq(self, src, False)
    _check_seq(self, dst, False)
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


cdef _seq_keep(Context self, seq):
    seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
    self._alive()
    _check_seq(self, seq, False)
    self._enter()
    try:
        sd_memory_seq_keep(self.mem, seq)
    finally:
        self._leave()
    self._check_abort("seq_keep")


cdef _clear(Context self, bint data):
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


cdef int _save_state(Context self, llama_seq_id seq, uint32_t flags, vector[uint8_t] & out) except -1:
    self._alive()
    _check_seq(self, seq, False)
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


cdef int _load_state(Context self, llama_seq_id seq, uint32_t flags, const vector[uint8_t] & data) except -1:
    self._alive()
    _check_seq(self, seq, False)
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
