# Part of _core (included by _core.pyx): zero-copy, read-only numpy views of a context's
# outputs.

cdef class _FloatRows:
    """Read-only buffer over llama.cpp memory; keeps its owner alive, and its owner's llama.cpp
    context too: ``Context.close`` frees it only when the last view is gone."""
    cdef Context owner
    cdef float * ptr
    cdef Py_ssize_t shape[2]
    cdef Py_ssize_t strides[2]
    cdef int ndim

    def __getbuffer__(self, Py_buffer * buf, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("llama.cpp output views are read-only")
        buf.buf = <void *> self.ptr
        buf.obj = self
        buf.len = self.shape[0] * (self.shape[1] if self.ndim == 2 else 1) * sizeof(float)
        buf.readonly = 1
        buf.itemsize = sizeof(float)
        buf.format = b"f"
        buf.ndim = self.ndim
        buf.shape = self.shape
        buf.strides = self.strides
        buf.suboffsets = NULL
        buf.internal = NULL
        self.owner._n_views += 1

    def __releasebuffer__(self, Py_buffer * buf):
        self.owner._n_views -= 1
        if self.owner._n_views == 0:
            self.owner._free_closed()


cdef object _view(Context owner, float * ptr, Py_ssize_t rows, Py_ssize_t cols):
    cdef _FloatRows v = _FloatRows.__new__(_FloatRows)
    v.owner = owner
    v.ptr = ptr
    if rows < 0:
        v.ndim = 1
        v.shape[0] = cols
        v.strides[0] = sizeof(float)
    else:
        v.ndim = 2
        v.shape[0] = rows
        v.shape[1] = cols
        v.strides[0] = cols * sizeof(float)
        v.strides[1] = sizeof(float)
    return np.asarray(v)
