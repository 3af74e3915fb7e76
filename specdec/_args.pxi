# Part of _core (included by _core.pyx): argument checks of the Python API. A C conversion
# would wrap or overflow, and llama.cpp would assert, where these raise a clear error.

cdef _check_positive(str name, value):
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    if value > I32_MAX:
        raise ValueError(f"{name}={value} is too large")
    return value


cdef object _int_arg(str name, value, long long lo, long long hi):
    """An int argument in [lo, hi]: TypeError for a non-int, ValueError out of range
    (a C conversion would raise OverflowError, or wrap)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value} out of range [{lo}, {hi}]")
    return int(value)


cdef enum:
    I32_MAX = 2147483647
    I32_MIN = -2147483648


cdef _check_threads(n_threads, n_threads_batch):
    # ggml sizes per-thread buffers up front: a huge count ends in std::bad_alloc -> abort
    if n_threads > 512 or n_threads_batch > 512:
        raise ValueError(f"at most 512 threads (GGML_MAX_N_THREADS), got {n_threads} / "
                         f"{n_threads_batch}")


cdef bytes _text_bytes(text):
    if isinstance(text, str):
        return (<str>text).encode("utf-8", "surrogatepass")
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise TypeError(f"text must be str or bytes, got {type(text).__name__}")


def _check_gguf_file(path: str) -> None:
    """Reject a file llama.cpp could abort on (``_gguf_check``), before it opens it."""
    try:
        check_gguf(path)
    except GGUFError as e:
        raise GGUFError(f"failed to load model {path}: {e}") from None
