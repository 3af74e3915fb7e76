# cython: language_level=3
# distutils: language = c++
"""The catch-up queues shared by drafters whose own context is fed the target's rows (MTP,
EAGLE-3): each committed position enters the drafter's KV as a (token, row) pair.

The pairs wait in a queue per sequence while the target decodes, and a sequence's queue is
decoded together with its first draft step, so catching up costs no decode of its own. A
sequence not asked for drafts (the adaptive policy or the batch's floor holds it plain)
costs what a plain one does: a copy of its rows per round, never a decode. When drafting
resumes, its whole queue goes into the next draft step's batch (or one decode of its own
when long), so the drafter's KV is exactly what it would have been kept current, and the
drafts too; a sequence that ends without drafting again never has its rows decoded. A
queue that reaches ``cap`` rows (a long stretch of plain rounds) is decoded then, in one
batch, which bounds its memory.

Per sequence it keeps ``n_sync``, the positions whose pair is in the drafter's KV or
queued, and ``kept_tok``: after a propose only the *seed* pair stays, the one built from the
target's own row (at ``n_sync - 1``); the draft steps' pairs came from the drafter's own
state and are trimmed. When the next committed token is the seed's token, the seed is
reused rather than decoded again.
"""
from libc.stdint cimport int32_t
from libc.string cimport memset
from libcpp.vector cimport vector

from .._core cimport Context, Batch
from .._timing cimport now
from ._base cimport Drafter


cdef class TargetFedDrafter(Drafter):
    """Base of the drafters fed the target's rows; not a drafter of its own."""

    cdef int _bind_fed(self, list ctxs, int n_seq, int cap, int n_embd) except -1:
        """Take ``ctxs`` as the contexts fed, with a decode batch of ``cap`` rows of ``n_embd``
        and a queue per sequence of up to ``cap`` rows."""
        self.fed_ctxs = ctxs
        self.n_embd = n_embd
        self.batch = Batch(cap, n_embd=n_embd, n_seq_max=n_seq)
        self.q_cap = cap
        self.q_tok.assign(n_seq, vector[int32_t]())
        self.q_pos.assign(n_seq, vector[int32_t]())
        self.q_row.assign(n_seq, vector[float]())
        self.pend.assign(n_seq, vector[float](n_embd, 0.0))
        self.n_sync.assign(n_seq, 0)
        self.kept_tok.assign(n_seq, -1)
        self.n_decodes = self.n_catchup = self.n_caught_up = self.n_flushes = 0
        self.t_decode = 0.0
        return 0

    @property
    def has_model(self):
        return True

    def close(self):
        """Free the drafter's contexts now (it cannot draft afterwards)."""
        cdef Context c
        for c in self.fed_ctxs or ():
            c.close()
        self.fed_ctxs = None
        self.batch = None

    cdef int _check_bound(self, int seq) except -1:
        if not self.fed_ctxs:
            raise RuntimeError(f"the {self.name} drafter is not bound to a target "
                               "(Decoder does this)")
        if seq < 0 or seq >= <int>self.n_sync.size():
            raise ValueError(f"sequence {seq} out of range for the {self.name} drafter's context")
        return 0

    cdef int _flush_batch(self) except -1:
        """Decode the rows in the batch into every context fed."""
        if self.batch.b.n_tokens == 0:
            return 0
        cdef Context c
        cdef double t0 = now()
        for c in self.fed_ctxs:
            c.decode_c(self.batch)
            self.n_decodes += 1
        self.t_decode += now() - t0
        self.batch.clear_c()
        self.n_flushes += 1
        return 0

    cdef int _load(self, int seq) except -1:
        """Move the queue of ``seq`` into the batch (no outputs), decoding the batch whenever
        it fills: its rows then go with the next decode of the batch."""
        cdef int i, n = self.q_tok[seq].size()
        for i in range(n):
            if self.batch.b.n_tokens >= self.batch.capacity:
                self._flush_batch()
            self.batch.add_embd_c(self.q_tok[seq][i], self.q_pos[seq][i], seq, False,
                                  self.q_row[seq].data() + <size_t>i * self.n_embd)
        self.n_caught_up += n
        self.q_tok[seq].clear()
        self.q_pos[seq].clear()
        self.q_row[seq].clear()
        return 0

    cdef int _flush(self) except -1:
        """Decode every sequence's queue (and the batch) into every context fed."""
        cdef int seq
        for seq in range(<int>self.q_tok.size()):
            self._load(seq)
        return self._flush_batch()

    cdef int _flush_seq(self, int seq) except -1:
        """Decode the queue of ``seq`` (and the batch) into every context fed."""
        self._load(seq)
        return self._flush_batch()

    cdef int n_queued(self, int seq) noexcept:
        return self.q_tok[seq].size()

    cdef int _queue(self, int32_t tok, int pos, int seq, const float * row) except -1:
        """Queue the pair (``tok``, ``row``) of ``seq`` at ``pos`` (after its queued ones)."""
        if <int>self.q_tok[seq].size() >= self.q_cap:
            self._flush_seq(seq)
        self.q_tok[seq].push_back(tok)
        self.q_pos[seq].push_back(pos)
        self.q_row[seq].insert(self.q_row[seq].end(), row, row + self.n_embd)
        self.n_catchup += 1
        return 0

    cdef int _unqueue_from(self, int seq, int keep) except -1:
        """Drop the queued pairs of ``seq`` at positions >= ``keep``."""
        cdef int n = self.q_pos[seq].size()
        while n > 0 and self.q_pos[seq][n - 1] >= keep:
            n -= 1
        self.q_tok[seq].resize(n)
        self.q_pos[seq].resize(n)
        self.q_row[seq].resize(<size_t>n * self.n_embd)
        return 0

    cdef int _forget(self, int seq) except -1:
        """Drop everything of ``seq``: a new request or a reset."""
        self._unqueue_from(seq, -1)
        self.batch.drop_seq_c(seq, -1)      # (rows left by a draft step that failed)
        cdef Context c
        for c in self.fed_ctxs:
            c.seq_rm_c(seq, -1, -1)
        memset(self.pend[seq].data(), 0, self.n_embd * sizeof(float))
        self.n_sync[seq] = 0
        self.kept_tok[seq] = -1
        return 0

    cdef int _trim(self, int seq, int keep) except -1:
        """Drop the pairs of ``seq`` at positions >= keep (queued ones included; the queued
        ones before ``keep`` stay queued)."""
        if self.n_sync[seq] <= keep:
            return 0
        self._unqueue_from(seq, keep)
        self._flush_batch()                 # (empty between draft steps: rows left by a failure)
        cdef Context c
        for c in self.fed_ctxs:
            c.seq_rm_c(seq, keep, -1)
        self.n_sync[seq] = keep
        self.kept_tok[seq] = -1
        return 0

    cdef int _seed_kept(self, int seq, int q, int32_t tok) except -1:
        """1 when the pair at ``q``, whose token the target committed as ``tok``, is the
        kept seed (in the KV already); else 0, with everything from ``q`` on trimmed."""
        if self.n_sync[seq] > q:
            if self.n_sync[seq] == q + 1 and self.kept_tok[seq] == tok:
                return 1
            self._trim(seq, q)
        elif self.n_sync[seq] < q:
            raise RuntimeError(f"the {self.name} drafter's context of sequence {seq} is behind "
                               f"the target ({self.n_sync[seq]} < {q} positions)")
        return 0

    cdef int _sync_at(self, int seq, int q) except -1:
        """Make the pairs of ``seq`` end at ``q`` before drafting from there."""
        if self.n_sync[seq] != q:
            self._trim(seq, q)
            if self.n_sync[seq] != q:
                raise RuntimeError(f"the {self.name} drafter's context of sequence {seq} is "
                                   f"behind the target ({self.n_sync[seq]} < {q} positions)")
        return 0

    cdef int _keep_seed(self, int seq, int q, int32_t tok, int n_dec) except -1:
        """After ``n_dec`` draft decodes from the seed pair (``tok`` at ``q``): keep the seed,
        trim the draft steps' pairs."""
        cdef Context c
        if n_dec <= 0:
            return 0
        if n_dec > 1:
            for c in self.fed_ctxs:
                c.seq_rm_c(seq, q + 1, -1)
        self.n_sync[seq] = q + 1
        self.kept_tok[seq] = tok
        return 0

    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1:
        self._check_bound(seq)
        self._forget(seq)
        return 0

    cdef int _reset(self, int seq) except -1:
        if self.fed_ctxs and 0 <= seq < <int>self.n_sync.size():
            self._forget(seq)
        return 0

    def synced(self, int seq=0) -> int:
        """Positions of ``seq`` whose pair is in the drafter's context or queued for it."""
        self._check_bound(seq)
        return self.n_sync[seq]
