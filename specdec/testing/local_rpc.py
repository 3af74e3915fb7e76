"""Local ``specdec rpc-server`` processes standing in for remote machines, optionally behind
a latency-adding proxy (``LatencyProxy``): for tests and the RPC benchmark cases."""
from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: Sequence[str], port: int, what: str, timeout_s: float) -> subprocess.Popen:
    """``python -m ARGS`` serving 127.0.0.1:``port``, returned once the port accepts."""
    # outside the source tree: a checkout's specdec/ folder would shadow the installed package
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} on port {port} exited ({proc.returncode})")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{what} on port {port} did not start within {timeout_s:.0f} s")


def start_rpc_server(port: int, *, threads: int = 1, extra: Sequence[str] = (),
                     timeout_s: float = 60.0) -> subprocess.Popen:
    """``specdec rpc-server`` on 127.0.0.1:``port``, returned once the port accepts."""
    return _start(["specdec", "rpc-server", "--port", str(port), "--threads", str(threads),
                   *extra], port, "rpc-server", timeout_s)


def start_latency_proxy(port: int, upstream_port: int, delay_ms: float,
                        timeout_s: float = 30.0) -> subprocess.Popen:
    """A ``LatencyProxy`` process on 127.0.0.1:``port`` in front of 127.0.0.1:``upstream_port``."""
    return _start(["specdec.testing.latency_proxy", "--port", str(port), "--upstream",
                   f"127.0.0.1:{upstream_port}", "--delay-ms", str(delay_ms)], port,
                  "latency proxy", timeout_s)


class LocalRpcServers:
    """``n`` local RPC servers; ``.endpoints`` is the ``"host:port,..."`` string for
    ``rpc_servers=``. With ``delay_ms`` every endpoint is a ``LatencyProxy`` (in a process of
    its own) adding that one-way delay to each message. Free every model placed on them before ``close()``:
    llama.cpp's client cannot free remote memory once its server is gone."""

    def __init__(self, n: int = 2, *, threads: int = 1, delay_ms: Optional[float] = None,
                 extra: Sequence[str] = ()) -> None:
        self.procs: List[subprocess.Popen] = []
        self.proxies: List[subprocess.Popen] = []
        self.delay_ms = delay_ms
        try:
            ports = [free_port() for _ in range(n)]
            self.procs = [start_rpc_server(p, threads=threads, extra=extra) for p in ports]
            if delay_ms is not None:
                fronts = [free_port() for _ in ports]
                self.proxies = [start_latency_proxy(f, p, delay_ms) for f, p in zip(fronts, ports)]
                ports = fronts
            eps = [f"127.0.0.1:{p}" for p in ports]
        except BaseException:
            self.close()
            raise
        self.endpoints = ",".join(eps)

    def close(self) -> None:
        for p in self.proxies + self.procs:
            p.kill()
            p.wait()
        self.proxies, self.procs = [], []

    def __enter__(self) -> "LocalRpcServers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
