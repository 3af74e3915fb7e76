# Part of _core (included by _core.pyx): decoding batches of many shapes on sequence 0 of an
# empty context, which is left empty: ``warm_up`` pays each row count's one-off set-up before
# requests would, and ``check_batch_invariance`` shows that a row's logits do not depend on how
# many rows share its batch (exact mode on a GPU or RPC servers, whose kernels are their own).


cdef _warm_up(Context self, max_rows):
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


cdef _check_batch_invariance(Context self, max_rows):
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
