# cython: language_level=3
# distutils: language = c++
"""Suffix decoding (Oliaro et al., "SuffixDecoding", 2024; Arctic Inference): model-free
drafts from frequency-counted suffix trees.

Two trees are kept: one per sequence over the request's prompt and accepted tokens,
grown as tokens are observed, and one global tree over the generations of previous
requests and user documents (``add_corpus``), bounded by ``max_corpus_tokens`` and
evicting the oldest sequence first. A draft matches the longest suffix of the
history plus the pending token (at most ``max_depth`` tokens) that has been seen
with a continuation, then follows the most frequent continuation while the
product of the empirical continuation probabilities stays at or above
``min_prob``, so repetitive text gets long drafts and ambiguous text short ones or
none. Each tree proposes a draft; the one with the higher expected number of
accepted tokens (the sum of the path probabilities) wins.

The tree is Arctic Inference's depth-limited suffix tree: every suffix of every
sequence is inserted up to ``max_depth + 1`` tokens, edges are compressed and
refer to their tokens in the stored sequences, and each node counts the suffixes
that pass through it, i.e. the occurrences of its string. A growing sequence
keeps the nodes where its last ``max_depth`` suffixes end, so appending a token
costs O(max_depth) whatever the length of the history.

Unlike Arctic Inference, the probability of a continuation leaves out the
occurrences that end where the text ends (the history's own tail has no next token
yet), a draft that runs into the depth limit or the end of the text backs off to a
shorter context instead of stopping, equal counts go to the latest continuation,
and the corpus is bounded in tokens rather than in requests.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp.deque cimport deque
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref

import math
import numbers

from .._core cimport Context
from ._base cimport Drafter, Draft
from .registry import register


cdef enum:
    ROOT = 0
    NONE = -1
    DIRTY = -2          # Node.best after an eviction lowered a count: rescan on use


cdef struct Node:
    int32_t parent
    int32_t tok         # first token of the edge into this node
    int32_t ref_seq     # the edge's tokens are seqs[ref_seq][ref_idx : ref_idx + length]
    int32_t ref_idx
    int32_t length      # edge length (root: 0)
    int32_t count       # suffixes passing through or ending at this node = occurrences of its string
    int32_t n_end       # suffixes ending exactly here (at a sequence end or at the depth limit)
    int32_t best        # child with the highest count, NONE without children, or DIRTY
    int32_t first_child
    int32_t next_sib
    int32_t prev_sib


cdef inline uint64_t _key(int32_t node, int32_t tok) noexcept nogil:
    return (<uint64_t><uint32_t>node << 32) | <uint32_t>tok


cdef class _Tree:
    """A depth-limited compressed suffix tree over a FIFO of token sequences.

    Invariants (checked by ``check``): a node's count is its ``n_end`` plus its
    children's counts; suffixes end only at node ends, so every point inside an
    edge has the node's count and a single continuation; no node other than the
    root has one child and no ending suffix (such chains are merged); and a
    node's ``ref_seq`` is the newest sequence whose suffixes reach it. The last one
    is what makes FIFO eviction simple: when the oldest sequence is removed, every
    node still referring to it had only its suffixes and disappears with them.
    Only the newest sequence may grow, so sequences are added whole to the corpus.
    """
    cdef int depth                       # longest suffix indexed (max_depth + 1)
    cdef vector[Node] nodes
    cdef vector[int32_t] free_ids
    cdef unordered_map[uint64_t, int32_t] edges   # (parent, first token) -> child
    cdef deque[vector[int32_t]] seqs
    cdef int32_t base                    # id of seqs.front()
    cdef int64_t n_tokens
    cdef int64_t n_nodes
    cdef deque[int32_t] active           # where the newest sequence's short suffixes end, longest first

    def __cinit__(self, int depth):
        self.depth = depth
        self.clear()

    cdef void clear(self) noexcept:
        self.nodes.clear()
        self.free_ids.clear()
        self.edges.clear()
        self.seqs.clear()
        self.active.clear()
        self.base = 0
        self.n_tokens = 0
        self.n_nodes = 0
        self._alloc()        # the root

    # --- nodes ---------------------------------------------------------------------------

    cdef int32_t _alloc(self) noexcept:
        cdef Node z
        z.parent = NONE
        z.tok = 0
        z.ref_seq = 0
        z.ref_idx = 0
        z.length = 0
        z.count = 0
        z.n_end = 0
        z.best = NONE
        z.first_child = NONE
        z.next_sib = NONE
        z.prev_sib = NONE
        cdef int32_t i
        self.n_nodes += 1
        if not self.free_ids.empty():
            i = self.free_ids.back()
            self.free_ids.pop_back()
            self.nodes[i] = z
            return i
        self.nodes.push_back(z)
        return <int32_t>self.nodes.size() - 1

    cdef inline void _release(self, int32_t x) noexcept:
        self.nodes[x].parent = NONE
        self.nodes[x].count = 0
        self.free_ids.push_back(x)
        self.n_nodes -= 1

    cdef inline int32_t _tok(self, int32_t sid, int32_t idx) noexcept:
        return self.seqs[sid - self.base][idx]

    cdef inline int32_t _child(self, int32_t p, int32_t tok) noexcept:
        cdef unordered_map[uint64_t, int32_t].iterator it = self.edges.find(_key(p, tok))
        if it == self.edges.end():
            return NONE
        return deref(it).second

    cdef inline void _bump_best(self, int32_t p, int32_t c) noexcept:
        # counts only grow while inserting, so a running maximum stays exact; ties go to
        # the child seen last (the most recent continuation, as prompt lookup does)
        cdef int32_t b = self.nodes[p].best
        if b == NONE or (b >= 0 and self.nodes[c].count >= self.nodes[b].count):
            self.nodes[p].best = c

    cdef int32_t _best(self, int32_t p) noexcept:
        cdef int32_t b = self.nodes[p].best, c
        if b != DIRTY:
            return b
        b = self.nodes[p].first_child
        c = b
        while c != NONE:
            if self.nodes[c].count > self.nodes[b].count:
                b = c
            c = self.nodes[c].next_sib
        self.nodes[p].best = b
        return b

    cdef void _link(self, int32_t p, int32_t c) noexcept:
        self.edges[_key(p, self.nodes[c].tok)] = c
        self.nodes[c].parent = p
        self.nodes[c].prev_sib = NONE
        self.nodes[c].next_sib = self.nodes[p].first_child
        if self.nodes[p].first_child != NONE:
            self.nodes[self.nodes[p].first_child].prev_sib = c
        self.nodes[p].first_child = c
        self._bump_best(p, c)

    cdef void _unlink(self, int32_t p, int32_t c) noexcept:
        self.edges.erase(_key(p, self.nodes[c].tok))
        cdef int32_t a = self.nodes[c].prev_sib, b = self.nodes[c].next_sib
        if a != NONE:
            self.nodes[a].next_sib = b
        else:
            self.nodes[p].first_child = b
        if b != NONE:
            self.nodes[b].prev_sib = a
        if self.nodes[p].first_child == NONE:
            self.nodes[p].best = NONE
        elif self.nodes[p].best == c:
            self.nodes[p].best = DIRTY

    cdef void _replace(self, int32_t p, int32_t old, int32_t new) noexcept:
        """Put ``new`` where ``old`` was among p's children (both start with the same token)."""
        self.edges[_key(p, self.nodes[old].tok)] = new
        cdef int32_t a = self.nodes[old].prev_sib, b = self.nodes[old].next_sib
        self.nodes[new].parent = p
        self.nodes[new].prev_sib = a
        self.nodes[new].next_sib = b
        if a != NONE:
            self.nodes[a].next_sib = new
        else:
            self.nodes[p].first_child = new
        if b != NONE:
            self.nodes[b].prev_sib = new
        if self.nodes[p].best == old:
            self.nodes[p].best = new

    # --- growing -------------------------------------------------------------------------

    cdef void start_seq(self) noexcept:
        self.seqs.push_back(vector[int32_t]())
        self.active.clear()

    cdef void append(self, int32_t t) noexcept:
        """Append ``t`` to the newest sequence: every suffix shorter than ``depth`` grows by one."""
        cdef vector[int32_t] * s = &self.seqs.back()
        cdef int32_t sid = self.base + <int32_t>self.seqs.size() - 1
        cdef int32_t n = <int32_t>s.size()
        s.push_back(t)
        self.n_tokens += 1
        self.nodes[ROOT].count += 1           # the new suffix starting at n
        self.active.push_back(ROOT)
        if <int>self.active.size() > self.depth:
            self.active.pop_front()           # it reached the depth limit last time
        cdef size_t i
        for i in range(self.active.size()):
            self.active[i] = self._extend(self.active[i], t, sid, n)

    cdef int32_t _extend(self, int32_t a, int32_t t, int32_t sid, int32_t n) noexcept:
        """One suffix ending at node ``a`` (at position n of sequence sid) grows by token t;
        returns the node where it ends now."""
        cdef int32_t c = self._child(a, t), m, p
        cdef Node * A
        cdef Node * C
        cdef Node * M
        if c == NONE:
            if a != ROOT and self.nodes[a].count == 1:
                # a leaf of this suffix alone: lengthen its edge
                A = &self.nodes[a]
                A.length += 1
                A.ref_seq = sid
                A.ref_idx = n + 1 - A.length
                return a
            m = self._alloc()
            M = &self.nodes[m]
            M.tok = t
            M.ref_seq = sid
            M.ref_idx = n
            M.length = 1
            M.count = 1
            M.n_end = 1
            self._link(a, m)
            if a != ROOT:
                self.nodes[a].n_end -= 1
            return m
        A = &self.nodes[a]
        C = &self.nodes[c]
        if a != ROOT and A.n_end == 1 and A.count == C.count + 1:
            # only this suffix ends at a, every other one goes on into c: after this step a and
            # c would have equal counts, so keep them one node
            if C.length == 1:
                p = A.parent
                self.edges.erase(_key(a, t))
                C.tok = A.tok
                C.length = A.length + 1
                C.ref_seq = sid
                C.ref_idx = n + 1 - C.length
                C.count += 1
                C.n_end += 1
                self._replace(p, a, c)
                self._release(a)
                return c
            # move the boundary one token down: a grows, c shrinks
            A.length += 1
            A.ref_seq = sid
            A.ref_idx = n + 1 - A.length
            self.edges.erase(_key(a, t))
            C.ref_idx += 1
            C.length -= 1
            C.tok = self._tok(C.ref_seq, C.ref_idx)
            self.edges[_key(a, C.tok)] = c
            return a
        if C.length == 1:
            C.count += 1
            C.n_end += 1
            C.ref_seq = sid
            C.ref_idx = n
            if a != ROOT:
                A.n_end -= 1
            self._bump_best(a, c)
            return c
        # split c after its first token; the suffix ends at the new node
        m = self._alloc()
        M = &self.nodes[m]
        C = &self.nodes[c]
        M.tok = t
        M.ref_seq = sid
        M.ref_idx = n
        M.length = 1
        M.count = C.count + 1
        M.n_end = 1
        self._replace(a, c, m)
        C = &self.nodes[c]
        C.ref_idx += 1
        C.length -= 1
        C.tok = self._tok(C.ref_seq, C.ref_idx)
        self._link(m, c)
        if a != ROOT:
            self.nodes[a].n_end -= 1
        self._bump_best(a, m)
        return m

    cdef void add_seq(self, const int32_t * toks, int n) noexcept:
        cdef int i
        self.start_seq()
        for i in range(n):
            self.append(toks[i])
        self.active.clear()

    # --- eviction ------------------------------------------------------------------------

    cdef void pop_front(self) noexcept:
        """Remove the oldest sequence (never the one growing)."""
        cdef vector[int32_t] * s = &self.seqs.front()
        cdef int L = <int>s.size(), i, idx, end
        cdef int32_t node, c
        cdef bint dead
        for i in range(L):
            node = ROOT
            self.nodes[ROOT].count -= 1
            idx = i
            end = min(i + self.depth, L)
            dead = False
            while idx < end:
                c = self._child(node, s[0][idx])
                self.nodes[c].count -= 1
                if self.nodes[c].count == 0:
                    # only this suffix was left below c: the rest of its path goes too
                    self._unlink(node, c)
                    self._free_subtree(c)
                    self._maybe_merge(node)
                    dead = True
                    break
                if self.nodes[node].best == c:
                    self.nodes[node].best = DIRTY
                idx += self.nodes[c].length
                node = c
            if not dead:
                self.nodes[node].n_end -= 1
                self._maybe_merge(node)
        self.n_tokens -= L
        self.seqs.pop_front()
        self.base += 1

    cdef void _free_subtree(self, int32_t c) noexcept:
        cdef vector[int32_t] stack
        cdef int32_t x, y
        stack.push_back(c)
        while not stack.empty():
            x = stack.back()
            stack.pop_back()
            y = self.nodes[x].first_child
            while y != NONE:
                self.edges.erase(_key(x, self.nodes[y].tok))
                stack.push_back(y)
                y = self.nodes[y].next_sib
            self._release(x)

    cdef void _maybe_merge(self, int32_t x) noexcept:
        """Fold x into its only child when no suffix ends at x any more."""
        if x == ROOT or self.nodes[x].n_end != 0:
            return
        cdef int32_t ch = self.nodes[x].first_child, p
        if ch == NONE or self.nodes[ch].next_sib != NONE:
            return
        p = self.nodes[x].parent
        self.edges.erase(_key(x, self.nodes[ch].tok))
        # ch's reference is the newest sequence through ch, which passed through x just before
        self.nodes[ch].tok = self.nodes[x].tok
        self.nodes[ch].length += self.nodes[x].length
        self.nodes[ch].ref_idx -= self.nodes[x].length
        self._replace(p, x, ch)
        self._release(x)

    # --- lookup --------------------------------------------------------------------------

    cdef bint _walk(self, const int32_t * s, int n, int32_t * out_node, int * out_off) noexcept:
        """Follow s from the root; the point reached is (node, tokens of its edge consumed)."""
        cdef int32_t node = ROOT, c
        cdef int off = 0, i
        for i in range(n):
            if off == self.nodes[node].length:
                c = self._child(node, s[i])
                if c == NONE:
                    return False
                node = c
                off = 1
            else:
                if self._tok(self.nodes[node].ref_seq, self.nodes[node].ref_idx + off) != s[i]:
                    return False
                off += 1
        out_node[0] = node
        out_off[0] = off
        return True

    cdef inline bint _continues(self, int32_t node, int off) noexcept:
        return off < self.nodes[node].length or self.nodes[node].count > self.nodes[node].n_end

    cdef int _longest(self, const int32_t * ctx, int n, int kmax, int32_t * node, int * off) noexcept:
        """Length of the longest suffix of ctx (at most kmax) seen with a continuation.

        Seen-with-a-continuation is closed under taking suffixes, so the lengths that
        qualify are 0..m and a binary search finds m in O(kmax log kmax)."""
        cdef int lo = 0, hi = min(n, kmax), mid, o
        cdef int32_t nd
        node[0] = ROOT
        off[0] = 0
        if not self._continues(ROOT, 0):
            return 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._walk(ctx + n - mid, mid, &nd, &o) and self._continues(nd, o):
                lo = mid
                node[0] = nd
                off[0] = o
            else:
                hi = mid - 1
        return lo

    cdef double draft(self, vector[int32_t] & ctx, int kmax, int n_max, double min_prob,
                      double factor, double offset, vector[int32_t] & out) noexcept:
        """Greedy most-frequent path after the longest match; appends it to ``out`` and to
        ``ctx``; returns the sum of the path probabilities (expected accepted tokens)."""
        out.clear()
        cdef int32_t node, b, tok
        cdef int off, m, denom
        cdef double p = 1.0, score = 0.0
        m = self._longest(ctx.data(), <int>ctx.size(), kmax, &node, &off)
        if m == 0:
            return 0.0
        cdef double capf = m * factor + offset + 1e-6
        cdef int cap = n_max if capf >= n_max else <int>capf
        while <int>out.size() < cap:
            if off < self.nodes[node].length:
                # inside an edge every occurrence goes on with the same token
                tok = self._tok(self.nodes[node].ref_seq, self.nodes[node].ref_idx + off)
                off += 1
            else:
                denom = self.nodes[node].count - self.nodes[node].n_end
                if denom <= 0:
                    # no occurrence goes on (the depth limit, or the history's own end):
                    # back off to the longest shorter context that does
                    m = self._longest(ctx.data(), <int>ctx.size(), kmax, &node, &off)
                    if m == 0:
                        break
                    continue
                b = self._best(node)
                p *= <double>self.nodes[b].count / denom
                node = b
                off = 1
                tok = self.nodes[b].tok
            if p < min_prob:
                break
            out.push_back(tok)
            ctx.push_back(tok)
            score += p
        return score

    cdef int64_t count_of(self, const int32_t * s, int n) noexcept:
        cdef int32_t node
        cdef int off
        if n > self.depth or not self._walk(s, n, &node, &off):
            return 0
        return self.nodes[node].count

    # --- debugging -----------------------------------------------------------------------

    cdef str check(self):
        """Every invariant, recomputed by brute force; '' when the tree is sound (for tests)."""
        cdef int32_t x, y, nd, sid
        cdef int64_t total, reached = 0, i, L, j, end
        cdef int off, k
        cdef unordered_map[int32_t, int64_t] visits
        cdef unordered_map[int32_t, int64_t] depth_of
        cdef vector[int32_t] stack, path
        cdef unordered_map[uint64_t, int32_t].iterator it
        stack.push_back(ROOT)
        depth_of[ROOT] = 0
        while not stack.empty():
            x = stack.back()
            stack.pop_back()
            reached += 1
            total = self.nodes[x].n_end
            y = self.nodes[x].first_child
            k = 0
            while y != NONE:
                if self.nodes[y].parent != x:
                    return f"node {y}: parent {self.nodes[y].parent}, expected {x}"
                if self._child(x, self.nodes[y].tok) != y:
                    return f"node {y}: edge map does not lead to it"
                if self.nodes[y].count >= self.nodes[x].count and x != ROOT:
                    return f"node {y}: count {self.nodes[y].count} not below parent's"
                if self.nodes[x].best >= 0 and self.nodes[y].count > self.nodes[self.nodes[x].best].count:
                    return f"node {x}: best child is not the most frequent"
                total += self.nodes[y].count
                depth_of[y] = depth_of[x] + self.nodes[y].length
                stack.push_back(y)
                k += 1
                y = self.nodes[y].next_sib
            if total != self.nodes[x].count:
                return f"node {x}: count {self.nodes[x].count} != ends + children {total}"
            if (k == 0) != (self.nodes[x].best == NONE):
                return f"node {x}: best {self.nodes[x].best} with {k} children"
            if x == ROOT:
                continue
            if self.nodes[x].length < 1 or self.nodes[x].count < 1:
                return f"node {x}: length {self.nodes[x].length}, count {self.nodes[x].count}"
            if k == 1 and self.nodes[x].n_end == 0:
                return f"node {x}: one child and no ending suffix (not merged)"
            if depth_of[x] > self.depth:
                return f"node {x}: deeper than {self.depth}"
            sid = self.nodes[x].ref_seq
            if sid < self.base or sid >= self.base + <int32_t>self.seqs.size():
                return f"node {x}: reference to sequence {sid}, which is gone"
            L = self.seqs[sid - self.base].size()
            j = self.nodes[x].ref_idx + self.nodes[x].length - depth_of[x]
            if j < 0 or self.nodes[x].ref_idx + self.nodes[x].length > L:
                return f"node {x}: reference out of its sequence"
            if self.nodes[x].tok != self._tok(sid, self.nodes[x].ref_idx):
                return f"node {x}: first token differs from its reference"
            # the reference's whole path from the root leads exactly to x's end
            if not self._walk(&self.seqs[sid - self.base][j], depth_of[x], &nd, &off) \
                    or nd != x or off != self.nodes[x].length:
                return f"node {x}: its reference does not spell its path"
        if reached != self.n_nodes or <int64_t>self.edges.size() != self.n_nodes - 1:
            return f"{reached} nodes reachable, {self.n_nodes} live, {self.edges.size()} edges"
        # every suffix of every sequence ends at a node end; visit counts are the counts
        total = 0
        for k in range(<int>self.seqs.size()):
            L = self.seqs[k].size()
            total += L
            for i in range(L):
                end = min(i + self.depth, L)
                if not self._walk(&self.seqs[k][i], end - i, &nd, &off):
                    return f"suffix {i} of sequence {k + self.base} is missing"
                if off != self.nodes[nd].length:
                    return f"suffix {i} of sequence {k + self.base} ends inside an edge"
                # count the nodes on its path
                while nd != ROOT:
                    visits[nd] += 1
                    nd = self.nodes[nd].parent
        if total != self.n_tokens or total != self.nodes[ROOT].count:
            return f"{total} tokens stored, n_tokens {self.n_tokens}, root count {self.nodes[ROOT].count}"
        for kv in depth_of:
            if kv.first != ROOT and visits[kv.first] != self.nodes[kv.first].count:
                return f"node {kv.first}: count {self.nodes[kv.first].count}, {visits[kv.first]} suffixes"
        return ""


cdef class SuffixDrafter(Drafter):
    """SuffixDrafter(max_depth=64, *, min_prob=0.1, spec_factor=1.0, spec_offset=0.0, max_corpus_tokens=100_000, name="suffix")
--

    Suffix decoding.

    ``max_depth`` (64): the longest context matched; the trees index suffixes of up to
    ``max_depth + 1`` tokens. ``min_prob`` (0.1): stop drafting when the estimated
    probability of the whole draft falls below it (``Decoder(p_min=...)`` overrides it
    when set). ``spec_factor`` (1.0) and ``spec_offset`` (0.0): at most
    ``spec_factor * match_length + spec_offset`` tokens, so a short match, which says
    little, drafts little (Arctic Inference's ``max_spec_factor``/``max_spec_offset``).
    ``max_corpus_tokens`` (100000): size of the global corpus of earlier generations
    and ``add_corpus`` documents, oldest evicted first; 0 turns it off.

    Drafts are returned as plain tokens (one-hot draft distributions). The empirical
    frequencies are not valid as ``q`` for rejection sampling: the drafter does not
    sample its token from them but takes the most frequent one, and the match length,
    the stopping rule and the choice between the two trees all depend on the counts,
    so the token's real distribution given the context is a point mass. Accepting
    with ``min(1, p/q)`` for a q that is not the proposal's distribution would bias
    the output; with one-hot ``q`` sampled verification stays exact (accept with
    p(token), else sample from p without it).
    """
    cdef readonly int max_depth
    cdef readonly double min_prob
    cdef readonly double spec_factor
    cdef readonly double spec_offset
    cdef readonly int64_t max_corpus_tokens
    cdef _Tree corpus
    cdef list local                  # per sequence: _Tree over its prompt and accepted tokens
    cdef vector[int] gen_start       # per sequence: where its generation starts in hist
    cdef int32_t corpus_max_tok
    cdef vector[int32_t] ctx, draft_a, draft_b

    def __init__(self, max_depth=64, *, min_prob=0.1, spec_factor=1.0, spec_offset=0.0,
                 max_corpus_tokens=100_000, name="suffix"):
        super().__init__(name)
        max_depth = int(max_depth)
        if not 1 <= max_depth <= 1024:
            raise ValueError(f"max_depth must be in 1..1024, got {max_depth}")
        for k, v in (("min_prob", min_prob), ("spec_factor", spec_factor),
                     ("spec_offset", spec_offset)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{k} must be a finite number >= 0, got {v!r}")
        if min_prob > 1:
            raise ValueError(f"min_prob must be in [0, 1], got {min_prob}")
        if isinstance(max_corpus_tokens, bool) or not isinstance(max_corpus_tokens, numbers.Integral) \
                or max_corpus_tokens < 0:
            raise ValueError(f"max_corpus_tokens must be an int >= 0, got {max_corpus_tokens!r}")
        self.max_depth = max_depth
        self.min_prob = min_prob
        self.spec_factor = spec_factor
        self.spec_offset = spec_offset
        self.max_corpus_tokens = max_corpus_tokens
        self.corpus = _Tree(max_depth + 1)
        self.corpus_max_tok = -1
        self.local = []

    def configure(self, spec):
        """The decoder's ``p_min``, when set, is the stopping probability."""
        p_min = getattr(spec, "p_min", 0.0)
        if p_min:
            self.min_prob = float(p_min)

    # --- the hooks -----------------------------------------------------------------------

    cdef int bind_c(self, Context target, int n_seq) except -1:
        Drafter.bind_c(self, target, n_seq)
        if self.corpus_max_tok >= self.n_vocab:
            raise ValueError(f"the corpus of drafter {self.name!r} has token id {self.corpus_max_tok}, "
                             f"outside this model's vocabulary of {self.n_vocab}")
        return 0

    cdef _Tree _local(self, int seq):
        while len(self.local) <= seq:
            t = _Tree(self.max_depth + 1)
            (<_Tree>t).start_seq()
            self.local.append(t)
        if <int>self.gen_start.size() <= seq:
            self.gen_start.resize(seq + 1, 0)
        return <_Tree>self.local[seq]

    cdef int begin_c(self, int seq, const int32_t * toks, int n) except -1:
        self._commit(seq)
        Drafter.begin_c(self, seq, toks, n)
        cdef _Tree t = self._local(seq)
        t.clear()
        t.start_seq()
        self.gen_start[seq] = n
        return 0

    cdef int observe_c(self, int seq, const int32_t * toks, int n, int row0) except -1:
        Drafter.observe_c(self, seq, toks, n, row0)
        cdef _Tree t = self._local(seq)
        cdef int i
        for i in range(n):
            t.append(toks[i])
        return 0

    cdef int reset_c(self, int seq) except -1:
        self._commit(seq)
        Drafter.reset_c(self, seq)
        if seq < len(self.local):
            t = self._local(seq)
            (<_Tree>t).clear()
            (<_Tree>t).start_seq()
            self.gen_start[seq] = 0
        return 0

    cdef int propose_c(self, int seq, int32_t last, int n_max, Draft out) except -1:
        out.clear()
        if n_max <= 0 or seq < 0:
            return 0
        # context: the last max_depth - 1 accepted tokens and the pending one
        self.ctx.clear()
        cdef vector[int32_t] * h
        cdef int i, n0
        if seq < <int>self.hist.size():
            h = &self.hist[seq]
            for i in range(max(0, <int>h.size() - (self.max_depth - 1)), <int>h.size()):
                self.ctx.push_back(h[0][i])
        self.ctx.push_back(last)
        n0 = self.ctx.size()
        cdef double sa = 0.0, sb = 0.0
        self.draft_a.clear()
        self.draft_b.clear()
        if seq < len(self.local):
            sa = (<_Tree>self.local[seq]).draft(self.ctx, self.max_depth, n_max, self.min_prob,
                                                self.spec_factor, self.spec_offset, self.draft_a)
            self.ctx.resize(n0)
        if self.corpus.n_tokens > 0:
            sb = self.corpus.draft(self.ctx, self.max_depth, n_max, self.min_prob,
                                   self.spec_factor, self.spec_offset, self.draft_b)
        if sb > sa:
            out.tokens = self.draft_b
        else:
            out.tokens = self.draft_a
        return 0

    # --- the global corpus ---------------------------------------------------------------

    cdef int _commit(self, int seq) except -1:
        """Add the generation of ``seq``'s last request to the corpus (once)."""
        if seq < 0 or seq >= <int>self.hist.size() or seq >= <int>self.gen_start.size():
            return 0
        cdef vector[int32_t] * h = &self.hist[seq]
        cdef int start = self.gen_start[seq]
        if <int>h.size() - start >= 2:
            self._add_c(h.data() + start, <int>h.size() - start)
        self.gen_start[seq] = h.size()
        return 0

    cdef void _add_c(self, const int32_t * toks, int64_t n) noexcept:
        if self.max_corpus_tokens <= 0 or n < 2:
            return
        if n > self.max_corpus_tokens:
            toks += n - self.max_corpus_tokens
            n = self.max_corpus_tokens
        while self.corpus.n_tokens + n > self.max_corpus_tokens:
            self.corpus.pop_front()
        self.corpus.add_seq(toks, <int>n)
        cdef int64_t i
        for i in range(n):
            if toks[i] > self.corpus_max_tok:
                self.corpus_max_tok = toks[i]

    def add_corpus(self, docs):
        """Add documents (token id lists, or text when bound to a model) to the global
        corpus, each as its own sequence, evicting the oldest as needed."""
        if isinstance(docs, (str, bytes)) or (hasattr(docs, "__len__") and len(docs)
                                              and isinstance(docs[0], numbers.Integral)):
            docs = [docs]
        cdef vector[int32_t] v
        lim = self.n_vocab if self.target is not None else 0x7FFFFFFF
        for d in docs:
            if isinstance(d, (str, bytes)):
                if self.target is None:
                    raise TypeError("text documents need a bound model to tokenize them; "
                                    "pass token ids or add them after binding")
                d = self.target.model.tokenize(d, add_special=False)
            v.clear()
            for t in d:
                if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < lim:
                    raise ValueError(f"corpus token {t!r} is not a token id in [0, {lim})")
                v.push_back(t)
            self._add_c(v.data(), v.size())

    def finish(self, int seq=0):
        """Add ``seq``'s generation so far to the corpus now (``begin``/``reset`` do it anyway)."""
        self._commit(seq)

    def clear_corpus(self):
        self.corpus.clear()
        self.corpus_max_tok = -1

    @property
    def corpus_tokens(self) -> int:
        return self.corpus.n_tokens

    @property
    def corpus_sequences(self) -> int:
        return self.corpus.seqs.size()

    def tree_nodes(self, int seq=-1) -> int:
        """Live nodes of ``seq``'s tree, or of the corpus tree for ``seq=-1``."""
        return self._tree(seq).n_nodes

    # --- for tests -----------------------------------------------------------------------

    cdef _Tree _tree(self, int seq):
        if seq < 0:
            return self.corpus
        if seq >= len(self.local):
            raise IndexError(f"no sequence {seq}")
        return <_Tree>self.local[seq]

    def _count(self, tokens, int seq=-1) -> int:
        """Occurrences of ``tokens`` (at most max_depth + 1 long) according to the tree."""
        cdef vector[int32_t] v = [int(t) for t in tokens]
        return self._tree(seq).count_of(v.data(), v.size())

    def _check(self, int seq=-1):
        err = self._tree(seq).check()
        if err:
            raise AssertionError(f"suffix tree of {'corpus' if seq < 0 else seq}: {err}")


register("suffix")(SuffixDrafter)
