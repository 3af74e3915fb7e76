# cython: language_level=3
# distutils: language = c++
"""How llama.cpp splits a verify batch into ubatches, and the padding that keeps it whole.

A KV cache with a stream per sequence (the Engine's target under an MTP drafter), and
recurrent or hybrid memory (qwen35), split a batch into ubatches of *equal rows per
sequence* (llama.cpp's ``split_equal``): a ubatch takes, of a run of sequences, as many rows
from each as the shortest has left. With a stream per sequence (and pure recurrent
memory) the run must be of consecutive sequence ids. With ``n_rollback`` snapshots the last
``n_rollback + 1`` rows of a sequence must stay in one ubatch, and a verify never has more:
a sequence longer than the shortest of the run then goes alone. So a round of 8 sequences
drafting 4 tokens each is one ubatch, but the same round with one sequence held plain
(``[5, 5, 5, 5, 5, 5, 5, 1]``) is eight: each drafting sequence alone, then the plain one.

Each ubatch is a pass over the target's weights: a verify of ``R`` rows in ``U`` ubatches
costs about ``U a + b R`` (the batch's cost line ``BatchCost``, ``a`` the part a pass pays
whatever its rows; on a 2-core CPU about two rows' worth, on a GPU far more). Exact mode pads
every sequence to the same rows for another reason (batch invariance); outside it, a round's
sequences are padded up to a height ``h`` (throw-away rows after their drafts, as exact
mode's, dropped by the rollback) when the rows that costs are cheaper than the passes it
saves: ``[5]*7 + [1]`` gets 4 padding rows and is one pass; ``[5] + [1]*7`` is two passes
as it is (padding would cost 28 rows).
"""
from libcpp.vector cimport vector

from ._core cimport Context, Model
from ._policy cimport BatchCost
from ._rollback cimport Rollback
from ._seq cimport _Seq


cdef int count_ubatches(const vector[int] & rows, const vector[int] & ids, bint sequential,
                        int keep_tail, int n_ubatch) noexcept:
    """The ubatches llama.cpp's ``split_equal`` makes of a batch holding, in order, ``rows[i]``
    rows of sequence ``ids[i]`` (ascending), as ``llama_batch_allocr::split_equal`` does."""
    cdef int n = rows.size(), n_u = 0, i, j, m, r, n_keep, last
    cdef vector[int] rem = rows, cur, take
    while True:
        cur.clear()
        last = -2
        for i in range(n):
            if rem[i] <= 0:
                continue
            if sequential and cur.size() > 0 and ids[i] != last + 1:
                continue
            cur.push_back(i)
            last = ids[i]
        m = cur.size()
        if m == 0:
            return n_u
        take.assign(m, 0)
        while True:
            for j in range(m):
                if rem[cur[j]] - take[j] <= 0:
                    break
            else:
                for j in range(m):
                    take[j] += 1
                if (take[0] + 1) * m > n_ubatch:
                    break
                continue
            break
        n_keep = m
        if keep_tail > 0:
            n_keep = 0
            while n_keep < m:
                r = rem[cur[n_keep]] - take[n_keep]
                if r != 0 and r < keep_tail:
                    break
                n_keep += 1
            if n_keep == 0:
                # the first sequence alone: to its end, or leaving at least keep_tail rows
                if rem[cur[0]] <= n_ubatch:
                    take[0] = rem[cur[0]]
                else:
                    while rem[cur[0]] - take[0] < keep_tail:
                        take[0] -= 1
                n_keep = 1
        for j in range(n_keep):
            rem[cur[j]] -= take[j]
        n_u += 1


cdef int pad_height(const vector[int] & rows, const vector[int] & ids, bint sequential,
                    int keep_tail, int n_ubatch, double a, double b, int max_rows) noexcept:
    """The height ``h`` to pad every shorter sequence up to (0: none) that makes the batch
    cheapest by ``U a + b R``; the padded batch holds at most ``max_rows`` rows."""
    cdef int n = rows.size(), i, j, h, total = 0, pads, best_h = 0
    cdef vector[int] padded
    for i in range(n):
        total += rows[i]
    cdef double best = a * count_ubatches(rows, ids, sequential, keep_tail, n_ubatch) + b * total
    cdef double c
    for i in range(n):
        h = rows[i]
        pads = 0
        padded = rows
        for j in range(n):
            if padded[j] < h:
                pads += h - padded[j]
                padded[j] = h
        if pads == 0 or total + pads > max_rows:
            continue
        c = a * count_ubatches(padded, ids, sequential, keep_tail, n_ubatch) + b * (total + pads)
        if c < best * (1.0 - 1e-9):
            best = c
            best_h = h
    return best_h


cdef int even_rows(Rollback rollback, BatchCost batch_cost, list seqs, int max_rows) except -1:
    """Outside exact mode, before the verify of ``seqs``: pad them (``n_pad``) to the height
    that makes the fewest, cheapest ubatches, where the target's memory splits by sequence and
    the rollback drops padding rows."""
    cdef Context ctx = rollback.ctx
    cdef int n = len(seqs), i, h
    if n < 2 or not rollback.pads_rows():
        return 0
    cdef Model model = ctx.model
    cdef bint recurrent = model.is_recurrent or model.is_hybrid
    cdef bint unified = ctx.kv_unified or ctx.n_seq_max == 1
    if unified and not recurrent:
        return 0            # one KV stream: llama.cpp's split_simple keeps the batch whole
    cdef bint sequential = not unified or model.is_recurrent
    cdef int keep_tail = ctx.n_rollback + 1 if recurrent and ctx.n_rollback > 0 else 0
    cdef double a = 1.0, b = 1.0        # until batches were measured: a pass costs a row
    if batch_cost.n > 0.0:
        batch_cost._line(&a, &b)
        if b <= 0.0:
            return 0
    cdef vector[int] rows, ids
    cdef _Seq s
    for s in seqs:
        rows.push_back(s.k + 1)
        ids.push_back(s.id)
    h = pad_height(rows, ids, sequential, keep_tail, ctx.n_ubatch, a, b, max_rows)
    if h > 0:
        for s in seqs:
            s.n_pad = max(h - s.k - 1, 0)
    return 0


cdef int _rows_ids(rows, ids, vector[int] & r, vector[int] & d) except -1:
    """A batch as the Python functions take it: ``rows[i]`` rows of sequence ``ids[i]``."""
    for i, x in enumerate(rows):
        if x < 1:
            raise ValueError("every sequence has a row or more")
        r.push_back(x)
        d.push_back(i if ids is None else ids[i])
    return 0


def ubatches(rows, ids=None, *, bint sequential=True, int keep_tail=0, int n_ubatch=512) -> int:
    """``count_ubatches`` from Python: the ubatches of a batch of ``rows[i]`` rows of sequence
    ``ids[i]`` (default 0, 1, ...)."""
    cdef vector[int] r, d
    _rows_ids(rows, ids, r, d)
    return count_ubatches(r, d, sequential, keep_tail, n_ubatch)


def padding_height(rows, ids=None, *, bint sequential=True, int keep_tail=0, int n_ubatch=512,
                   double a=1.0, double b=1.0, int max_rows=1 << 20) -> int:
    """``pad_height`` from Python: the height to pad the shorter sequences to (0: none)."""
    cdef vector[int] r, d
    _rows_ids(rows, ids, r, d)
    return pad_height(r, d, sequential, keep_tail, n_ubatch, a, b, max_rows)
