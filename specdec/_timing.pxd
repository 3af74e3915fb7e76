# cython: language_level=3
"""Where a round's time goes: each interval of a round is added to exactly one part.

Header-only (inline functions): the controller and the verifier share one ``Clock``.
"""
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef enum Part:
    T_TARGET = 0     # the target's decode (llama.cpp)
    T_HEAD = 1       # the lazy LM head's passes (logits of the rows verification reads)
    T_DRAFT = 2      # drafters: proposing, and observing / accepting what was kept
    T_VERIFY = 3     # accept / reject (argmax, rejection sampling) and the rollback
    T_CONTROL = 4    # the controller itself: batches, policy, emitting text, stop strings
    N_PARTS = 5


cdef struct Clock:
    double part[5]   # seconds per Part, summed over the rounds
    double mark      # end of the last interval added to ``part``


cdef inline double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline double lap(Clock * c, int part) noexcept nogil:
    """Add the time since the last lap to ``part``; returns it."""
    cdef double t = now(), dt = t - c.mark
    c.part[part] += dt
    c.mark = t
    return dt
