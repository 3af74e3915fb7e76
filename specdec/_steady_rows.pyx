# cython: language_level=3
# distutils: language = c++
"""A single request's verify batches kept to one shape where a new shape is dear.

llama.cpp's CUDA backend runs a decode's graph as a captured CUDA graph, one launch for
its hundreds of kernels, only while the graph keeps its shape: a decode whose shapes
differ from the previous one's (rows, outputs, snapshot count) resets it, runs uncaptured,
and the next decode of the same shape captures it again (``ggml_backend_cuda_graph_compute``
in ``ggml-cuda.cu``). A fixed draft length verifies ``n + 1`` rows every round and keeps
its graph. The adaptive policy changes the draft length from round to round, and holds
rounds plain between drafts: each change costs one uncaptured decode and one capture,
about 2 ms on an H200 with a 1.4B model, as much as the verify itself. That is how
adaptive drafting ran at 0.74x plain decoding where a fixed length ran at 1.2x.

On such a device, rows are nearly free up to the dozens (a verify reads the weights once
whatever its rows). So a round of a lone sequence that has a drafter decodes the same rows
every round: its drafts, then throw-away rows up to ``n_max + 1`` (the rollback drops them,
as exact mode's padding), every row with its output. The policy still chooses the drafts
and measures what each round really costs. Several sequences in a round change the shape
as they join and leave whatever their drafts, and padding each to its longest would cost
real rows (the Engine's batch budget prices those): they are left as they are, and a batch
drafted by a model keeps its shape by holding its measured cap (``_batch_length``'s
``steady``, from ``steady_for``).

``Controller`` takes it on where the target has layers on a CUDA device (``steady_for``);
``_checks.steady_rows`` forces it on or off, for tests on the CPU.
"""
from ._core cimport Context
from ._rollback cimport Rollback
from ._seq cimport _Seq

cdef int STEADY = -1      # -1: where the target has layers on a CUDA device; 0: never; 1: always


cdef int set_steady(int mode) noexcept:
    """Set ``STEADY``; returns the value it had."""
    global STEADY
    cdef int old = STEADY
    STEADY = mode
    return old


cdef int steady_for(Context ctx, bint exact) except -1:
    """Whether ``ctx``'s lone verify batches are held to one shape (exact mode pads its own)."""
    if exact:
        return False
    if STEADY >= 0:
        return STEADY == 1
    model = ctx.model
    if model.placement.n_gpu_layers == 0:
        return False
    return any(d.get("backend") == "CUDA" for d in model.devices)


cdef int steady_height(Rollback rollback, _Seq s, int n_ctx_seq) except -1:
    """Pad the lone sequence ``s`` of a round to ``n_max + 1`` rows (as the rollback allows
    and its context has room for), throw-away rows after its drafts."""
    if not rollback.pads_rows() or s.req.policy.n_max <= 0:
        return 0
    cdef int h = min(rollback.cap_drafts(s.req.policy.n_max) + 1, n_ctx_seq - s.mem.n_past)
    if s.k + 1 + s.n_pad < h:
        s.n_pad = h - s.k - 1
    return 0
