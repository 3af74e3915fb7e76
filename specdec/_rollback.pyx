# cython: language_level=3
# distutils: language = c++
"""How a target context's memory forgets a round's rejected drafts: one strategy per context,
chosen once from its memory kind (``rollback_for``).

A round decodes ``[last, d1..dk]`` (and, in exact mode, padding rows) at ``n_past..``; the
target agrees with ``a`` drafts; its memory must then hold ``last, d1..da`` and no more.

- ``TrimRollback``, attention-only targets: the KV cells of the rejected rows are removed
  (``seq_rm``).
- ``SnapshotRollback``, recurrent and hybrid targets whose context keeps ``n_rollback``
  snapshots of the recurrent state: ``seq_rm`` goes back to one of them. A round drafts at
  most ``n_rollback`` tokens, and the memory rolls back once per decode, so exact mode's
  padding rows go with the rejected drafts.
- ``CheckpointRollback``, recurrent and hybrid targets without snapshots (mamba2, rwkv,
  jamba, qwen3next, ...): the recurrent state is saved before a verify that holds drafts; on
  a partial accept it is restored, the attention KV trimmed, and ``last, d1..da, y`` decoded
  again (``decode_again``; the controller samples from it).

The round calls these cdef methods on whichever strategy its context has, with no flags
and no Python.
"""
from ._llama cimport LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from ._timing cimport lap, T_CONTROL, T_VERIFY
from ._verify cimport sparse_rows


cdef class Rollback:
    """The strategy's interface; its defaults are those of a memory that can drop any row."""

    def __init__(self, Context ctx not None, bint exact=False):
        self.ctx = ctx
        self.exact = exact

    cdef int cap_drafts(self, int k) noexcept:
        """The drafts a round may verify, of the ``k`` the limits allow."""
        return k

    cdef bint drops_rows(self) noexcept:
        """True where a decoded row can be dropped from the memory afterwards (a one-token
        prompt chunk in exact mode is padded with one)."""
        return True

    cdef bint pads_rows(self) noexcept:
        """True where a verify may hold padding rows after a sequence's drafts (``n_pad``)."""
        return True

    cdef int pad(self, list seqs, int rows, int max_rows) except -1:
        """Exact mode: every sequence of the verify batch gets ``rows`` rows, throw-away rows
        after its drafts (``n_pad``): a context with a KV stream per sequence, and recurrent
        memory, split a batch into ubatches of equal rows per sequence, and a sequence with
        more rows than the others would have its last ones computed alone."""
        cdef _Seq s
        for s in seqs:
            s.n_pad = rows - s.k - 1
        if rows * len(seqs) > max_rows:
            raise RuntimeError(f"exact mode needs n_batch >= {rows * len(seqs)} for this "
                               f"round (have {max_rows})")
        return 0

    cdef list groups(self, list seqs, bint redo):
        """The decodes a round's sequences go in (``redo``: their decode again)."""
        return [seqs] if seqs else []

    cdef int before_decode(self, list group) except -1:
        """Before the verify decode of ``group``."""
        return 0

    cdef int drop_padding(self, _Seq s) except -1:
        """After the decode, before verification: forget the padding rows of ``s``."""
        return 0

    cdef bint after_verify(self, _Seq s, int a) except -1:
        """Forget the drafts of ``s`` after its first ``a``; True when ``last, d1..da`` must
        be decoded again (``decode_again``)."""
        return False

    cdef int decode_again(self, Batch batch, list group) except -1:
        """Decode again what ``after_verify`` asked for, for the sequences of ``group``;
        returns the rows decoded (0: none)."""
        return 0


cdef inline int _trim(Context ctx, _Seq s, int keep) except -1:
    if not ctx.seq_rm_c(s.id, keep, -1):
        raise RuntimeError(f"rollback of sequence {s.id} to {keep} refused by llama.cpp")
    return 0


cdef class TrimRollback(Rollback):
    """Attention-only memory: the cells of rejected rows are removed."""

    cdef int drop_padding(self, _Seq s) except -1:
        if s.n_pad > 0:
            if not self.ctx.seq_rm_c(s.id, s.mem.n_past + 1 + s.k, -1):
                raise RuntimeError("could not drop the padding rows")
        return 0

    cdef bint after_verify(self, _Seq s, int a) except -1:
        if a < s.k:
            _trim(self.ctx, s, s.mem.n_past + 1 + a)
        return False


cdef class SnapshotRollback(Rollback):
    """Recurrent memory with ``n_rollback`` snapshots: at most that many drafts a round;
    padding rows go with the rejected drafts (one rollback per decode)."""

    def __init__(self, Context ctx not None, bint exact=False):
        super().__init__(ctx, exact)
        self.n_rollback = ctx.n_rollback

    cdef int cap_drafts(self, int k) noexcept:
        return min(k, self.n_rollback)

    cdef bint after_verify(self, _Seq s, int a) except -1:
        if a < s.k or s.n_pad > 0:
            _trim(self.ctx, s, s.mem.n_past + 1 + a)
        return False


cdef class CheckpointRollback(Rollback):
    """Recurrent memory without snapshots: checkpoint, restore, decode again."""

    def __init__(self, Context ctx not None, bint exact=False):
        super().__init__(ctx, exact)
        self.flags = LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY   # the recurrent part: hybrids trim their KV

    cdef bint drops_rows(self) noexcept:
        return False

    cdef bint pads_rows(self) noexcept:
        return False

    cdef int pad(self, list seqs, int rows, int max_rows) except -1:
        """No padding: a padding row would make every round a partial accept, decoded again;
        exact mode decodes the sequences in groups of equal rows instead (``groups``)."""
        return 0

    cdef list groups(self, list seqs, bint redo):
        """One decode, except in exact mode, where each decode holds the sequences with the
        same rows.

        llama.cpp splits a recurrent batch into ubatches of equal rows per sequence, so a
        sequence with more rows than the others would have its last rows computed in a
        ubatch of their own (a single row takes other kernels, and a gated delta net computes
        a chunk of tokens in another order than the same tokens one chunk): its logits and
        state would depend on the batch. Padding cannot even them here, so the sequences of
        equal rows are decoded together, each group as when run alone."""
        if not seqs:
            return []
        if not self.exact or len(seqs) == 1:
            return [seqs]
        cdef dict by_rows = {}
        cdef _Seq s
        for s in seqs:
            by_rows.setdefault(s.a + 2 if redo else s.k + 1, []).append(s)
        return list(by_rows.values())

    cdef int before_decode(self, list group) except -1:
        """Save the recurrent state of every sequence of ``group`` whose verify holds drafts
        (or the exact-mode filler): a rejected one is rolled back by restoring it."""
        cdef _Seq s
        for s in group:
            s.t_ckpt = 0.0
            s.redo = False
            if s.k > 0:
                lap(self.clock, T_CONTROL)
                self.ctx.save_state_c(s.id, self.flags, s.mem.ckpt)
                s.t_ckpt = lap(self.clock, T_VERIFY)
        return 0

    cdef bint after_verify(self, _Seq s, int a) except -1:
        """A partial accept: back to the state before ``last``; ``decode_again`` decodes the
        kept tokens again."""
        if a >= s.k:
            return False
        self.ctx.load_state_c(s.id, self.flags, s.mem.ckpt)
        _trim(self.ctx, s, s.mem.n_past)
        return True

    cdef int decode_again(self, Batch batch, list group) except -1:
        """Decode ``last, d1..da, y`` again for the sequences of ``group`` whose checkpoint was
        restored (``redo``). ``y`` (the target's own token, already emitted) rides along: its
        row yields the next token, so the decode a rejection costs is also the next plain
        round, and the batch always has two rows or more (exact mode never decodes a single
        row)."""
        cdef _Seq s
        cdef int i, base, n_rows = 0
        batch.clear_c()
        for s in group:
            if not s.redo:
                continue
            s.row0 = batch.b.n_tokens
            base = s.mem.n_past - 1 - s.a
            batch.add_c(s.prev, base, s.id, True)
            for i in range(s.a):
                batch.add_c(s.draft.tokens[i], base + 1 + i, s.id, True)
            batch.add_c(s.last, base + 1 + s.a, s.id, True)
            n_rows += s.a + 2
        if n_rows == 0:
            return 0
        lap(self.clock, T_CONTROL)
        self.ctx.decode_c(batch, sparse_rows([s for s in group if s.redo]))
        return n_rows


cdef Rollback rollback_for(Context ctx, int n_max, bint exact):
    """The strategy for ``ctx``'s memory; a context whose snapshots cannot roll back drafts
    of ``n_max`` tokens is a ``ValueError``."""
    model = ctx.model
    if not model.supports_partial_rollback:
        return CheckpointRollback(ctx, exact)
    if not (model.is_recurrent or model.is_hybrid):
        return TrimRollback(ctx, exact)
    if n_max > 0 and ctx.n_rollback < n_max:
        raise ValueError(f"n_rollback={ctx.n_rollback} of the target context is too small "
                         f"for drafts of {n_max} tokens: create it with n_rollback >= n_max")
    if exact and ctx.n_rollback < 1:
        raise ValueError("exact mode on a recurrent/hybrid target needs n_rollback >= 1")
    return SnapshotRollback(ctx, exact)
