# Part of _core (included by _core.pyx): Batch, the entries of one decode.

cdef class Batch:
    """Batch(capacity, *, n_embd=0, n_seq_max=1)
--

    Tokens, positions, sequence ids, output flags and optional embedding rows.

    Allocated once for ``capacity`` entries and reused (``clear``). MTP batches
    carry a token *and* an ``n_embd``-wide hidden row per entry.
    """

    def __cinit__(self):
        self.b.n_tokens = 0
        self.b.token = NULL
        self.b.embd = NULL
        self.b.pos = NULL
        self.b.n_seq_id = NULL
        self.b.seq_id = NULL
        self.b.logits = NULL

    def __init__(self, capacity, *, n_embd=0, n_seq_max=1):
        _check_positive("capacity", capacity)
        _check_positive("n_seq_max", n_seq_max)
        if not isinstance(n_embd, int) or n_embd < 0:
            raise ValueError(f"n_embd must be a non-negative int, got {n_embd!r}")
        # llama_batch_init allocates per entry: an absurd size would take the machine's memory
        if capacity > 1 << 20 or n_seq_max > 256 or n_embd > 1 << 20 or capacity * n_embd > 1 << 31:
            raise ValueError(f"batch too large (capacity={capacity}, n_embd={n_embd}, "
                             f"n_seq_max={n_seq_max}): at most 2**20 entries, 256 sequences, "
                             "2**31 embedding floats")
        if self.b.token != NULL:
            raise RuntimeError("Batch is already initialised")
        self.capacity = capacity
        self.n_embd = n_embd
        self.n_seq_max = n_seq_max
        self.b = llama_batch_init(capacity, 0, n_seq_max)
        if n_embd > 0:
            # llama_batch_init allocates token *or* embd; MTP rows need both (freed by llama_batch_free)
            self.b.embd = <float *> malloc(<size_t>capacity * n_embd * sizeof(float))
            if self.b.embd == NULL:
                raise MemoryError()
        self.b.n_tokens = 0

    def __dealloc__(self):
        if self.b.token != NULL:
            llama_batch_free(self.b)
            self.b.token = NULL

    def __len__(self):
        return self.b.n_tokens

    @property
    def n_tokens(self) -> int:
        return self.b.n_tokens

    def clear(self):
        self.b.n_tokens = 0

    cdef int add_c(self, llama_token tok, llama_pos pos, llama_seq_id seq, bint output) except -1 nogil:
        cdef int i = self.b.n_tokens
        if i >= self.capacity:
            with gil:
                raise ValueError(f"batch is full (capacity {self.capacity})")
        cdef int8_t flag = 1 if output else 0
        self.b.token[i] = tok
        self.b.pos[i] = pos
        self.b.n_seq_id[i] = 1
        self.b.seq_id[i][0] = seq
        self.b.logits[i] = flag
        self.b.n_tokens = i + 1
        return 0

    cdef int add_embd_c(self, llama_token tok, llama_pos pos, llama_seq_id seq, bint output,
                        const float * row) except -1 nogil:
        cdef int i = self.b.n_tokens
        self.add_c(tok, pos, seq, output)
        memcpy(self.b.embd + <size_t>i * self.n_embd, row, self.n_embd * sizeof(float))
        return 0

    cdef int drop_seq_c(self, llama_seq_id seq, int n_drop) noexcept nogil:
        """Remove the oldest ``n_drop`` entries whose first sequence is ``seq`` (-1: all),
        keeping the others in order (a drafter's queue of catch-up rows)."""
        cdef int i, j = 0, n = self.b.n_tokens, E = self.n_embd
        for i in range(n):
            if self.b.seq_id[i][0] == seq and n_drop != 0:
                n_drop -= 1
                continue
            if j != i:
                self.b.token[j] = self.b.token[i]
                self.b.pos[j] = self.b.pos[i]
                self.b.n_seq_id[j] = self.b.n_seq_id[i]
                self.b.seq_id[j][0] = self.b.seq_id[i][0]
                self.b.logits[j] = self.b.logits[i]
                if E:
                    memcpy(self.b.embd + <size_t>j * E, self.b.embd + <size_t>i * E,
                           E * sizeof(float))
            j += 1
        self.b.n_tokens = j
        return 0

    def add(self, token, pos, seq_ids=0, output=False, embd=None):
        """Append one entry. ``seq_ids`` is an id or a list of ids; ``embd`` a row of ``n_embd`` floats."""
        if not isinstance(token, (int, np.integer)) or isinstance(token, bool):
            raise TypeError(f"token must be an int, got {type(token).__name__}")
        if not isinstance(pos, (int, np.integer)) or isinstance(pos, bool):
            raise TypeError(f"pos must be an int, got {type(pos).__name__}")
        if not -2**31 <= token < 2**31 or not 0 <= pos < 2**31:
            raise ValueError(f"token {token} / pos {pos} out of range")
        seqs = [seq_ids] if isinstance(seq_ids, (int, np.integer)) else list(seq_ids)
        if not 1 <= len(seqs) <= self.n_seq_max:
            raise ValueError(f"an entry needs 1..{self.n_seq_max} sequence ids, got {len(seqs)}")
        for s in seqs:
            if not isinstance(s, (int, np.integer)) or s < 0 or s >= self.n_seq_max:
                raise ValueError(f"sequence id {s!r} out of range [0, {self.n_seq_max})")
        if (embd is None) != (self.n_embd == 0):
            raise ValueError("this batch carries embedding rows: pass embd" if self.n_embd
                             else "this batch has no embedding rows (n_embd=0)")
        cdef const float[::1] row
        if embd is not None:
            row = np.ascontiguousarray(embd, dtype=np.float32).reshape(-1)
            if row.shape[0] != self.n_embd:
                raise ValueError(f"embd row has {row.shape[0]} values, expected {self.n_embd}")
            self.add_embd_c(token, pos, seqs[0], bool(output), &row[0])
        else:
            self.add_c(token, pos, seqs[0], bool(output))
        cdef int i = self.b.n_tokens - 1
        cdef int k
        for k in range(len(seqs)):
            self.b.seq_id[i][k] = seqs[k]
        self.b.n_seq_id[i] = len(seqs)

    def set_output(self, i, bint value):
        i = _int_arg("i", i, I32_MIN, I32_MAX)
        if i < 0:
            i += self.b.n_tokens
        if not 0 <= i < self.b.n_tokens:
            raise IndexError(f"batch index {i} out of range")
        cdef int8_t flag = 1 if value else 0
        self.b.logits[i] = flag

    @property
    def tokens(self) -> list:
        return [self.b.token[i] for i in range(self.b.n_tokens)]

    @property
    def positions(self) -> list:
        return [self.b.pos[i] for i in range(self.b.n_tokens)]

    @property
    def outputs(self) -> list:
        return [bool(self.b.logits[i]) for i in range(self.b.n_tokens)]
