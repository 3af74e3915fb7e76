# Part of _core (included by _core.pyx): backends, devices and RPC servers, the places a
# model's layers may go.

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
              cache_dir=None, bint batch_invariant=False) -> None:
    """Serve this build's devices to RPC clients (llama.cpp's ggml_backend_rpc_start_server,
    as tools/rpc/rpc-server does); blocks for ever. ``devices``: device names (see
    ``devices()``); by default the GPUs, else the CPU. ``batch_invariant``: the CPU computes
    with ggml's reference kernels, as a local exact-mode context does, so that clients can
    run exact mode (slower: no tiled matmul, no fused ops). Anyone who reaches the port can run
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
    if batch_invariant:
        for i in range(devs.size()):
            if ggml_backend_dev_type_of(devs[i]) != GGML_BACKEND_DEVICE_TYPE_CPU:
                raise ValueError(f"batch_invariant serves CPU devices only; "
                                 f"{_device_dict(devs[i])['name']!r} is not one")
            devs[i] = sd_ref_cpu_device_of(devs[i])
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


cdef vector[cbool] _COMPUTABLE


cdef vector[cbool] _computable_types():
    """ggml_type_traits()'s ``computable`` flag by type id, for the graph check
    (_graph_check.h), computed once."""
    if _COMPUTABLE.empty():
        _COMPUTABLE.assign(<int>GGML_TYPE_COUNT, False)
        for i, (_, _, _, ok) in ggml_type_traits().items():
            _COMPUTABLE[i] = ok
    return _COMPUTABLE


def release_threads() -> bool:
    """Give back the OpenMP worker threads this thread keeps from its decodes (``_omp_pool.h``).

    Call it from a thread that is done decoding for now: while idle threads keep theirs, a
    process's OpenMP pools can outnumber its CPUs, and libgomp then makes every decoding
    team sleep between its regions (30-35% slower here). The thread's next decode makes its
    workers again. True if any were given back or none were kept; False where the runtime
    has no such call (no OpenMP, or not libgomp) or inside a parallel region."""
    cdef cbool done
    with nogil:
        done = sd_release_omp_pool()
    return done


def default_threads() -> int:
    """Threads for decoding: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)
