# cython: language_level=3
# distutils: language = c++
"""The core: a thin, fast and safe face of libllama.

``GGML_ASSERT`` ends in ``abort()``, which Python cannot catch. Two defences:
llama.cpp calls that can abort on this thread go through ``_abort.h``, which
turns the abort into :class:`LlamaAbortError` and frees what was being built
or used; and the checks here, before the call, keep the asserts that run in
ggml's compute threads (where no exception can unwind) from being reached.
The core knows nothing of speculation; the controller and the drafters build
on its typed methods (see ``_core.pxd``).
"""
from cpython.buffer cimport PyBUF_WRITABLE
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int8_t, int32_t, uint8_t, uint32_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy
from libcpp.vector cimport vector
from libcpp.string cimport string
from libcpp cimport bool as cbool

from ._llama cimport *

cimport cython
import atexit
import collections
import logging
import os
import signal
import threading
import weakref

import numpy as np

from ._gguf_check import GGUFError, check_gguf
from .placement import Placement

# --------------------------------------------------------------------------------------
# logging: llama.cpp's log goes to the ``specdec.llama`` logger, quiet unless configured;
# its INFO lines (~150 per model load) are DEBUG here, its warnings and errors keep their level
# --------------------------------------------------------------------------------------

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
    if _exiting:
        return
    with gil:
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


_DEV_TYPES = {GGML_BACKEND_DEVICE_TYPE_CPU: "cpu", GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
              GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu", GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
              GGML_BACKEND_DEVICE_TYPE_META: "meta"}


cdef dict _device_dict(ggml_backend_dev_t d):
    cdef size_t free = 0, total = 0
    ggml_backend_dev_memory(d, &free, &total)
    return {"name": ggml_backend_dev_name(d).decode("utf-8", "replace"),
            "description": ggml_backend_dev_description(d).decode("utf-8", "replace"),
            "type": _DEV_TYPES.get(ggml_backend_dev_type_of(d), "?"),
            "backend": ggml_backend_reg_name(ggml_backend_dev_backend_reg(d)).decode(),
            "memory_free": free, "memory_total": total}


def backends() -> list:
    """The ggml backends compiled into this build (``CPU``, ``RPC``, ``CUDA``, ``Vulkan``, ...)."""
    return [ggml_backend_reg_name(ggml_backend_reg_get(i)).decode()
            for i in range(ggml_backend_reg_count())]


def devices() -> list:
    """The devices found at run time, one dict each (name, description, type, backend,
    memory). RPC servers are not listed: they are reached per model (``rpc_servers``)."""
    return [_device_dict(ggml_backend_dev_get(i)) for i in range(ggml_backend_dev_count())]


def system_info() -> str:
    """The CPU features ggml was built with (AVX2, AVX512, AMX ...), the backends compiled
    in and the devices found at run time."""
    lines = [llama_print_system_info().decode().strip(),
             "backends: " + ", ".join(backends())]
    for d in devices():
        mem = f", {d['memory_total'] >> 20} MiB" if d["memory_total"] else ""
        lines.append(f"device {d['name']} ({d['type']}, {d['backend']}): {d['description']}{mem}")
    gpu_backends = [b for b in backends() if b not in ("CPU", "RPC", "BLAS")]
    for b in gpu_backends:
        if not any(d["backend"] == b for d in devices()):
            lines.append(f"{b}: compiled in, but no {b} device found")
    return "\n".join(lines)


def rpc_serve(str host="127.0.0.1", int port=50052, *, n_threads=None, devices=None,
              cache_dir=None) -> None:
    """Serve this build's devices to RPC clients (llama.cpp's ggml_backend_rpc_start_server,
    as tools/rpc/rpc-server does); blocks for ever. ``devices``: device names (see
    ``devices()``); by default the GPUs, else the CPU. Anyone who reaches the port can run
    code paths of the server and read its memory: bind to 127.0.0.1 or a trusted network."""
    if not llama_supports_rpc():
        raise ValueError("this build has no RPC backend (build with -Drpc=true)")
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"bad host {host!r}")
    n_threads = default_threads() if n_threads is None else n_threads
    _check_positive("n_threads", n_threads)
    _check_threads(n_threads, n_threads)
    cdef vector[ggml_backend_dev_t] devs
    cdef ggml_backend_dev_t d
    if devices:
        for name in devices:
            d = ggml_backend_dev_by_name(name.encode())
            if d == NULL:
                have = [_device_dict(ggml_backend_dev_get(i))["name"]
                        for i in range(ggml_backend_dev_count())]
                raise ValueError(f"no device {name!r}; this build has {have}")
            devs.push_back(d)
    else:
        devs = _local_accelerators()
        for i in range(ggml_backend_dev_count()):
            d = ggml_backend_dev_get(i)
            if devs.size() == 0 and ggml_backend_dev_type_of(d) == GGML_BACKEND_DEVICE_TYPE_CPU:
                devs.push_back(d)
    if devs.size() == 0:
        raise ValueError("no device to serve")
    cdef bytes ep = f"{host}:{port}".encode()
    cdef bytes cd = os.fsencode(cache_dir) if cache_dir else b""
    cdef const char * cep = ep
    cdef const char * ccd = NULL
    if cache_dir:
        ccd = cd
    cdef size_t nt = n_threads
    cdef bint ok
    with nogil:
        ok = sd_rpc_start_server(cep, ccd, nt, devs.size(), devs.data())
    if not ok:
        raise ValueError("this build's RPC backend has no server entry point")
    raise RuntimeError(f"the RPC server on {host}:{port} stopped (port in use, or a socket "
                       "error: see the messages above)")


cdef vector[ggml_backend_dev_t] _local_accelerators():
    """The local devices llama.cpp would offload to by default: discrete GPUs, or the
    integrated ones when there is none (src/llama.cpp, llama_prepare_model_devices)."""
    cdef vector[ggml_backend_dev_t] gpus, igpus
    cdef ggml_backend_dev_t d
    for i in range(ggml_backend_dev_count()):
        d = ggml_backend_dev_get(i)
        t = ggml_backend_dev_type_of(d)
        if t == GGML_BACKEND_DEVICE_TYPE_GPU:
            gpus.push_back(d)
        elif t == GGML_BACKEND_DEVICE_TYPE_IGPU and (
                igpus.size() == 0 or ggml_backend_dev_backend_reg(d) == ggml_backend_dev_backend_reg(igpus.back())):
            igpus.push_back(d)
    return gpus if gpus.size() else igpus


cdef str _no_device_reason():
    names = backends()
    gpu_backends = [b for b in names if b not in ("CPU", "RPC", "BLAS")]
    if gpu_backends:
        return (f"this build has {', '.join(gpu_backends)} but no such device was found at run "
                "time" + ("" if "RPC" not in names else ", and no rpc_servers were given"))
    return ("this build has no GPU backend (build with -Dcuda=true, -Dvulkan=true or "
            "-Dmetal=enabled)" + (" and no rpc_servers were given" if "RPC" in names else ""))


#: endpoint -> why: RPC servers that failed in this process. llama.cpp's RPC client keeps one
#: connection per endpoint for the process's life, and a failed one is never replaced.
_dead_endpoints = {}


#: models whose layers may live on RPC servers (a live one holds its servers' connections)
_remote_models = weakref.WeakSet()


def _precheck_endpoint(str endpoint, double timeout):
    """Reach the server before llama.cpp does: its client aborts on a failed connect while
    holding the lock every later connection needs, so a failed connect must not get that far.
    Skipped while a model holds a connection to it: the server takes one client at a time
    (a backlog of 1), and llama.cpp reuses that connection."""
    if endpoint in _dead_endpoints:
        raise RPCError(f"RPC server {endpoint} failed earlier in this process "
                       f"({_dead_endpoints[endpoint]}); llama.cpp cannot reconnect to it: "
                       "restart the process, or serve on another port")
    if any(endpoint in m.placement.rpc_servers for m in list(_remote_models)):
        return
    import socket
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=min(timeout or 30.0, 30.0)):
            pass
    except OSError as e:
        raise RPCError(f"RPC server {endpoint}: cannot connect ({e})") from None


cdef vector[ggml_backend_dev_t] _rpc_devices(str endpoint, double timeout) except *:
    cdef vector[ggml_backend_dev_t] out
    cdef ggml_backend_reg_t reg = NULL
    cdef string why
    cdef bytes ep = endpoint.encode()
    cdef const char * cep = ep
    cdef int rc
    _precheck_endpoint(endpoint, timeout)
    with nogil:
        rc = sd_remote_add_server(cep, &reg, timeout, why)
    if rc != SD_REMOTE_OK:
        msg = why.decode("utf-8", "replace")
        if rc == SD_REMOTE_EXCEPTION and "build" in msg:
            raise ValueError(f"rpc_servers: {msg}")
        if rc != SD_REMOTE_EXCEPTION:
            _dead_endpoints[endpoint] = msg
        raise RPCError(f"RPC server {endpoint}: {msg}")
    if reg == NULL:
        raise RPCError(f"RPC server {endpoint} offers no devices")
    for i in range(ggml_backend_reg_dev_count(reg)):
        out.push_back(ggml_backend_reg_dev_get(reg, i))
    return out


def ggml_type_traits() -> dict:
    """ggml's tensor types in this build: id -> (name, block size, block bytes, computable).

    ``computable``: ggml's CPU backend can multiply with it (a ``vec_dot`` kernel and a
    conversion for the other operand) and convert it to float (``get_rows``). Types without
    (Q8_K and Q8_1 are only the activations' side of a dot product; integer and f64 types
    have no matmul) crash inside the compute threads when a weight has them. Removed type
    ids (block size 0) are absent.
    """
    cdef const ggml_traits * t
    cdef const ggml_type_traits_cpu * c
    cdef const ggml_type_traits_cpu * other
    out = {}
    for i in range(<int>GGML_TYPE_COUNT):
        t = ggml_get_type_traits(<ggml_type>i)
        if t == NULL or t.blck_size <= 0 or t.type_size == 0:
            continue
        c = ggml_get_type_traits_cpu(<ggml_type>i)
        ok = c != NULL and c.vec_dot != NULL and (t.to_float != NULL or i == <int>GGML_TYPE_F32)
        if ok and <int>c.vec_dot_type != <int>GGML_TYPE_F32:
            other = ggml_get_type_traits_cpu(c.vec_dot_type)
            ok = other != NULL and other.from_float != NULL
        name = t.type_name.decode() if t.type_name != NULL else str(i)
        out[i] = (name, int(t.blck_size), int(t.type_size), bool(ok))
    return out


def mtp_available() -> bool:
    """Whether this build exposes llama.cpp's nextn (MTP) API.

    The core is compiled against ``src/llama-ext.h`` of the pinned tree, so the
    functions are linked in; a build without them would fail to link, not run.
    """
    return True


def chat_builtin_templates() -> list:
    """Names of llama.cpp's built-in chat templates (``llama_chat_apply_template``)."""
    cdef int32_t n = llama_chat_builtin_templates(NULL, 0)
    cdef const char ** names = <const char **>malloc(max(n, 1) * sizeof(char *))
    if names == NULL:
        raise MemoryError()
    try:
        llama_chat_builtin_templates(names, n)
        return [(<bytes>names[i]).decode() for i in range(n)]
    finally:
        free(names)


def chat_apply_template(str tmpl, messages, bint add_assistant=True) -> str:
    """``(role, content)`` pairs rendered by llama.cpp's C++ version of a built-in template.

    ``tmpl`` is a name from :func:`chat_builtin_templates`, or a Jinja source that
    llama.cpp maps to one of them by its markers (it does not run Jinja).
    """
    cdef list keep = [_text_bytes(tmpl)]
    cdef vector[llama_chat_message] chat
    cdef llama_chat_message m
    cdef size_t total = 0
    cdef bytes r, c
    for role, content in messages:
        r = _text_bytes(role)
        c = _text_bytes(content)
        if b"\0" in r or b"\0" in c:
            raise ValueError("chat messages must not contain NUL characters")
        keep.append(r)
        keep.append(c)
        total += len(r) + len(c)
        m.role = r
        m.content = c
        chat.push_back(m)
    if b"\0" in keep[0]:
        raise ValueError("a chat template must not contain NUL characters")
    cdef int32_t size = <int32_t>min(2 * total + 1024, 0x3FFFFFFF), n
    cdef vector[char] buf
    while True:
        buf.resize(size)
        n = llama_chat_apply_template(keep[0], chat.data(), chat.size(), add_assistant,
                                      buf.data(), size)
        if n < 0:
            raise ValueError(f"llama.cpp has no built-in chat template for {tmpl[:80]!r} "
                             f"(names: {', '.join(chat_builtin_templates())})")
        if n <= size:
            return buf.data()[:n].decode("utf-8", "replace")
        size = n


# --------------------------------------------------------------------------------------
# architecture facts (from the pinned tree: src/llama-arch.cpp, src/models/*)
# --------------------------------------------------------------------------------------

#: archs whose graph has an MTP (DECODER_MTP) path
MTP_ARCHS = frozenset({
    "qwen35", "qwen35moe", "qwen3next", "deepseek2", "deepseek32", "deepseek4", "glm4moe",
    "glm-dsa", "glm5-next", "step35", "mimo2", "hy_v3", "cohere2moe", "bailingmoe3",
    "nemotron_h_moe",
})
#: of those, the archs whose MTP graph handles several chained heads
MTP_MULTI_HEAD_ARCHS = frozenset({"step35", "mimo2", "hy_v3"})
#: recurrent/hybrid archs with bounded partial rollback (n_rs_seq); llm_arch_supports_rs_rollback
RS_ROLLBACK_ARCHS = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
    "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3",
})
#: archs whose target graph computes the nextn hidden rows (h_nextn) before result_norm, where
#: the lazy LM head stops the graph: lazy logits and MTP hidden states go together there
LAZY_NEXTN_ARCHS = frozenset({"qwen35", "qwen35moe"})
#: archs whose decode graphs may keep fewer snapshots than n_rs_seq (their graph code reads
#: cparams.n_rs_seq the way _rs_graph.h assumes: delta-net layers)
RS_TRIM_ARCHS = frozenset({"qwen35", "qwen35moe"})


class ContextFullError(ValueError):
    """The sequence would grow past the context size (``n_ctx``)."""


class DecodeError(RuntimeError):
    """llama.cpp refused or failed a decode; the context stays usable."""


class ContextBusyError(RuntimeError):
    """A context (or model) was used from a second thread while in use."""


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


# --------------------------------------------------------------------------------------
# zero-copy views
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------

cdef object _missing_special(const llama_vocab * v):
    """Why tokenizing with ``add_special`` would assert, or None: the vocabulary's type or
    flags ask for a special token (BOS, EOS, SEP) that the file does not define."""
    cdef int t = llama_vocab_type_of(v)
    need = []
    if t == 3:   # WPM (BERT): [CLS] ... [SEP] around every text
        need = [("BOS", llama_vocab_bos(v)), ("SEP", llama_vocab_sep(v))]
    elif t != 0:   # SPM, BPE, UGM ... (0: no vocabulary)
        if llama_vocab_get_add_bos(v):
            need.append(("BOS", llama_vocab_bos(v)))
        if llama_vocab_get_add_eos(v):
            need.append(("EOS", llama_vocab_eos(v)))
    missing = [name for name, tok in need if tok == LLAMA_TOKEN_NULL]
    if missing:
        return (f"the tokenizer adds {' and '.join(missing)} to every text but the vocabulary "
                "has no such token")
    return None


cdef class Model:
    """Model(path, *, n_gpu_layers=0, split_mode="layer", main_gpu=0, tensor_split=None, rpc_servers=None, rpc_timeout=300.0, use_mmap=True, load_mtp=False, use_extra_bufts=True, vocab_only=False)
--

    A GGUF model loaded through libllama: metadata and tokenizer.

    ``load_mtp`` loads the MTP (NextN) layers that MTP contexts need; without it
    llama.cpp would abort when such a context is created, so ``Context`` checks.
    ``use_extra_bufts=False`` drops the repacked weight layouts (slower, but the
    same kernels for batched and single-token matmuls).
    ``check``: ``"fast"`` checks the file's header and metadata, and turns llama.cpp's
    aborts during the load into exceptions; ``"isolated"`` also loads it and generates a
    few tokens in a child process first (``specdec.probe.check_model``, cached by content
    hash), for files from untrusted sources.
    """

    def __cinit__(self):
        self.model = NULL
        self.vocab = NULL

    def __init__(self, path, *, n_gpu_layers=0, split_mode="layer", main_gpu=0,
                 tensor_split=None, rpc_servers=None, rpc_timeout=300.0, bint use_mmap=True,
                 bint load_mtp=False, bint use_extra_bufts=True, bint vocab_only=False,
                 str check="fast"):
        if self.model != NULL:
            raise RuntimeError("Model is already initialised")
        n_gpu_layers = _int_arg("n_gpu_layers", n_gpu_layers, I32_MIN, I32_MAX)
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        if check not in ("fast", "isolated"):
            raise ValueError(f"check must be 'fast' or 'isolated', got {check!r}")
        path = os.fspath(path)
        if not isinstance(path, str):
            path = os.fsdecode(path)
        plc = Placement.make(n_gpu_layers, split_mode, main_gpu, tensor_split, rpc_servers,
                             rpc_timeout)
        _check_gguf_file(path)
        if check == "isolated":
            from .probe import check_model
            check_model(path)
        cdef llama_model_params p = llama_model_default_params()
        cdef vector[ggml_backend_dev_t] devs = self._devices(plc)
        cdef vector[float] split = vector[float](max(<size_t>1, llama_max_devices()), 0.0)
        for i, x in enumerate(plc.tensor_split):
            split[i] = x
        self._devs = devs
        self._devs.push_back(NULL)
        p.devices = self._devs.data()
        p.n_gpu_layers = plc.n_gpu_layers
        p.split_mode = <llama_split_mode>plc.split_mode_id
        p.main_gpu = plc.main_gpu
        p.tensor_split = split.data() if plc.tensor_split else NULL
        p.load_mode = LLAMA_LOAD_MODE_MMAP if use_mmap else LLAMA_LOAD_MODE_NONE
        p.load_mtp = load_mtp
        p.use_extra_bufts = use_extra_bufts
        p.vocab_only = vocab_only
        self.placement = plc
        self.is_remote = len(plc.rpc_servers) > 0
        self._timeout = plc.rpc_timeout
        self._dead = None
        cdef bytes bpath = os.fsencode(path)
        if b"\0" in bpath:
            raise ValueError("path contains a NUL byte")
        cdef const char * cpath = bpath
        cdef string why
        cdef int rc = SD_REMOTE_OK
        cdef sd_stop_flag stop
        stop.requested = False
        stop.watch = False
        if not self.is_remote:
            # a remote load runs on a helper thread that may outlive this frame: no callback
            p.progress_callback = _load_progress
            p.progress_callback_user_data = <void *> &stop
            _stop_begin(&stop)
        _clear_recent()
        try:
            with nogil:
                if self.is_remote:
                    rc = sd_remote_load(cpath, p, &self.model, self._timeout, why)
                else:
                    self.model = sd_model_load(cpath, p)
        finally:
            _stop_end(&stop)
        if rc != SD_REMOTE_OK:
            self.model = NULL
            raise RPCError(f"failed to load model {path} onto {', '.join(plc.rpc_servers)}: "
                           + why.decode("utf-8", "replace"))
        _raise_pending()    # Ctrl-C: the load stopped at the next tensor (the model is freed)
        aborted = _take_abort()
        if aborted is not None:
            raise GGUFError(f"failed to load model {path}: llama.cpp aborted: {aborted}") from \
                LlamaAbortError("loading the model", aborted)
        if self.model == NULL:
            why_s = _recent_errors()
            raise ValueError(f"failed to load model {path}" + (f": {why_s}" if why_s else ""))
        if self.is_remote:
            _remote_models.add(self)
        self.vocab = llama_model_get_vocab(self.model)
        self.path = path
        self.arch = self.meta("general.architecture") or ""
        self.n_vocab = llama_vocab_n_tokens(self.vocab)
        self.n_embd = llama_model_n_embd(self.model)
        self.n_embd_out = llama_model_n_embd_out(self.model)
        self.n_layer = llama_model_n_layer(self.model)
        self.n_layer_nextn = llama_model_n_layer_nextn(self.model)
        self.mtp_loaded = bool(load_mtp) and self.n_layer_nextn > 0
        self.is_recurrent = llama_model_is_recurrent(self.model)
        self.is_hybrid = llama_model_is_hybrid(self.model)
        self.use_extra_bufts = use_extra_bufts
        bad = None if self.n_vocab > 0 else "the model has no vocabulary"
        bad = bad or _missing_special(self.vocab)
        if bad is not None:
            llama_model_free(self.model)
            self.model = NULL
            raise GGUFError(f"failed to load model {path}: {bad}")

    def __dealloc__(self):
        cdef string why
        if self.model != NULL and not self._remote_dead():
            if self.is_remote:
                with nogil:
                    sd_remote_free_model(self.model, self._timeout, why)
            else:
                llama_model_free(self.model)
        self.model = NULL

    def __repr__(self):
        return (f"Model({os.path.basename(self.path or '')!r}, arch={self.arch!r}, "
                f"n_vocab={self.n_vocab}, n_layer={self.n_layer}, n_layer_nextn={self.n_layer_nextn})")

    cdef int _alive(self) except -1:
        if self._remote_dead():
            raise RPCError(self._dead)
        if self.model == NULL:
            raise RuntimeError("Model is not loaded")
        return 0

    cdef vector[ggml_backend_dev_t] _devices(self, plc) except *:
        """llama.cpp's device list for a placement: RPC servers' devices first (fewer
        network transfers), then local GPUs; a device option that cannot be honoured fails
        here, never silently."""
        cdef vector[ggml_backend_dev_t] devs, more
        if plc.rpc_servers and plc.n_gpu_layers == 0:
            raise ValueError("rpc_servers given with n_gpu_layers=0, which keeps every layer on "
                             "this host: give n_gpu_layers=-1 (all) or a layer count")
        for ep in plc.rpc_servers:
            if not llama_supports_rpc():
                raise ValueError("rpc_servers given, but this build has no RPC backend "
                                 "(build with -Drpc=true)")
            more = _rpc_devices(ep, plc.rpc_timeout)
            devs.insert(devs.end(), more.begin(), more.end())
        more = _local_accelerators()
        devs.insert(devs.end(), more.begin(), more.end())
        self.devices = [_device_dict(devs[i]) for i in range(devs.size())]
        if plc.n_gpu_layers != 0 and devs.size() == 0:
            raise ValueError(f"n_gpu_layers={plc.n_gpu_layers} asks for layers on a device, but "
                             f"{_no_device_reason()}; use n_gpu_layers=0 for the CPU")
        if plc.tensor_split and len(plc.tensor_split) > max(<size_t>devs.size(), 1):
            raise ValueError(f"tensor_split has {len(plc.tensor_split)} entries for "
                             f"{devs.size()} device(s)")
        if len(plc.tensor_split) > llama_max_devices():
            raise ValueError(f"tensor_split: at most {llama_max_devices()} devices")
        if plc.split_mode == "none" and devs.size() and plc.main_gpu >= <int>devs.size():
            raise ValueError(f"main_gpu={plc.main_gpu} but there are {devs.size()} device(s)")
        if plc.split_mode == "row":
            for i in range(devs.size()):
                if ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(devs[i]),
                                                     b"ggml_backend_split_buffer_type") == NULL:
                    raise ValueError(f"split_mode='row': device {self.devices[i]['name']} has no "
                                     "row-split buffers (llama.cpp has them on CUDA and SYCL); "
                                     "use 'layer'")
        return devs

    cdef bint _remote_dead(self):
        """Whether an RPC failure (of this model, or of another on one of its servers) made
        this model unusable; ``_dead`` says why."""
        if self._dead is None and self.is_remote:
            for ep in self.placement.rpc_servers:
                if ep in _dead_endpoints:
                    self._dead = (f"RPC server {ep} of {os.path.basename(self.path)} failed: "
                                  f"{_dead_endpoints[ep]}; this model and its contexts are "
                                  "unusable, load it again")
        return self._dead is not None

    cdef int _remote_failed(self, int rc, string why, str what) except -1:
        """After a remote call: nothing if it ran, else mark the model dead and raise."""
        if rc == SD_REMOTE_OK:
            return 0
        msg = why.decode("utf-8", "replace")
        if rc == SD_REMOTE_EXCEPTION:
            raise RuntimeError(f"{what} failed: {msg}")
        self._dead = (f"the RPC server(s) of {os.path.basename(self.path)} "
                      f"({', '.join(self.placement.rpc_servers)}) failed during {what}: {msg}; "
                      "this model and its contexts are unusable, load it again")
        for ep in self.placement.rpc_servers:   # which one failed is not known: all are suspect
            _dead_endpoints.setdefault(ep, f"{what}: {msg}")
        raise RPCError(self._dead)

    # --- metadata ---------------------------------------------------------------------

    def meta(self, key: str):
        """A GGUF metadata value as a string, or None."""
        self._alive()
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__name__}")
        cdef bytes k = key.encode("utf-8", "surrogatepass")
        if b"\0" in k:
            raise ValueError("key contains a NUL byte")
        cdef vector[char] buf = vector[char](256)
        cdef int32_t n = llama_model_meta_val_str(self.model, k, buf.data(), buf.size())
        if n < 0:
            return None
        if n >= <int32_t>buf.size():
            buf.resize(n + 1)
            n = llama_model_meta_val_str(self.model, k, buf.data(), buf.size())
        return buf.data()[:n].decode("utf-8", "replace")

    @property
    def description(self) -> str:
        self._alive()
        cdef char buf[256]
        n = llama_model_desc(self.model, buf, sizeof(buf))
        return buf[:max(0, min(n, 255))].decode("utf-8", "replace")

    @property
    def n_ctx_train(self) -> int:
        self._alive()
        return llama_model_n_ctx_train(self.model)

    @property
    def n_swa(self) -> int:
        self._alive()
        return llama_model_n_swa(self.model)

    @property
    def size(self) -> int:
        self._alive()
        return llama_model_size(self.model)

    @property
    def n_params(self) -> int:
        self._alive()
        return llama_model_n_params(self.model)

    @property
    def chat_template(self):
        self._alive()
        cdef const char * t = llama_model_chat_template(self.model, NULL)
        return None if t == NULL else t.decode("utf-8", "replace")

    @property
    def has_mtp_graph(self) -> bool:
        """The architecture has an MTP graph in llama.cpp and the file has NextN layers."""
        return self.arch in MTP_ARCHS and self.n_layer_nextn > 0

    @property
    def supports_mtp(self) -> bool:
        """An MTP context can be created on this model (graph present and layers loaded)."""
        return self.has_mtp_graph and self.mtp_loaded

    @property
    def supports_partial_rollback(self) -> bool:
        """Tail tokens can be removed from a sequence (attention KV, or n_rs_seq snapshots)."""
        if not (self.is_recurrent or self.is_hybrid):
            return True
        return self.arch in RS_ROLLBACK_ARCHS

    # --- tokenizer --------------------------------------------------------------------

    @property
    def bos(self) -> int:
        return llama_vocab_bos(self.vocab) if self.vocab != NULL else -1

    @property
    def eos(self) -> int:
        return llama_vocab_eos(self.vocab) if self.vocab != NULL else -1

    @property
    def eot(self) -> int:
        return llama_vocab_eot(self.vocab) if self.vocab != NULL else -1

    @property
    def nl(self) -> int:
        return llama_vocab_nl(self.vocab) if self.vocab != NULL else -1

    @property
    def add_bos(self) -> bool:
        self._alive()
        return llama_vocab_get_add_bos(self.vocab)

    @property
    def eog_tokens(self) -> list:
        """Every token that ends generation (EOS, EOT, and the like)."""
        self._alive()
        return [t for t in range(self.n_vocab) if llama_vocab_is_eog(self.vocab, t)]

    cdef int _check_token(self, object tok) except -1:
        if not isinstance(tok, (int, np.integer)) or isinstance(tok, bool):
            raise TypeError(f"token ids must be ints, got {type(tok).__name__}")
        if tok < 0 or tok >= self.n_vocab:
            raise ValueError(f"token id {tok} out of range [0, {self.n_vocab})")
        return 0

    def is_eog(self, tok) -> bool:
        self._alive()
        self._check_token(tok)
        return llama_vocab_is_eog(self.vocab, tok)

    def is_control(self, tok) -> bool:
        self._alive()
        self._check_token(tok)
        return llama_vocab_is_control(self.vocab, tok)

    def token_text(self, tok) -> str:
        """The vocabulary entry of a token (not its detokenized form)."""
        self._alive()
        self._check_token(tok)
        cdef const char * t = llama_vocab_get_text(self.vocab, tok)
        return "" if t == NULL else t.decode("utf-8", "replace")

    cdef bint is_eog_c(self, llama_token tok) noexcept nogil:
        return llama_vocab_is_eog(self.vocab, tok)

    cdef int piece_c(self, llama_token tok, char * buf, int size) noexcept nogil:
        return sd_token_to_piece(self.vocab, tok, buf, size, 0, False)

    def tokenize(self, text, *, bint add_special=True, bint parse_special=False) -> list:
        """Text (str or UTF-8 bytes) to token ids; ``add_special`` adds BOS where the model wants it."""
        self._alive()
        cdef bytes b = _text_bytes(text)
        if len(b) > 0x3FFFFFFF:
            raise ValueError("text too long to tokenize")
        cdef int32_t n_max = len(b) + 8
        cdef vector[llama_token] out = vector[llama_token](n_max)
        cdef const char * cb = b
        cdef int32_t blen = len(b)
        cdef int32_t n
        with nogil:
            n = sd_tokenize(self.vocab, cb, blen, out.data(), n_max, add_special, parse_special)
        _raise_abort("tokenize")
        if n < 0:
            if n == -2147483648:
                raise ValueError("tokenization overflow")
            out.resize(-n)
            with nogil:
                n = sd_tokenize(self.vocab, cb, blen, out.data(), -n, add_special, parse_special)
            _raise_abort("tokenize")
            if n < 0:
                raise ValueError("tokenization failed")
        return [out[i] for i in range(n)]

    def token_to_piece(self, tok, *, bint special=False) -> bytes:
        """The bytes a token stands for (may be a partial UTF-8 sequence)."""
        self._alive()
        self._check_token(tok)
        cdef char buf[256]
        cdef int n = sd_token_to_piece(self.vocab, tok, buf, sizeof(buf), 0, special)
        _raise_abort("token_to_piece")
        if n < 0:
            big = bytearray(-n)
            n = sd_token_to_piece(self.vocab, tok, <char *>big, len(big), 0, special)
            _raise_abort("token_to_piece")
            return bytes(big[:max(n, 0)])
        return buf[:n]

    def detokenize(self, tokens, *, bint remove_special=False, bint unparse_special=False) -> str:
        """Token ids back to text (invalid UTF-8 is replaced)."""
        self._alive()
        cdef vector[llama_token] toks
        for t in tokens:
            self._check_token(t)
            toks.push_back(t)
        if toks.size() == 0:
            return ""
        cdef int32_t cap = <int32_t>toks.size() * 16 + 64
        cdef vector[char] buf = vector[char](cap)
        cdef int32_t n = sd_detokenize(self.vocab, toks.data(), toks.size(), buf.data(), cap,
                                       remove_special, unparse_special)
        _raise_abort("detokenize")
        if n < 0:
            buf.resize(-n)
            n = sd_detokenize(self.vocab, toks.data(), toks.size(), buf.data(), -n,
                              remove_special, unparse_special)
            _raise_abort("detokenize")
        return buf.data()[:max(n, 0)].decode("utf-8", "replace")

    def vocab_compatible(self, Model other not None) -> bool:
        """Whether ``other`` can draft for this model: llama.cpp's rule (common/speculative.cpp).

        Same vocab type, BOS/EOS ids and add-flags, sizes within 128, and the same
        token text from id 5 on.
        """
        self._alive()
        other._alive()
        cdef const llama_vocab * a = self.vocab
        cdef const llama_vocab * b = other.vocab
        if llama_vocab_type_of(a) != llama_vocab_type_of(b):
            return False
        if (llama_vocab_get_add_bos(a) != llama_vocab_get_add_bos(b)
                or llama_vocab_get_add_eos(a) != llama_vocab_get_add_eos(b)
                or llama_vocab_bos(a) != llama_vocab_bos(b)
                or llama_vocab_eos(a) != llama_vocab_eos(b)):
            return False
        cdef int na = llama_vocab_n_tokens(a), nb = llama_vocab_n_tokens(b)
        if abs(na - nb) > 128:
            return False
        cdef int i
        cdef const char * ta
        cdef const char * tb
        for i in range(5, min(na, nb)):
            ta = llama_vocab_get_text(a, i)
            tb = llama_vocab_get_text(b, i)
            if (ta == NULL) != (tb == NULL):
                return False
            if ta != NULL and string(ta) != string(tb):
                return False
        return True


# --------------------------------------------------------------------------------------
# Batch
# --------------------------------------------------------------------------------------

cdef class Batch:
    """Batch(capacity, *, n_embd=0, n_seq_max=1)
--

    Tokens, positions, sequence ids, output flags and optional embedding rows.

    Allocated once for ``capacity`` entries and reused (``clear``). MTP batches
    carry a token *and* an ``n_embd``-wide hidden row per entry.
    """

    def __cinit__(self):
        self.b.n_tokens = 0
        self.b.token = NULL
        self.b.embd = NULL
        self.b.pos = NULL
        self.b.n_seq_id = NULL
        self.b.seq_id = NULL
        self.b.logits = NULL

    def __init__(self, capacity, *, n_embd=0, n_seq_max=1):
        _check_positive("capacity", capacity)
        _check_positive("n_seq_max", n_seq_max)
        if not isinstance(n_embd, int) or n_embd < 0:
            raise ValueError(f"n_embd must be a non-negative int, got {n_embd!r}")
        # llama_batch_init allocates per entry: an absurd size would take the machine's memory
        if capacity > 1 << 20 or n_seq_max > 256 or n_embd > 1 << 20 or capacity * n_embd > 1 << 31:
            raise ValueError(f"batch too large (capacity={capacity}, n_embd={n_embd}, "
                             f"n_seq_max={n_seq_max}): at most 2**20 entries, 256 sequences, "
                             "2**31 embedding floats")
        if self.b.token != NULL:
            raise RuntimeError("Batch is already initialised")
        self.capacity = capacity
        self.n_embd = n_embd
        self.n_seq_max = n_seq_max
        self.b = llama_batch_init(capacity, 0, n_seq_max)
        if n_embd > 0:
            # llama_batch_init allocates token *or* embd; MTP rows need both (freed by llama_batch_free)
            self.b.embd = <float *> malloc(<size_t>capacity * n_embd * sizeof(float))
            if self.b.embd == NULL:
                raise MemoryError()
        self.b.n_tokens = 0

    def __dealloc__(self):
        if self.b.token != NULL:
            llama_batch_free(self.b)
            self.b.token = NULL

    def __len__(self):
        return self.b.n_tokens

    @property
    def n_tokens(self) -> int:
        return self.b.n_tokens

    def clear(self):
        self.b.n_tokens = 0

    cdef int add_c(self, llama_token tok, llama_pos pos, llama_seq_id seq, bint output) except -1 nogil:
        cdef int i = self.b.n_tokens
        if i >= self.capacity:
            with gil:
                raise ValueError(f"batch is full (capacity {self.capacity})")
        cdef int8_t flag = 1 if output else 0
        self.b.token[i] = tok
        self.b.pos[i] = pos
        self.b.n_seq_id[i] = 1
        self.b.seq_id[i][0] = seq
        self.b.logits[i] = flag
        self.b.n_tokens = i + 1
        return 0

    cdef int add_embd_c(self, llama_token tok, llama_pos pos, llama_seq_id seq, bint output,
                        const float * row) except -1 nogil:
        cdef int i = self.b.n_tokens
        self.add_c(tok, pos, seq, output)
        memcpy(self.b.embd + <size_t>i * self.n_embd, row, self.n_embd * sizeof(float))
        return 0

    def add(self, token, pos, seq_ids=0, output=False, embd=None):
        """Append one entry. ``seq_ids`` is an id or a list of ids; ``embd`` a row of ``n_embd`` floats."""
        if not isinstance(token, (int, np.integer)) or isinstance(token, bool):
            raise TypeError(f"token must be an int, got {type(token).__name__}")
        if not isinstance(pos, (int, np.integer)) or isinstance(pos, bool):
            raise TypeError(f"pos must be an int, got {type(pos).__name__}")
        if not -2**31 <= token < 2**31 or not 0 <= pos < 2**31:
            raise ValueError(f"token {token} / pos {pos} out of range")
        seqs = [seq_ids] if isinstance(seq_ids, (int, np.integer)) else list(seq_ids)
        if not 1 <= len(seqs) <= self.n_seq_max:
            raise ValueError(f"an entry needs 1..{self.n_seq_max} sequence ids, got {len(seqs)}")
        for s in seqs:
            if not isinstance(s, (int, np.integer)) or s < 0 or s >= self.n_seq_max:
                raise ValueError(f"sequence id {s!r} out of range [0, {self.n_seq_max})")
        if (embd is None) != (self.n_embd == 0):
            raise ValueError("this batch carries embedding rows: pass embd" if self.n_embd
                             else "this batch has no embedding rows (n_embd=0)")
        cdef const float[::1] row
        if embd is not None:
            row = np.ascontiguousarray(embd, dtype=np.float32).reshape(-1)
            if row.shape[0] != self.n_embd:
                raise ValueError(f"embd row has {row.shape[0]} values, expected {self.n_embd}")
            self.add_embd_c(token, pos, seqs[0], bool(output), &row[0])
        else:
            self.add_c(token, pos, seqs[0], bool(output))
        cdef int i = self.b.n_tokens - 1
        cdef int k
        for k in range(len(seqs)):
            self.b.seq_id[i][k] = seqs[k]
        self.b.n_seq_id[i] = len(seqs)

    def set_output(self, i, bint value):
        i = _int_arg("i", i, I32_MIN, I32_MAX)
        if i < 0:
            i += self.b.n_tokens
        if not 0 <= i < self.b.n_tokens:
            raise IndexError(f"batch index {i} out of range")
        cdef int8_t flag = 1 if value else 0
        self.b.logits[i] = flag

    @property
    def tokens(self) -> list:
        return [self.b.token[i] for i in range(self.b.n_tokens)]

    @property
    def positions(self) -> list:
        return [self.b.pos[i] for i in range(self.b.n_tokens)]

    @property
    def outputs(self) -> list:
        return [bool(self.b.logits[i]) for i in range(self.b.n_tokens)]


# --------------------------------------------------------------------------------------
# Context
# --------------------------------------------------------------------------------------

cdef cbool _abort_cb(void * data) noexcept nogil:
    return sd_stop_now(<const sd_stop_flag *> data)


cdef cbool _load_progress(float progress, void * data) noexcept nogil:
    return not sd_stop_now(<const sd_stop_flag *> data)


cdef class Context:
    """Context(model, *, n_ctx=4096, n_batch=512, n_ubatch=None, n_threads=None, n_threads_batch=None, n_seq_max=1, kind="default", n_rs_seq=0, nextn=None, flash_attn=None, swa_full=True, kv_unified=None, n_outputs_max=0, lazy_logits=False, batch_invariant=False)
--

    A llama.cpp context: KV / recurrent memory and the decode loop's outputs.

    ``kind="mtp"`` makes a context that runs the model's MTP head (its own KV,
    NextN layers only). ``n_rs_seq`` keeps that many recurrent-state snapshots
    per sequence so the last decode can be partly rolled back (qwen35 and kin); on
    qwen35/qwen35moe each decode writes only those its batch can need (``rs_trim``).
    ``nextn`` turns on the target's hidden states for MTP: ``"masked"`` (rows for
    output tokens only) or ``"dense"`` (one row per batch entry).
    ``batch_invariant=True`` makes every row of a batch of 2 rows or more come out
    bit-identical whatever else the batch holds (exact mode): CPU backends only,
    weights not repacked (``Model(use_extra_bufts=False)``); see ``_batch_invariant.h``.

    The context holds ``n_ctx`` positions (``n_ctx_seq`` per sequence), as asked: llama.cpp
    allocates whole multiples of 256, and the core refuses positions past the size asked for.
    llama.cpp caps ``n_batch`` at ``n_ctx``.
    """

    def __cinit__(self):
        self.ctx = NULL
        self._busy = 0
        self._stop.requested = False
        self._stop.watch = False
        self._stop.since = 0
        self._n_views = 0
        self._closed_ctx = NULL
        self._head = new sd_lm_head()
        self._lazy = False
        self._aborted = None

    def __init__(self, Model model not None, *, n_ctx=4096, n_batch=512, n_ubatch=None,
                 n_threads=None, n_threads_batch=None, n_seq_max=1, kind="default", n_rs_seq=0,
                 nextn=None, flash_attn=None, swa_full=True, kv_unified=None,
                 n_outputs_max=0, bint lazy_logits=False, bint batch_invariant=False,
                 offload_kqv=None):
        if self.ctx != NULL:
            raise RuntimeError("Context is already initialised")
        model._alive()
        _check_positive("n_ctx", n_ctx)
        _check_positive("n_batch", n_batch)
        n_ubatch = n_batch if n_ubatch is None else n_ubatch
        _check_positive("n_ubatch", n_ubatch)
        _check_positive("n_seq_max", n_seq_max)
        n_threads = n_threads if n_threads is not None else default_threads()
        _check_positive("n_threads", n_threads)
        n_threads_batch = n_threads if n_threads_batch is None else n_threads_batch
        _check_positive("n_threads_batch", n_threads_batch)
        _check_threads(n_threads, n_threads_batch)
        n_rs_seq = _int_arg("n_rs_seq", n_rs_seq, 0, I32_MAX)
        if n_seq_max > 256:
            raise ValueError(f"n_seq_max must be at most 256, got {n_seq_max}")
        n_outputs_max = _int_arg("n_outputs_max", n_outputs_max, 0, I32_MAX)
        if n_ctx > 1 << 24 or n_batch > 1 << 20:
            raise ValueError("n_ctx / n_batch unreasonably large")
        # llama.cpp reserves an output row per sequence within n_batch (capped at n_ctx) and
        # aborts when they do not fit
        if n_seq_max > min(n_batch, n_ctx) or 0 < n_outputs_max < n_seq_max:
            raise ValueError(f"n_seq_max={n_seq_max} needs n_batch, n_ctx (and n_outputs_max if "
                             f"set) of at least {n_seq_max}; got n_batch={n_batch}, "
                             f"n_ctx={n_ctx}, n_outputs_max={n_outputs_max}")
        if kind not in ("default", "mtp"):
            raise ValueError(f"kind must be 'default' or 'mtp', got {kind!r}")
        if nextn not in (None, "masked", "dense"):
            raise ValueError(f"nextn must be None, 'masked' or 'dense', got {nextn!r}")
        is_mtp = kind == "mtp"
        if lazy_logits and is_mtp:
            raise ValueError("lazy_logits is for target contexts, not MTP contexts")
        if lazy_logits and nextn is not None and model.arch not in LAZY_NEXTN_ARCHS:
            raise ValueError(f"lazy_logits with nextn hidden states needs an arch whose graph "
                             f"makes them before the LM head ({sorted(LAZY_NEXTN_ARCHS)}), "
                             f"not {model.arch!r}")
        if is_mtp or nextn is not None:
            self._check_mtp_model(model, is_mtp)
        # llama.cpp caps the batch at the context size it was asked for (before padding it)
        cdef int n_batch_eff = min(n_ctx, n_batch)
        cdef int n_ubatch_eff = min(n_ubatch, n_batch_eff)
        if n_rs_seq > 0:
            # split_equal keeps a sequence's last n_rs_seq + 1 tokens in one ubatch and
            # asserts n_ubatch > n_rs_seq + 1 (llama-batch.cpp)
            if n_ubatch_eff <= n_rs_seq + 1:
                raise ValueError(f"n_rs_seq={n_rs_seq} needs n_ubatch >= {n_rs_seq + 2} (a rollback "
                                 f"of n tokens keeps n + 1 in one ubatch); have n_ubatch="
                                 f"{n_ubatch_eff} (n_batch={n_batch}, n_ctx={n_ctx})")
            if not (model.is_recurrent or model.is_hybrid):
                raise ValueError(f"n_rs_seq applies to recurrent/hybrid models; {model.arch!r} "
                                 "rolls back its attention KV without it")
            if model.arch not in RS_ROLLBACK_ARCHS:
                raise ValueError(f"architecture {model.arch!r} has no partial recurrent rollback "
                                 "(n_rs_seq); use state checkpoints")
            if is_mtp:
                raise ValueError("n_rs_seq is for the target context; the MTP context is plain KV")
        if batch_invariant and model.use_extra_bufts:
            raise ValueError("batch_invariant needs the model loaded with Model(..., "
                             "use_extra_bufts=False): repacked weights run kernels that depend on "
                             "the batch's row count")

        cdef llama_context_params p = llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = min(n_ubatch, n_batch)
        p.n_seq_max = n_seq_max
        p.n_rs_seq = n_rs_seq
        p.n_outputs_max = n_outputs_max
        p.n_threads = n_threads
        p.n_threads_batch = n_threads_batch
        p.ctx_type = LLAMA_CONTEXT_TYPE_MTP if is_mtp else LLAMA_CONTEXT_TYPE_DEFAULT
        p.no_perf = False
        p.swa_full = swa_full
        if kv_unified is not None:
            p.kv_unified = kv_unified
        if offload_kqv is not None:
            p.offload_kqv = bool(offload_kqv)
        if flash_attn is not None:
            p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else LLAMA_FLASH_ATTN_TYPE_DISABLED
        p.abort_callback = _abort_cb
        p.abort_callback_data = <void *> &self._stop
        if lazy_logits:
            self._head.enabled = True
            self._head.n_threads = n_threads
            p.cb_eval = sd_lm_head_cb
            p.cb_eval_user_data = <void *> self._head
        _clear_recent()
        cdef string why
        cdef int rrc = SD_REMOTE_OK
        cdef bint remote = model.is_remote
        with nogil:
            if remote:
                rrc = sd_remote_init(model.model, p, &self.ctx, model._timeout, why)
            else:
                self.ctx = sd_init_from_model(model.model, p)
        if rrc != SD_REMOTE_OK:
            self.ctx = NULL
            model._remote_failed(rrc, why, "context creation")
        _raise_abort("creating the context")
        if self.ctx == NULL:
            why_s = _recent_errors()
            raise ValueError("failed to create the context" + (f": {why_s}" if why_s else ""))
        self.model = model
        if batch_invariant:
            other = sd_first_non_cpu_backend(self.ctx).decode()
            if other:
                llama_free(self.ctx)
                self.ctx = NULL
                raise ValueError(f"batch_invariant (exact mode) holds on the CPU backend only; this "
                                 f"context also computes on {other!r}, whose kernels are chosen "
                                 f"by row count")
            sd_set_batch_invariant(self.ctx, True)
        self.batch_invariant = batch_invariant
        model._n_contexts += 1
        self.mem = llama_get_memory(self.ctx)
        # llama.cpp allocates whole multiples of 256 positions; the context holds what was asked
        self.n_ctx = min(llama_n_ctx(self.ctx), n_ctx)
        self.n_ctx_seq = min(llama_n_ctx_seq(self.ctx),
                             n_ctx if p.kv_unified else n_ctx // n_seq_max)
        self.n_batch = llama_n_batch(self.ctx)
        self.n_ubatch = llama_n_ubatch(self.ctx)
        self.n_seq_max = llama_n_seq_max(self.ctx)
        self.n_rs_seq = llama_n_rs_seq(self.ctx)
        self.n_threads = n_threads
        self.is_mtp = is_mtp
        self.n_vocab = model.n_vocab
        self._n_embd_in = model.n_embd_out if is_mtp else llama_model_n_embd_inp(model.model)
        self._needs_rs_guard = (model.is_recurrent or model.is_hybrid) and not is_mtp
        self._rs_trim = self._rs_trim_possible()
        self._rs_budget = vector[int32_t](self.n_seq_max, 0)
        self._last_n_tokens = 0
        self._nextn = 0
        # llama.cpp asserts a decode's outputs fit n_outputs_max (0: n_batch; encoders: n_batch)
        self._n_outputs_max = (n_outputs_max if n_outputs_max > 0
                               and not llama_model_has_encoder(model.model) else self.n_batch)
        if self.n_rs_seq > 0 and self.n_ubatch <= self.n_rs_seq + 1:
            raise ValueError(f"n_rs_seq={self.n_rs_seq} needs n_ubatch >= {self.n_rs_seq + 2}, "
                             f"llama.cpp made n_ubatch={self.n_ubatch}")
        if n_rs_seq > 0 and self.n_rs_seq != n_rs_seq:
            raise ValueError(f"llama.cpp kept n_rs_seq={self.n_rs_seq}, not {n_rs_seq}")
        if is_mtp:
            self.set_nextn(nextn or "masked")
        elif nextn is not None:
            self.set_nextn(nextn)

    def __dealloc__(self):
        if self.ctx != NULL:
            self._free()
        if self._closed_ctx != NULL:
            self._free_ptr(self._closed_ctx)
            self._closed_ctx = NULL
        del self._head
        self._head = NULL

    cdef void _free_ptr(self, llama_context * ctx) noexcept:
        # a context of a model whose RPC server died is left allocated (see RPCError)
        cdef string why
        cdef Model m = self.model
        if m is None or not m._remote_dead():
            if m is not None and m.is_remote:
                with nogil:
                    sd_remote_free_context(ctx, m._timeout, why)
            else:
                llama_free(ctx)

    cdef void _free(self) noexcept:
        self._free_ptr(self.ctx)
        self.ctx = NULL
        if self.model is not None:
            self.model._n_contexts -= 1

    def close(self):
        """Free llama.cpp's context now. While a view of its outputs (``logits()`` ...) is
        alive the memory is kept, and freed with the last view; the context is closed either way."""
        self._enter()
        try:
            if self.ctx != NULL:
                self._closed_ctx = self.ctx
                self.ctx = NULL
                self.model._n_contexts -= 1
                self._free_closed()
        finally:
            self._leave()

    cdef void _free_closed(self) noexcept:
        if self._closed_ctx != NULL and self._n_views == 0:
            self._free_ptr(self._closed_ctx)
            self._closed_ctx = NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"Context(kind={'mtp' if self.is_mtp else 'default'!r}, n_ctx={self.n_ctx}, "
                f"n_batch={self.n_batch}, n_seq_max={self.n_seq_max}, n_rs_seq={self.n_rs_seq})")

    @staticmethod
    def _check_mtp_model(Model model, bint is_mtp):
        # a target only needs the arch's trunk to emit h_nextn: a trunk-only file can feed
        # the MTP head of a separate MTP-only file (llama.cpp's -md)
        if is_mtp and model.n_layer_nextn <= 0:
            raise ValueError(f"model {os.path.basename(model.path)!r} ({model.arch}) has no MTP "
                             "(NextN) layers")
        if model.arch not in MTP_ARCHS:
            raise ValueError(f"architecture {model.arch!r} has no MTP graph in llama.cpp")
        if is_mtp and not model.mtp_loaded:
            raise ValueError("the model was loaded with load_mtp=False: reload it with "
                             "Model(path, load_mtp=True) to create an MTP context")
        if is_mtp and model.arch not in MTP_MULTI_HEAD_ARCHS and model.n_layer_nextn != 1:
            raise ValueError(f"llama.cpp's {model.arch} MTP graph takes exactly one NextN layer, "
                             f"the model has {model.n_layer_nextn}")

    cdef int _enter(self) except -1:
        # the GIL makes this check-and-set atomic between Python threads
        if self._busy:
            raise ContextBusyError("this Context is in use by another thread; use one Context "
                                   "per thread")
        self._busy = 1
        return 0

    cdef void _leave(self) noexcept:
        self._busy = 0

    cdef int _alive(self) except -1:
        if self.ctx == NULL:
            if self._aborted is not None:
                raise LlamaAbortError("this Context is unusable after llama.cpp aborted in "
                                      f"{self._aborted[0]}", self._aborted[1])
            raise RuntimeError("Context is closed")
        if self.model.is_remote:
            self.model._alive()
        return 0

    cdef int _check_abort(self, str what) except -1:
        """After a guarded call: if llama.cpp aborted in it, the context's state is
        half-updated; free it (as ``close``) and raise LlamaAbortError."""
        aborted = _take_abort()
        if aborted is None:
            return 0
        self._aborted = (what, aborted)
        self._last_n_tokens = 0
        self._out_row.clear()
        self._leave()   # the call that aborted is over, whether or not it was entered
        self.close()
        raise LlamaAbortError(f"{what} on this Context; it is freed and unusable", aborted)

    # --- settings ---------------------------------------------------------------------

    def set_nextn(self, mode):
        """Hidden states for MTP: None (off), "masked" (output rows) or "dense" (every row)."""
        self._alive()
        if mode not in (None, "masked", "dense"):
            raise ValueError(f"mode must be None, 'masked' or 'dense', got {mode!r}")
        if mode is not None:
            self._check_mtp_model(self.model, False)
            if self._head.enabled and self.model.arch not in LAZY_NEXTN_ARCHS:
                raise ValueError(f"nextn hidden states and lazy_logits go together only on "
                                 f"{sorted(LAZY_NEXTN_ARCHS)}")
        # llama.cpp's MTP graphs keep every row in h_nextn, so "masked" on an MTP context is
        # only right when every row is an output; "dense" is right for mixed batches
        if self.is_mtp and mode is None:
            raise ValueError("an MTP context always outputs its hidden states")
        self._nextn = 0 if mode is None else (1 if mode == "masked" else 2)
        llama_set_embeddings_nextn(self.ctx, mode is not None, mode == "masked")

    @property
    def nextn(self):
        return (None, "masked", "dense")[self._nextn]

    @property
    def rs_trim(self):
        """Whether decode graphs write only the recurrent snapshots their batch can roll back
        (``min(n_rs_seq, tokens per sequence - 1)``; none for one-token decodes) instead of
        all ``n_rs_seq``. On by default where supported (``RS_TRIM_ARCHS``, see
        ``_rs_graph.h``); outputs are the same either way, it only saves time."""
        return self._rs_trim

    @rs_trim.setter
    def rs_trim(self, value):
        value = bool(value)
        if value and not self._rs_trim_possible():
            raise ValueError(f"rs_trim needs n_rs_seq > 0 and an arch in {sorted(RS_TRIM_ARCHS)}")
        self._rs_trim = value

    def _rs_trim_possible(self):
        return self.n_rs_seq > 0 and self.model.arch in RS_TRIM_ARCHS

    def set_nextn_layer_offset(self, offset):
        """Pick which appended NextN head an MTP context runs (multi-head archs only)."""
        self._alive()
        offset = _int_arg("offset", offset, I32_MIN, I32_MAX)
        if not self.is_mtp:
            raise ValueError("the NextN layer offset applies to MTP contexts")
        if not 0 <= offset < self.model.n_layer_nextn:
            raise ValueError(f"offset {offset} out of range [0, {self.model.n_layer_nextn})")
        if offset and self.model.arch not in MTP_MULTI_HEAD_ARCHS:
            raise ValueError(f"{self.model.arch} runs a single MTP head")
        llama_set_nextn_layer_offset(self.ctx, offset)

    def set_threads(self, n_threads, n_threads_batch=None):
        self._alive()
        _check_positive("n_threads", n_threads)
        nb = n_threads if n_threads_batch is None else n_threads_batch
        _check_positive("n_threads_batch", nb)
        _check_threads(n_threads, nb)
        llama_set_n_threads(self.ctx, n_threads, nb)
        self.n_threads = n_threads
        self._head.n_threads = n_threads

    @property
    def lazy_logits(self) -> str:
        """The lazy LM head: ``"off"``, ``"pending"`` (enabled, the first decode finds the
        output weight), ``"on"``, or why it cannot run on this model."""
        if not self._head.enabled:
            return "off"
        if self._head.state == 0:
            return "pending"
        if self._head.state == 1:
            return "on"
        return "unavailable: " + self._head.why.decode()

    @property
    def lazy_logits_kernel(self) -> str:
        """The lazy head's kernel: ``"fused-q8_0"`` (a Q8_0 head, every hidden row of a pass
        per weight row, checked bit-identical to ggml's vec_dot at first use), ``"vec_dot"``
        (ggml's own, per row pair), or ``""`` before the first lazy decode's logits."""
        if self._head.state != 1 or (self._head.is_q8_0 and self._head.fused == 0):
            return ""
        return "fused-q8_0" if self._head.is_q8_0 and self._head.fused == 1 else "vec_dot"

    def interrupt(self):
        """Ask a running decode to stop (safe from any thread); it raises ``KeyboardInterrupt``.
        A SIGINT (Ctrl-C) stops a decode on the main thread the same way, between graph nodes."""
        self._stop.requested = True

    # --- decode -----------------------------------------------------------------------

    cdef int decode_c(self, Batch batch) except -1:
        """Validate, decode with the GIL released, record which rows have outputs."""
        self._alive()
        cdef int n = batch.b.n_tokens
        cdef int i, k
        cdef llama_seq_id s
        cdef llama_pos p
        cdef int n_vocab = self.n_vocab
        if n <= 0:
            raise ValueError("cannot decode an empty batch")
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        if self.is_mtp:
            if batch.n_embd != self._n_embd_in:
                raise ValueError(f"an MTP context needs batches with a token and a hidden row of "
                                 f"{self._n_embd_in} floats per entry (Batch(n_embd=...)), got "
                                 f"n_embd={batch.n_embd}")
        elif batch.n_embd != 0:
            raise ValueError("this context decodes token batches; the batch carries embedding rows")
        cdef vector[int32_t] seq_ntok = vector[int32_t](self.n_seq_max, 0)
        cdef int n_out = 0
        for i in range(n):
            n_out += batch.b.logits[i] != 0
            if batch.b.token[i] < 0 or batch.b.token[i] >= n_vocab:
                raise ValueError(f"token id {batch.b.token[i]} at batch index {i} out of range "
                                 f"[0, {n_vocab})")
            p = batch.b.pos[i]
            if p < 0:
                raise ValueError(f"negative position {p} at batch index {i}")
            if batch.b.n_seq_id[i] < 1 or batch.b.n_seq_id[i] > self.n_seq_max:
                raise ValueError(f"batch index {i} has {batch.b.n_seq_id[i]} sequence ids")
            for k in range(batch.b.n_seq_id[i]):
                s = batch.b.seq_id[i][k]
                if s < 0 or s >= self.n_seq_max:
                    raise ValueError(f"sequence id {s} out of range [0, {self.n_seq_max})")
                if p >= self.n_ctx_seq:
                    raise ContextFullError(f"position {p} of sequence {s} is past the context "
                                           f"size n_ctx={self.n_ctx_seq}")
                seq_ntok[s] += 1
        if n_out > self._n_outputs_max:
            raise ValueError(f"the batch asks for {n_out} output rows; this context holds at most "
                             f"{self._n_outputs_max} (n_outputs_max)")
        # the lazy LM head stops the graph at the norm; it needs the outputs in batch order,
        # i.e. one ubatch (split_simple keeps the order within it) of a single sequence.
        # The snapshots the batch can need: a sequence of m tokens rolls back at most m - 1
        cdef int n_seqs_in = 0, most = 0
        for s in range(self.n_seq_max):
            n_seqs_in += seq_ntok[s] > 0
            most = max(most, seq_ntok[s])
        self._head.active = (self._head.enabled and self._head.state == 1 and n <= self.n_ubatch
                             and n_seqs_in == 1)
        sd_lm_head_begin(self._head)
        self._lazy = False
        cdef bint trim = self._rs_trim
        cdef bint remote = self.model.is_remote
        cdef double timeout = self.model._timeout
        cdef uint32_t n_trim = <uint32_t>min(self.n_rs_seq, most - 1)
        cdef int rrc = SD_REMOTE_OK
        cdef string why
        self._enter()
        cdef int32_t rc = 0
        try:
            self._stop.requested = False
            _stop_begin(&self._stop)
            with nogil:
                if remote:
                    rrc = sd_remote_decode(self.ctx, batch.b, trim, n_trim, self.n_rs_seq, &rc,
                                           timeout, why)
                else:
                    if trim:
                        sd_set_graph_n_rs_seq(self.ctx, n_trim)
                    rc = sd_decode(self.ctx, batch.b)
                    if trim:
                        sd_set_graph_n_rs_seq(self.ctx, <uint32_t>self.n_rs_seq)
        finally:
            _stop_end(&self._stop)
            self._leave()
        if rrc != SD_REMOTE_OK:
            self._last_n_tokens = 0
            self._out_row.clear()
            self.model._remote_failed(rrc, why, "a decode")
        self._check_abort("decode")
        if rc != 0:
            self._last_n_tokens = 0
            self._out_row.clear()
            for s in range(self.n_seq_max):
                self._rs_budget[s] = 0
            if rc == 1:
                raise ContextFullError(f"no room in the KV cache for {n} tokens (n_ctx={self.n_ctx})")
            if rc == 2:
                # Ctrl-C: Python raises its KeyboardInterrupt here; interrupt(): ours
                requested = self._stop.requested
                self._stop.requested = False
                if not requested:
                    _raise_pending()
                raise KeyboardInterrupt("decode interrupted")
            why_s = _recent_errors()
            raise DecodeError(f"llama_decode failed ({rc})" + (f": {why_s}" if why_s else ""))
        self._last_n_tokens = n
        self._out_row.resize(n)
        k = 0
        for i in range(n):
            self._out_row[i] = k if batch.b.logits[i] else -1
            k += batch.b.logits[i] != 0
        if self._head.enabled and self._head.state == 1 and self._head.n_vocab != n_vocab:
            self._head.state = -1
            self._head.why = b"the output weight's rows are not the vocabulary"
        if self._head.active:
            if self._head.captured and self._head.n_rows == k:
                self._lazy = True
                sd_lm_head_end(self._head)
            elif self._head.captured:
                # the graph stopped at the norm but its rows are not the outputs: nothing
                # holds this decode's logits; never seen (one ubatch, one sequence)
                self._head.state = -1
                self._head.why = b"result_norm rows differ from the outputs"
                self._last_n_tokens = 0
                raise DecodeError(f"lazy LM head: {self._head.n_rows} norm rows for {k} outputs; "
                                  "lazy logits are now off, decode again")
            else:   # no result_norm node: the graph ran on, llama.cpp's logits stand
                self._head.state = -1
                self._head.why = b"the graph has no result_norm node"
        for s in range(self.n_seq_max):
            self._rs_budget[s] = min(self.n_rs_seq, seq_ntok[s] - 1) if seq_ntok[s] > 0 else 0
        if _pending:
            _raise_pending()
        return 0

    def decode(self, Batch batch not None):
        """Decode a batch (GIL released). Outputs are readable until the next decode."""
        self.decode_c(batch)

    cdef float * logits_c(self, int i) noexcept nogil:
        if i < 0 or i >= self._last_n_tokens or self._out_row[i] < 0:
            return NULL
        cdef int r
        if self._lazy:
            r = self._out_row[i]
            if not self._head.done[r]:
                sd_lm_head_compute(self._head, r, r + 1)
            return self._head.logits.data() + <size_t>r * self.n_vocab
        return llama_get_logits_ith(self.ctx, i)

    cdef void prepare_logits_c(self, int i0, int n) noexcept nogil:
        """Compute the logits of batch rows ``i0 .. i0+n-1`` in one pass (lazy head only)."""
        if not self._lazy or n <= 0 or i0 < 0 or i0 + n > self._last_n_tokens:
            return
        cdef int r0 = -1, r1 = -1, i
        for i in range(i0, i0 + n):
            if self._out_row[i] >= 0:
                if r0 < 0:
                    r0 = self._out_row[i]
                r1 = self._out_row[i] + 1
        if r0 >= 0:
            sd_lm_head_compute(self._head, r0, r1)

    def prepare_logits(self, i0, n):
        """Compute the logits of ``n`` rows from batch index ``i0`` at once: with
        ``lazy_logits`` one pass over the LM head serves them all; otherwise a no-op."""
        i0 = _int_arg('i0', i0, I32_MIN, I32_MAX)
        n = _int_arg('n', n, I32_MIN, I32_MAX)
        self._alive()
        self.prepare_logits_c(i0, n)

    cdef float * nextn_c(self, int i) noexcept nogil:
        if self._nextn == 0 or i < 0 or i >= self._last_n_tokens:
            return NULL
        if self._nextn == 1 and self._out_row[i] < 0:
            return NULL
        return llama_get_embeddings_nextn_ith(self.ctx, i)

    cdef int _row_index(self, int i, str what) except -1:
        self._alive()
        if i < 0:
            i += self._last_n_tokens
        if not 0 <= i < self._last_n_tokens:
            raise IndexError(f"batch index {i} out of range for the last decode "
                             f"({self._last_n_tokens} tokens)")
        if what == "logits" and self._out_row[i] < 0:
            raise IndexError(f"batch index {i} was not marked for output")
        return i

    def logits(self, i=-1):
        """The logits of batch entry ``i`` of the last decode: a read-only view, valid until the next decode."""
        i = _int_arg('i', i, I32_MIN, I32_MAX)
        i = self._row_index(i, "logits")
        cdef float * p = self.logits_c(i)
        if p == NULL:
            raise IndexError(f"no logits for batch index {i}")
        return _view(self, p, -1, self.n_vocab)

    def nextn_hidden(self, i=-1):
        """The nextn hidden state (MTP input) of batch entry ``i``: a read-only view."""
        i = _int_arg('i', i, I32_MIN, I32_MAX)
        if self._nextn == 0:
            raise ValueError("nextn hidden states are off: set_nextn('masked' or 'dense') first")
        i = self._row_index(i, "logits" if self._nextn == 1 else "nextn")
        cdef float * p = self.nextn_c(i)
        if p == NULL:
            raise IndexError(f"no nextn hidden state for batch index {i}")
        return _view(self, p, -1, self.model.n_embd_out)

    def nextn_hidden_rows(self):
        """Every nextn row of the last decode as one (rows, n_embd) view (dense: one per entry)."""
        if self._nextn == 0:
            raise ValueError("nextn hidden states are off")
        self._alive()
        cdef int rows = self._last_n_tokens
        cdef int i
        if self._nextn == 1:
            rows = 0
            for i in range(self._last_n_tokens):
                rows += self._out_row[i] >= 0
        if rows == 0:
            raise IndexError("the last decode produced no nextn rows")
        cdef float * p = llama_get_embeddings_nextn(self.ctx)
        if p == NULL:
            raise IndexError("no nextn hidden states")
        return _view(self, p, rows, self.model.n_embd_out)

    # --- memory -----------------------------------------------------------------------

    cdef int _check_seq(self, llama_seq_id seq, bint allow_all) except -1:
        if allow_all and seq == -1:
            return 0
        if seq < 0 or seq >= self.n_seq_max:
            raise ValueError(f"sequence id {seq} out of range [0, {self.n_seq_max})")
        return 0

    cdef int seq_rm_c(self, llama_seq_id seq, llama_pos p0, llama_pos p1) except -1:
        """Remove positions [p0, p1) of ``seq``; 1 if done, 0 if llama.cpp refused."""
        self._alive()
        self._check_seq(seq, True)
        cdef llama_pos pmax
        cdef int rollback, s
        cdef int s0 = 0 if seq == -1 else seq
        cdef int s1 = self.n_seq_max if seq == -1 else seq + 1
        if self._needs_rs_guard and p0 > 0 and p1 < 0:
            # partial removal of a recurrent state: only the last decode, by its snapshots
            for s in range(s0, s1):
                pmax = llama_memory_seq_pos_max(self.mem, s)
                rollback = pmax - (p0 - 1)
                if rollback > 0 and rollback > self._rs_budget[s]:
                    raise ValueError(
                        f"cannot roll sequence {s} back by {rollback} tokens: the last decode "
                        f"allows {self._rs_budget[s]} (n_rs_seq={self.n_rs_seq}, only the tokens "
                        "of the last decode, once)")
        cdef bint ok = sd_memory_seq_rm(self.mem, seq, p0, p1)
        self._check_abort("seq_rm")
        if ok and self._needs_rs_guard:
            for s in range(s0, s1):
                self._rs_budget[s] = 0
        return 1 if ok else 0

    def seq_rm(self, seq, p0=-1, p1=-1) -> bool:
        """Remove positions [p0, p1) (negative = open) of ``seq`` (-1: every sequence)."""
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        p0 = _int_arg('p0', p0, I32_MIN, I32_MAX)
        p1 = _int_arg('p1', p1, I32_MIN, I32_MAX)
        self._enter()
        try:
            return self.seq_rm_c(seq, p0, p1) == 1
        finally:
            self._leave()

    def seq_cp(self, src, dst, p0=-1, p1=-1):
        src = _int_arg('src', src, I32_MIN, I32_MAX)
        dst = _int_arg('dst', dst, I32_MIN, I32_MAX)
        p0 = _int_arg('p0', p0, I32_MIN, I32_MAX)
        p1 = _int_arg('p1', p1, I32_MIN, I32_MAX)
        self._alive()
        self._check_seq(src, False)
        self._check_seq(dst, False)
        if self._needs_rs_guard and (p0 >= 0 or p1 >= 0):
            raise ValueError("recurrent state can only be copied whole (p0 = p1 = -1)")
        if self.n_seq_max > 1 and src != dst and (p0 > 0 or 0 < p1 < llama_n_ctx_seq(self.ctx) - 1):
            # with one KV stream per sequence llama.cpp aborts on a partial cross-stream copy
            # (its test: the range must cover the stream's whole allocated size)
            raise ValueError("with several sequences only whole sequences can be copied "
                             "(p0 = p1 = -1)")
        self._enter()
        try:
            sd_memory_seq_cp(self.mem, src, dst, p0, p1)
        finally:
            self._leave()
        self._check_abort("seq_cp")

    def seq_keep(self, seq):
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        self._alive()
        self._check_seq(seq, False)
        self._enter()
        try:
            sd_memory_seq_keep(self.mem, seq)
        finally:
            self._leave()
        self._check_abort("seq_keep")

    cdef llama_pos pos_max_c(self, llama_seq_id seq) noexcept nogil:
        return llama_memory_seq_pos_max(self.mem, seq)

    def seq_pos_min(self, seq) -> int:
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        self._alive()
        self._check_seq(seq, False)
        return llama_memory_seq_pos_min(self.mem, seq)

    def seq_pos_max(self, seq) -> int:
        """The last position held for ``seq``, -1 when empty."""
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        self._alive()
        self._check_seq(seq, False)
        return llama_memory_seq_pos_max(self.mem, seq)

    def clear(self, bint data=True):
        """Forget every sequence."""
        self._alive()
        cdef string why
        cdef int rrc = SD_REMOTE_OK
        self._enter()
        try:
            if self.model.is_remote:
                with nogil:
                    rrc = sd_remote_clear(self.ctx, data, self.model._timeout, why)
                self.model._remote_failed(rrc, why, "clearing the memory")
            else:
                sd_memory_clear(self.mem, data)
            for s in range(self.n_seq_max):
                self._rs_budget[s] = 0
            self._last_n_tokens = 0
        finally:
            self._leave()
        self._check_abort("clear")

    # --- checkpoints ------------------------------------------------------------------

    cdef int save_state_c(self, llama_seq_id seq, uint32_t flags, vector[uint8_t] & out) except -1:
        self._alive()
        self._check_seq(seq, False)
        cdef size_t n = sd_state_seq_get_size(self.ctx, seq, flags)
        self._check_abort("save_state")
        out.resize(n)
        cdef size_t got = 0
        cdef string why
        cdef int rrc = SD_REMOTE_OK
        with nogil:
            if self.model.is_remote:
                rrc = sd_remote_state_get(self.ctx, out.data(), n, seq, flags, &got,
                                          self.model._timeout, why)
            else:
                got = sd_state_seq_get_data(self.ctx, out.data(), n, seq, flags)
        self.model._remote_failed(rrc, why, "saving a state")
        self._check_abort("save_state")
        if got != n:
            raise RuntimeError(f"saving the state of sequence {seq} failed")
        return 0

    cdef int load_state_c(self, llama_seq_id seq, uint32_t flags, const vector[uint8_t] & data) except -1:
        self._alive()
        self._check_seq(seq, False)
        cdef size_t got = 0
        cdef string why
        cdef int rrc = SD_REMOTE_OK
        with nogil:
            if self.model.is_remote:
                rrc = sd_remote_state_set(self.ctx, data.data(), data.size(), seq, flags, &got,
                                          self.model._timeout, why)
            else:
                got = sd_state_seq_set_data(self.ctx, data.data(), data.size(), seq, flags)
        self.model._remote_failed(rrc, why, "restoring a state")
        self._check_abort("load_state")
        if got == 0:
            raise ValueError(f"restoring the state of sequence {seq} failed (wrong or corrupt data)")
        for s in range(self.n_seq_max):
            self._rs_budget[s] = 0
        return 0

    def save_state(self, seq=0, *, bint partial=False) -> bytes:
        """A checkpoint of one sequence. ``partial`` keeps only the recurrent/SWA parts,
        for rolling back hybrid models whose attention KV is trimmed with ``seq_rm``."""
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        cdef vector[uint8_t] out
        self._enter()
        try:
            self.save_state_c(seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0, out)
        finally:
            self._leave()
        return (<char *> out.data())[:out.size()] if out.size() else b""

    def load_state(self, data, seq=0, *, bint partial=False):
        """Restore a checkpoint made by ``save_state`` (with the same ``partial``)."""
        seq = _int_arg('seq', seq, I32_MIN, I32_MAX)
        cdef bytes b = bytes(data)
        if len(b) == 0:
            raise ValueError("empty state")
        cdef vector[uint8_t] buf = vector[uint8_t](len(b))
        memcpy(buf.data(), <const char *> b, len(b))
        self._enter()
        try:
            self.load_state_c(seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0, buf)
        finally:
            self._leave()

    # --- perf -------------------------------------------------------------------------

    def perf(self) -> dict:
        """llama.cpp's own counters: prompt/eval times (ms) and token counts."""
        self._alive()
        cdef llama_perf_context_data d = llama_perf_context(self.ctx)
        return {"t_load_ms": d.t_load_ms, "t_p_eval_ms": d.t_p_eval_ms, "t_eval_ms": d.t_eval_ms,
                "n_p_eval": d.n_p_eval, "n_eval": d.n_eval, "n_reused": d.n_reused}

    def perf_reset(self):
        self._alive()
        llama_perf_context_reset(self.ctx)


#: what a drafter may use of its target context; everything else stays with the controller
_VIEW_ATTRS = frozenset({
    "model", "n_vocab", "n_ctx", "n_ctx_seq", "n_batch", "n_ubatch", "n_seq_max", "n_rs_seq",
    "n_threads", "is_mtp", "nextn", "lazy_logits", "logits", "prepare_logits", "nextn_hidden",
    "nextn_hidden_rows", "seq_pos_min", "seq_pos_max", "tokenize", "detokenize",
})


cdef class TargetView:
    """The target context as a drafter sees it: model facts, the last decode's outputs and
    the sequences' positions, read only.

    The controller owns the target's memory: a drafter that removed or cleared positions, or
    decoded into it, would change the output speculative decoding promises to keep. Built-in
    drafters reach the context itself at C level (``Drafter._target``)."""

    def __init__(self, Context ctx not None):
        if self._ctx is not None:
            raise RuntimeError("a TargetView stays on the context it was made for")
        self._ctx = ctx

    def __repr__(self):
        return f"TargetView({self._ctx!r})"

    def __getattr__(self, name):
        if name in _VIEW_ATTRS:
            return getattr(self._ctx, name)
        if hasattr(Context, name) and not name.startswith("__"):
            raise AttributeError(f"drafters see the target read-only: Context.{name} is not "
                                 "available to them (the controller owns the target's memory)")
        raise AttributeError(f"'TargetView' object has no attribute {name!r}")

    def __dir__(self):
        return sorted(_VIEW_ATTRS)

    def tokenize(self, text, **kw) -> list:
        return self._ctx.model.tokenize(text, **kw)

    def detokenize(self, tokens, **kw) -> str:
        return self._ctx.model.detokenize(tokens, **kw)


def default_threads() -> int:
    """Threads for decoding: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)
