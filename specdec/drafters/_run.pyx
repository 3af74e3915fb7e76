# cython: language_level=3
# distutils: language = c++
"""Python entry points to a drafter's C hooks, for code that drives a drafter by hand.

The controller calls a drafter's C hooks (``begin_c`` ... ``reset_c``), which apply the
dispatch rule (a Python override is always honoured, else the drafter's C implementation
runs: ``_base.pyx``). Python code that stands where the controller does calls them through
these: ``guard.py`` runs the drafter it guards so, and tests drive a drafter exactly as a
round would. Apart from ``_base.pyx`` because they are no part of the interface a drafter
implements, only a way to reach it from Python.
"""
from libc.stdint cimport int32_t
from libcpp.vector cimport vector

from ._base cimport Asks, Draft, Drafter


def run_begin(Drafter d not None, int seq, prompt_tokens):
    cdef vector[int32_t] v = [int(t) for t in prompt_tokens]
    d._grow(seq)
    d.begin_c(seq, v.data(), v.size())


def run_observe(Drafter d not None, int seq, tokens, int row0=-1):
    cdef vector[int32_t] v = [int(t) for t in tokens]
    d._grow(seq)
    d.observe_c(seq, v.data(), v.size(), row0)


def run_propose(Drafter d not None, int seq, int last, int n_max) -> list:
    cdef Draft out = Draft()
    d.propose_c(seq, last, n_max, out)
    return out.token_list


def run_propose_batch(Drafter d not None, seqs, lasts, n_maxs, p_stops=None) -> list:
    """The drafts of ``seqs`` as the controller asks for them (one batch hook call), each
    under its confidence floor ``p_stops[j]`` (None: none)."""
    cdef Asks asks = Asks()
    cdef int j
    if not len(seqs) == len(lasts) == len(n_maxs):
        raise ValueError("one last token and one n_max per sequence")
    if p_stops is None:
        p_stops = [0.0] * len(seqs)
    for j in range(len(seqs)):
        d._grow(seqs[j])
        asks.add(seqs[j], lasts[j], n_maxs[j], p_stops[j], Draft())
    d.propose_batch_c(asks)
    return [(<Draft> x).token_list for x in asks.drafts]


def run_accept(Drafter d not None, int seq, int n_accepted):
    d.accept_c(seq, n_accepted)


def run_reset(Drafter d not None, int seq):
    d.reset_c(seq)
