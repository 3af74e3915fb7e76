# cython: language_level=3
"""The draft-length policy's time estimates: each the average of its samples, kept as the
policy needs it on a shared machine (see ``_policy.pyx``).

Header-only (inline functions): the policy's verify times by length and drafter times by cap
share these rules; ``_policy.pyx`` keeps what it decides with them.
"""
from libcpp.vector cimport vector

DEF EMA = 0.15            # time averages


cdef inline double sample_weight(double n) noexcept:
    """Weight of the next sample after ``n``: the mean of the first ones, then the EMA's."""
    return max(EMA, 1.0 / (n + 1.0))


cdef inline void add_time_sample(vector[double] & t, vector[double] & n, int i, double x) noexcept:
    """A time sample ``x`` into the average ``t[i]``; ``n[i]`` counts.

    The first three samples give their smallest, then the EMA takes over with each sample
    clipped at twice the estimate: one slow first decode, or a preemption, must not set a
    baseline that the rare plain rounds then take dozens of rounds to correct. The smallest,
    not the mean: load only ever slows a sample down, and the two errors are not alike. A
    time estimated too low is corrected as soon as that length is used; one estimated too
    high (a preempted sample among the first, 5x) makes the length look as if it does not
    pay, so it is not used, not measured again, and the estimate stays (a drafter that pays
    1.2x plain was switched off for good this way)."""
    if n[i] >= 3 and x > 2.0 * t[i]:
        x = 2.0 * t[i]
    if n[i] == 0 or (n[i] < 3 and x < t[i]):
        t[i] = x
    elif n[i] >= 3:
        t[i] = t[i] + sample_weight(n[i]) * (x - t[i])
    n[i] += 1


cdef inline void add_time_sample_ref(vector[double] & t, vector[double] & ref,
                                     vector[double] & n, int i, double x, double plain) noexcept:
    """``add_time_sample`` of a sample ``x`` into ``t[i]``, and with the same weights the
    plain-round time ``plain`` of that moment into ``ref[i]`` (``plain`` 0: none measured yet)."""
    cdef double n0 = n[i], t0 = t[i]
    add_time_sample(t, n, i, x)
    if plain <= 0.0:
        return
    if n0 < 3:      # the smallest of the first samples: the plain time of its moment
        if n0 == 0 or t[i] != t0 or ref[i] <= 0.0:
            ref[i] = plain
        return
    ref[i] = plain if ref[i] <= 0.0 else ref[i] + sample_weight(n0) * (plain - ref[i])
