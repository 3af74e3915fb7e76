"""The RPC benchmark cases: local rpc-servers behind a latency-adding proxy."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from specdec.benchmark import matrix, plots, report
from specdec.benchmark.prompts import Prompt
from specdec.benchmark.runner import INJECT_ENV, Runner
from specdec.testing.latency_proxy import LatencyProxy


@pytest.fixture
def echo_server():
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                while data := c.recv(65536):
                    c.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()
    srv.close()


def _round_trips(port: int, n: int, size: int) -> list:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out = []
        for i in range(n):
            msg = bytes([i % 256]) * size
            t = time.perf_counter()
            s.sendall(msg)
            got = b""
            while len(got) < size:
                got += s.recv(size - len(got))
            out.append(time.perf_counter() - t)
            assert got == msg
        return out


@pytest.mark.parametrize("delay_ms", [0.5, 3.0])
def test_latency_proxy_adds_the_delay_each_way_and_keeps_bytes(echo_server, delay_ms):
    with LatencyProxy(echo_server, delay_ms / 1000) as px:
        rtts = _round_trips(px.port, 20, 3000)
        big = _round_trips(px.port, 1, 4_000_000)     # large messages arrive whole, in order
    # a round trip crosses the proxy twice (the lower bound holds under any load)
    assert min(rtts) >= 2 * delay_ms / 1000
    assert big[0] >= 2 * delay_ms / 1000


def test_latency_proxy_refuses_a_negative_delay(echo_server):
    with pytest.raises(ValueError):
        LatencyProxy(echo_server, -0.001)


def test_rpc_cases_have_a_matrix_of_their_own_and_are_in_full():
    """``--case rpc`` runs the largest delay (a matrix of its own, not in --quick, whose 10
    minutes its eight server processes would not fit); ``--full`` sweeps every delay."""
    from specdec.benchmark import cli as bench_cli

    own = [c for c in matrix.rpc().cases if c.rpc_delay_ms is not None]
    full = [c for c in matrix.full().cases if c.rpc_delay_ms is not None]
    assert [c.rpc_delay_ms for c in own] == [max(matrix.RPC_DELAYS_MS)]
    assert not [c for c in matrix.quick().cases if c.rpc_delay_ms is not None]
    assert sorted(c.rpc_delay_ms for c in full) == sorted(matrix.RPC_DELAYS_MS)
    assert all(c.name.startswith("rpc-") for c in own + full)
    assert bench_cli._matrix_name(bench_cli.parser().parse_args(["--case", "rpc"])) == "rpc"
    # the llama.cpp side runs its n-gram modes and llama-bench over the same servers
    assert all(any(m.side == matrix.LLAMA_CPP for m in c.methods) for c in full)


@pytest.mark.slow
def test_rpc_case_runs_over_remote_layers(tmp_path, monkeypatch):
    """An RPC case of the tiny bigram model: every specdec row runs over two servers behind
    the proxy, matches remote plain output, and the RPC plot is drawn."""
    monkeypatch.delenv(INJECT_ENV, raising=False)
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    prompt = Prompt("bigram", "repeat", matrix.MTP_PROMPT)
    methods = (matrix.PLAIN, matrix._s("ngram", "ngram", 3), matrix._s("mtp", "mtp", 2))
    cases = tuple(matrix.Case(f"rpc-{d:g}ms", "bigram", (prompt,), methods, 24, "tiny", 0.9,
                              rpc_delay_ms=d) for d in (0.0, 1.0))
    m = matrix.Matrix("rpc-test", cases, reps=1, check_tokens=8, bench_reps=1)
    logs: list = []
    res = report.finalize(Runner(m, peers_enabled=False, log=logs.append).run())
    rows = [r for r in res["rows"] if r["side"] == "specdec"]
    assert len(rows) == 6 and all(r["status"] == "ok" and r["tok_s"] > 0 for r in rows)
    assert all(r["match"] == 1.0 for r in rows)                # greedy: same text as remote plain
    assert {r["check"] for r in rows} == {"n/a (remote)"}
    assert any("2 local RPC servers, 1 ms" in line for line in logs)
    assert res["settings"]["cases"]["rpc-1ms"]["rpc_delay_ms"] == 1.0
    paths = plots.write_all(res, tmp_path / "plots")
    assert (tmp_path / "plots" / "rpc_latency.png") in paths


@pytest.mark.slow
def test_llama_cpp_tools_reach_servers_while_specdec_holds_its_own(monkeypatch, tiny_dense_path):
    """A llama.cpp RPC server serves one client at a time and a client keeps its connection
    until it exits: while this process holds a model on the case's servers, a separate
    process (as each llama.cpp tool is) must still load over the tools' endpoints."""
    import gc
    import subprocess
    import sys
    import tempfile

    import specdec

    seen: dict = {}

    def run_case_here(self, case):
        model = specdec.Model(tiny_dense_path, **self._placement)
        specdec.Decoder(model, n_ctx=64).generate([1, 2, 3], max_tokens=2)
        flags = dict(zip(self._peer_flags[::2], self._peer_flags[1::2]))
        code = ("import sys, specdec; m = specdec.Model(sys.argv[1], n_gpu_layers=-1, "
                "rpc_servers=sys.argv[2]); print(m.n_vocab)")
        try:
            p = subprocess.run([sys.executable, "-c", code, tiny_dense_path, flags["--rpc"]],
                               capture_output=True, text=True, timeout=90,
                               cwd=tempfile.gettempdir())
            seen["child"] = (p.returncode, p.stdout.strip(), model.n_vocab)
        except subprocess.TimeoutExpired:
            seen["child"] = "timed out behind this process's connection"
        del model
        gc.collect()
        return []

    monkeypatch.setattr(Runner, "_run_case_here", run_case_here)
    case = matrix.Case("rpc-0ms", "bigram", (), (matrix.PLAIN,), 8, "tiny", 0.9, rpc_delay_ms=0.0)
    Runner(matrix.Matrix("rpc-test", (case,), reps=1, check_tokens=8, bench_reps=1),
           peers_enabled=False, log=lambda _: None)._run_case(case)
    rc, out, n_vocab = seen["child"]
    assert rc == 0 and int(out) == n_vocab
