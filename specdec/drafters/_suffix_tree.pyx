# cython: language_level=3
# distutils: language = c++
"""A depth-limited compressed suffix tree with counts (the suffix drafter's index).

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

Its invariants are recomputed by brute force in ``specdec.drafters._test_hooks``
(tests only).
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref


cdef class SuffixTree:
    """A depth-limited compressed suffix tree over a FIFO of token sequences.

    Invariants (recomputed by ``_test_hooks.check_suffix_tree``): a node's count is its ``n_end`` plus its
    children's counts; suffixes end only at node ends, so every point inside an
    edge has the node's count and a single continuation; no node other than the
    root has one child and no ending suffix (such chains are merged); and a
    node's ``ref_seq`` is the newest sequence whose suffixes reach it. The last one
    is what makes FIFO eviction simple: when the oldest sequence is removed, every
    node still referring to it had only its suffixes and disappears with them.
    Only the newest sequence may grow, so sequences are added whole to the corpus.
    """

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

    cdef void _release(self, int32_t x) noexcept:
        self.nodes[x].parent = NONE
        self.nodes[x].count = 0
        self.free_ids.push_back(x)
        self.n_nodes -= 1

    cdef int32_t _tok(self, int32_t sid, int32_t idx) noexcept:
        return self.seqs[sid - self.base][idx]

    cdef int32_t _child(self, int32_t p, int32_t tok) noexcept:
        cdef unordered_map[uint64_t, int32_t].iterator it = self.edges.find(_key(p, tok))
        if it == self.edges.end():
            return NONE
        return deref(it).second

    cdef void _bump_best(self, int32_t p, int32_t c) noexcept:
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

    cdef bint _continues(self, int32_t node, int off) noexcept:
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
