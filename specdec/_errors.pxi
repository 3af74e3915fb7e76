# Part of _core (included by _core.pyx): the core's exceptions, and llama.cpp's aborts
# turned into them.

class LlamaAbortError(RuntimeError):
    """llama.cpp aborted (``GGML_ASSERT`` / ``GGML_ABORT``) inside a call made on this thread.

    The abort was turned into this exception instead of ending the process; the
    object that was being built or used (a context) is freed and refuses further
    use. ``llama_message`` is llama.cpp's own message (file, line, condition).
    """

    def __init__(self, what: str, llama_message: str = ""):
        super().__init__(f"{what}: llama.cpp aborted: {llama_message}" if llama_message else what)
        self.llama_message = llama_message


cdef int _raise_abort(str what) except -1:
    """Raise LlamaAbortError when the last guarded call aborted (the tokenizer: the vocabulary
    is only read, so the Model stays usable)."""
    aborted = _take_abort()
    if aborted is not None:
        raise LlamaAbortError(what, aborted)
    return 0


cdef object _take_abort():
    """llama.cpp's message when the last guarded call on this thread aborted, else None."""
    cdef string msg
    if sd_abort_take(msg):
        return msg.decode("utf-8", "replace")
    return None


class RPCError(RuntimeError):
    """An RPC server failed, vanished or did not answer in time (``rpc_timeout``).

    The model that used it, and every context on it, can no longer be used: load the model
    again. Its llama.cpp objects are left allocated (freeing them would need the server)."""


class ContextFullError(ValueError):
    """The sequence would grow past the context size (``n_ctx``)."""


class DecodeError(RuntimeError):
    """llama.cpp refused or failed a decode; the context stays usable."""


class DecodeTimeoutError(DecodeError):
    """A decode ran past the watchdog's limit (``Context.decode_timeout``) and was stopped
    between graph nodes; the context stays usable, the decode's tokens are not in it."""


class ContextBusyError(RuntimeError):
    """A context (or model) was used from a second thread while in use."""
