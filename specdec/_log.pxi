# Part of _core (included by _core.pyx): llama.cpp's log in Python logging, and what C
# callbacks had to hold back (KeyboardInterrupt, SystemExit) raised once the C call is over.

_log = logging.getLogger("specdec.llama")
_log.addHandler(logging.NullHandler())
_LEVELS = {GGML_LOG_LEVEL_DEBUG: logging.DEBUG, GGML_LOG_LEVEL_INFO: logging.DEBUG,
           GGML_LOG_LEVEL_WARN: logging.WARNING, GGML_LOG_LEVEL_ERROR: logging.ERROR}
_log_state = {"level": logging.DEBUG, "parts": []}
# recent warnings and errors, quoted in exceptions so a failed load says why
_recent = collections.deque(maxlen=8)
_recent_lock = threading.Lock()


@cython.wraparound(True)
def _emit(int level, bytes text):
    if level != GGML_LOG_LEVEL_CONT:
        _log_state["level"] = _LEVELS.get(level, logging.DEBUG)
    parts = _log_state["parts"]
    parts.append(text.decode("utf-8", "replace"))
    if not parts[-1].endswith("\n"):
        return
    msg = "".join(parts).rstrip("\n")
    parts.clear()
    lvl = _log_state["level"]
    if lvl >= logging.WARNING:
        with _recent_lock:
            _recent.append(msg.strip())
    if _log.isEnabledFor(lvl):
        _log.log(lvl, "%s", msg)


# set at interpreter exit: objects freed then (on specdec's helper threads too) log without
# Python, whose finalizing runtime ends any thread that asks for the GIL
cdef bint _exiting = False


def _at_exit():
    global _exiting
    _exiting = True


atexit.register(_at_exit)


#: KeyboardInterrupt / SystemExit raised in Python code that a C callback ran: the callback
#: cannot raise it, so it stops the C call (``sd_sigint_note``) and the core raises it after
_pending = []


cdef void _log_callback(ggml_log_level level, const char * text, void * ud) noexcept nogil:
    # no ``with gil`` in this function: Cython then takes the GIL on every return, the early
    # one at exit included, and a helper thread asking for it at exit is ended (std::terminate)
    if not _exiting:
        _log_with_gil(level, text)


cdef void _log_with_gil(ggml_log_level level, const char * text) noexcept with gil:
    try:
        _emit(<int>level, <bytes>text)
    except Exception:
        pass    # a broken log handler must not fail the llama.cpp call that logged
    except BaseException as e:
        _pending.append(e)
        sd_sigint_note()


cdef int _raise_pending() except -1:
    """Raise what a callback had to hold back, then any signal Python has not handled yet."""
    if _pending:
        e = _pending[0]
        _pending.clear()
        raise e
    PyErr_CheckSignals()
    return 0


_MAIN_THREAD = threading.main_thread().ident


cdef bint _watch_sigint():
    """Whether a SIGINT should stop the C call about to start (``_interrupt.h``): on the main
    thread, while Python's handler is the one that raises KeyboardInterrupt."""
    return (threading.get_ident() == _MAIN_THREAD
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)


cdef void _stop_begin(sd_stop_flag * f):
    f.watch = _watch_sigint()
    f.since = sd_sigint_watch_begin() if f.watch else 0


cdef void _stop_end(sd_stop_flag * f):
    if f.watch:
        sd_sigint_watch_end()
        f.watch = False


@cython.wraparound(True)
def _recent_errors():
    with _recent_lock:
        msgs = [m for m in _recent if m]
        _recent.clear()
    return "; ".join(msgs[-3:])


def _clear_recent():
    with _recent_lock:
        _recent.clear()


llama_log_set(_log_callback, NULL)
llama_backend_init()
sd_abort_install()
