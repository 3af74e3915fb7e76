# cython: language_level=3
# distutils: language = c++
"""Test-only hooks into the built-in drafters; specdec itself never imports this module.

* ``ChainedHeadsMtpDrafter``: the MTP drafter chaining ``chain_heads`` copies of a
  model's single head, so the chained-heads path runs on a one-head model;
* ``check_suffix_tree``: every invariant of a suffix drafter's tree, recomputed by
  brute force; ``suffix_count``: occurrences of a string according to the tree.
"""
from libc.stdint cimport int32_t, int64_t, uint64_t
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

from .._core cimport Model
from ._suffix_tree cimport SuffixTree, ROOT, NONE, DIRTY, _key
from .mtp cimport MtpDrafter
from .suffix cimport SuffixDrafter


cdef class ChainedHeadsMtpDrafter(MtpDrafter):
    """ChainedHeadsMtpDrafter(path=None, *, chain_heads=2, **options)
--

    ``MtpDrafter`` whose single head is applied as ``chain_heads`` chained heads."""
    cdef int chain

    def __init__(self, path=None, *, chain_heads=2, **options):
        super().__init__(path, **options)
        self.chain = int(chain_heads)

    cdef int _head_count(self, Model mm) except -1:
        return mm.n_mtp_layers if mm.n_mtp_layers > 1 else max(1, self.chain)


def suffix_count(SuffixDrafter d not None, tokens, int seq=-1) -> int:
    """Occurrences of ``tokens`` (at most max_depth + 1 long) in ``seq``'s tree (-1: corpus)."""
    cdef vector[int32_t] v = [int(x) for x in tokens]
    cdef SuffixTree t = d._tree(seq)
    cdef int32_t node
    cdef int off
    if <int>v.size() > t.depth or not t._walk(v.data(), v.size(), &node, &off):
        return 0
    return t.nodes[node].count


def check_suffix_tree(SuffixDrafter d not None, int seq=-1) -> None:
    """Raise ``AssertionError`` unless ``seq``'s tree (-1: the corpus tree) is sound."""
    err = _check(d._tree(seq))
    if err:
        raise AssertionError(f"suffix tree of {'corpus' if seq < 0 else seq}: {err}")


cdef str _check(SuffixTree t):
    """Every invariant of ``t``, recomputed by brute force; '' when the tree is sound."""
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
        total = t.nodes[x].n_end
        y = t.nodes[x].first_child
        k = 0
        while y != NONE:
            if t.nodes[y].parent != x:
                return f"node {y}: parent {t.nodes[y].parent}, expected {x}"
            if t._child(x, t.nodes[y].tok) != y:
                return f"node {y}: edge map does not lead to it"
            if t.nodes[y].count >= t.nodes[x].count and x != ROOT:
                return f"node {y}: count {t.nodes[y].count} not below parent's"
            if t.nodes[x].best >= 0 and t.nodes[y].count > t.nodes[t.nodes[x].best].count:
                return f"node {x}: best child is not the most frequent"
            total += t.nodes[y].count
            depth_of[y] = depth_of[x] + t.nodes[y].length
            stack.push_back(y)
            k += 1
            y = t.nodes[y].next_sib
        if total != t.nodes[x].count:
            return f"node {x}: count {t.nodes[x].count} != ends + children {total}"
        if (k == 0) != (t.nodes[x].best == NONE):
            return f"node {x}: best {t.nodes[x].best} with {k} children"
        if x == ROOT:
            continue
        if t.nodes[x].length < 1 or t.nodes[x].count < 1:
            return f"node {x}: length {t.nodes[x].length}, count {t.nodes[x].count}"
        if k == 1 and t.nodes[x].n_end == 0:
            return f"node {x}: one child and no ending suffix (not merged)"
        if depth_of[x] > t.depth:
            return f"node {x}: deeper than {t.depth}"
        sid = t.nodes[x].ref_seq
        if sid < t.base or sid >= t.base + <int32_t>t.seqs.size():
            return f"node {x}: reference to sequence {sid}, which is gone"
        L = t.seqs[sid - t.base].size()
        j = t.nodes[x].ref_idx + t.nodes[x].length - depth_of[x]
        if j < 0 or t.nodes[x].ref_idx + t.nodes[x].length > L:
            return f"node {x}: reference out of its sequence"
        if t.nodes[x].tok != t._tok(sid, t.nodes[x].ref_idx):
            return f"node {x}: first token differs from its reference"
        # the reference's whole path from the root leads exactly to x's end
        if not t._walk(&t.seqs[sid - t.base][j], depth_of[x], &nd, &off) \
                or nd != x or off != t.nodes[x].length:
            return f"node {x}: its reference does not spell its path"
    if reached != t.n_nodes or <int64_t>t.edges.size() != t.n_nodes - 1:
        return f"{reached} nodes reachable, {t.n_nodes} live, {t.edges.size()} edges"
    # every suffix of every sequence ends at a node end; visit counts are the counts
    total = 0
    for k in range(<int>t.seqs.size()):
        L = t.seqs[k].size()
        total += L
        for i in range(L):
            end = min(i + t.depth, L)
            if not t._walk(&t.seqs[k][i], end - i, &nd, &off):
                return f"suffix {i} of sequence {k + t.base} is missing"
            if off != t.nodes[nd].length:
                return f"suffix {i} of sequence {k + t.base} ends inside an edge"
            # count the nodes on its path
            while nd != ROOT:
                visits[nd] += 1
                nd = t.nodes[nd].parent
    if total != t.n_tokens or total != t.nodes[ROOT].count:
        return f"{total} tokens stored, n_tokens {t.n_tokens}, root count {t.nodes[ROOT].count}"
    for kv in depth_of:
        if kv.first != ROOT and visits[kv.first] != t.nodes[kv.first].count:
            return f"node {kv.first}: count {t.nodes[kv.first].count}, {visits[kv.first]} suffixes"
    return ""
