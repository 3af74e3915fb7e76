# cython: language_level=3
"""The depth-limited suffix tree behind the suffix drafter (see _suffix_tree.pyx)."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp.deque cimport deque
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

cimport cython


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


@cython.final
cdef class SuffixTree:
    cdef int depth                       # longest suffix indexed (max_depth + 1)
    cdef vector[Node] nodes
    cdef vector[int32_t] free_ids
    cdef unordered_map[uint64_t, int32_t] edges   # (parent, first token) -> child
    cdef deque[vector[int32_t]] seqs
    cdef int32_t base                    # id of seqs.front()
    cdef int64_t n_tokens
    cdef int64_t n_nodes
    cdef deque[int32_t] active           # where the newest sequence's short suffixes end, longest first

    cdef void clear(self) noexcept
    cdef int32_t _alloc(self) noexcept
    cdef void _release(self, int32_t x) noexcept
    cdef int32_t _tok(self, int32_t sid, int32_t idx) noexcept
    cdef int32_t _child(self, int32_t p, int32_t tok) noexcept
    cdef void _bump_best(self, int32_t p, int32_t c) noexcept
    cdef int32_t _best(self, int32_t p) noexcept
    cdef void _link(self, int32_t p, int32_t c) noexcept
    cdef void _unlink(self, int32_t p, int32_t c) noexcept
    cdef void _replace(self, int32_t p, int32_t old, int32_t new) noexcept
    cdef void start_seq(self) noexcept
    cdef void append(self, int32_t t) noexcept
    cdef int32_t _extend(self, int32_t a, int32_t t, int32_t sid, int32_t n) noexcept
    cdef void add_seq(self, const int32_t * toks, int n) noexcept
    cdef void pop_front(self) noexcept
    cdef void _free_subtree(self, int32_t c) noexcept
    cdef void _maybe_merge(self, int32_t x) noexcept
    cdef bint _walk(self, const int32_t * s, int n, int32_t * out_node, int * out_off) noexcept
    cdef bint _continues(self, int32_t node, int off) noexcept
    cdef int _longest(self, const int32_t * ctx, int n, int kmax, int32_t * node, int * off) noexcept
    cdef double draft(self, vector[int32_t] & ctx, int kmax, int n_max, double min_prob,
                      double factor, double offset, vector[int32_t] & out) noexcept
