"""A TCP proxy on 127.0.0.1 that delays every chunk it forwards by a fixed one-way latency.

Network latency without root or ``tc netem``: each direction of a connection is a pair of
threads, one stamping chunks as they arrive and one writing each ``delay_s`` after its stamp,
in order. A request/response round trip pays twice the delay; bandwidth stays the loopback's.
Threads and ``time.sleep`` rather than asyncio: epoll rounds its timeouts up to whole
milliseconds, which would turn 0.5 ms into 1 ms.

In front of a client in the same process, run it as its own process (``python -m
specdec.testing.latency_proxy --port P --upstream HOST:PORT --delay-ms D``): a call that holds
the GIL while it waits on the network (a model load) would otherwise starve the proxy's threads.
"""
from __future__ import annotations

import collections
import socket
import threading
import time
from typing import List, Optional, Sequence, Tuple


class LatencyProxy:
    """``LatencyProxy(("127.0.0.1", 50052), delay_s=0.002)`` listens on a free local port
    (``.port``, ``.endpoint``) and forwards every connection to ``upstream`` with ``delay_s``
    added in each direction. ``close()`` (or ``with``) stops it and drops its connections."""

    def __init__(self, upstream: Tuple[str, int], delay_s: float, *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.upstream = (upstream[0], int(upstream[1]))
        self.delay_s = float(delay_s)
        self._listener = socket.create_server((host, port))
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        self._socks: List[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="latency-proxy", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return          # closed
            try:
                up = socket.create_connection(self.upstream)
            except OSError:
                down.close()
                continue
            for s in (down, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    down.close()
                    up.close()
                    return
                self._socks += [down, up]
            self._pipe(down, up)
            self._pipe(up, down)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        """One direction: a reader stamps chunks, a writer sends each when it is due."""
        chunks: collections.deque = collections.deque()
        ready = threading.Condition()

        def read() -> None:
            while True:
                try:
                    data = src.recv(1 << 20)
                except OSError:
                    data = b""
                with ready:
                    chunks.append((time.monotonic() + self.delay_s, data))
                    ready.notify()
                if not data:
                    return

        def write() -> None:
            while True:
                with ready:
                    while not chunks:
                        ready.wait()
                    due, data = chunks.popleft()
                if not data:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._socks = self._socks, []
        self._listener.close()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self) -> "LatencyProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specdec.testing.latency_proxy",
                                 description=LatencyProxy.__doc__)
    ap.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    ap.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay per message")
    args = ap.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    proxy = LatencyProxy((host, int(port)), args.delay_ms / 1000.0, port=args.port)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
