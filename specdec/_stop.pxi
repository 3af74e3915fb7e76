# Part of _core (included by _core.pyx): stopping a llama.cpp call midway.
#
# llama.cpp asks a callback between graph nodes (a decode) and between load steps (a model)
# whether to stop; both read one ``sd_stop_flag`` (``_interrupt.h``): ``Context.interrupt``, a
# SIGINT on the main thread, or the decode watchdog's deadline. The watchdog is here: a graph
# that never finishes is an error (``DecodeTimeoutError``), not a hang.

#: the decode watchdog (Context.decode_timeout = 0): a decode may take this many times what
#: the context's slowest decode so far would take for its tokens, and at least WATCHDOG_MIN_S;
#: before any decode has finished, WATCHDOG_FIRST_S. Checked between graph nodes.
cdef double WATCHDOG_FACTOR = 100.0
cdef double WATCHDOG_MIN_S = 30.0
cdef double WATCHDOG_FIRST_S = 600.0


cdef cbool _abort_cb(void * data) noexcept nogil:
    return sd_stop_now(<const sd_stop_flag *> data)


cdef cbool _load_progress(float progress, void * data) noexcept nogil:
    return not sd_stop_now(<const sd_stop_flag *> data)


cdef inline double _watchdog_limit(Context self, int n) noexcept:
    """Seconds a decode of ``n`` tokens may run: ``decode_timeout`` when set, else
    WATCHDOG_FACTOR times what this context's slowest decode so far would take (at least
    WATCHDOG_MIN_S), or WATCHDOG_FIRST_S before any decode has finished."""
    if self.decode_timeout > 0:
        return self.decode_timeout
    if self._s_per_token <= 0:
        return WATCHDOG_FIRST_S
    return max(WATCHDOG_MIN_S, WATCHDOG_FACTOR * self._s_per_token * n)


cdef inline double _arm_watchdog(Context self, int n) noexcept:
    cdef double t = sd_monotonic_s()
    self._stop.deadline = t + _watchdog_limit(self, n) if self.decode_timeout >= 0 else 0
    return t


cdef inline double _disarm_watchdog(Context self, double t_start, int n, int rc) noexcept:
    """Learn this decode's rate; returns the limit when the watchdog stopped it, else 0."""
    cdef double dt = sd_monotonic_s() - t_start
    cdef double limit = self._stop.deadline - t_start
    cdef bint hit = rc != 0 and self._stop.deadline > 0 and sd_past_deadline(&self._stop)
    self._stop.deadline = 0
    if rc == 0 and n > 0:
        self._s_per_token = max(self._s_per_token, dt / n)
    return limit if hit else 0
