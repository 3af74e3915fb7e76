"""Placement and llama.cpp's RPC backend, on this CPU-only machine.

Two local ``specdec rpc-server`` processes stand in for remote machines: models are split
across them and the local CPU, and everything that reads model memory on the host (the lazy
LM head, MTP hidden rows, rollback, checkpoints, exact mode) must give the local result.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import sys
import time

import pytest

import specdec
from specdec import Context, Decoder, Model, RPCError
from specdec.placement import Placement, parse_rpc_servers
from specdec.testing.local_rpc import LocalRpcServers, free_port, start_rpc_server

from offhost import recurrent_rollback, rollback_and_checkpoint

TEXT = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
        "fibonacci(n - 2)\n\n\ndef fibonacci(n):\n")


@pytest.fixture(scope="module")
def servers():
    """Two RPC servers on 127.0.0.1: a 'host:port,host:port' string."""
    with LocalRpcServers(2) as cluster:
        yield cluster.endpoints


# --- options this build cannot honour, and bad values: clear errors before anything loads ---

def test_system_info_names_backends_and_devices():
    info = specdec.system_info()
    assert "backends: " in info and "CPU" in specdec.backends()
    assert "RPC" in specdec.backends()          # on by default (-Drpc=true)
    assert any(d["type"] == "cpu" for d in specdec.devices())
    assert any(line.startswith("device CPU") for line in info.splitlines())


def test_device_options_this_build_lacks(gemma_path):
    if any(d["type"] in ("gpu", "igpu") for d in specdec.devices()):
        pytest.skip("this build found a GPU")
    for ngl in (1, -1, 999):
        with pytest.raises(ValueError, match="no GPU backend|no such device"):
            Model(gemma_path, n_gpu_layers=ngl)
    with pytest.raises(ValueError, match="n_gpu_layers"):
        Decoder(gemma_path, n_gpu_layers=-1)
    with pytest.raises(ValueError, match="n_gpu_layers=0"):
        Model(gemma_path, rpc_servers="127.0.0.1:1")   # checked before connecting


@pytest.mark.parametrize("bad", ["nope", "host:0", "host:70000", "a:1,", ":5", "a b:1",
                                 "::1:5", ["a:1", "a:1"]])
def test_bad_rpc_servers(bad):
    with pytest.raises(ValueError):
        parse_rpc_servers(bad)


def test_rpc_server_forms():
    assert parse_rpc_servers("a:1, b:2") == ("a:1", "b:2")
    assert parse_rpc_servers(["a:1", "[::1]:50052"]) == ("a:1", "[::1]:50052")
    assert parse_rpc_servers(None) == parse_rpc_servers("") == ()
    with pytest.raises(TypeError):
        parse_rpc_servers(5)


@pytest.mark.parametrize("kw, err", [
    (dict(split_mode="diagonal"), ValueError), (dict(split_mode=7), ValueError),
    (dict(main_gpu=-1), ValueError), (dict(tensor_split=[1, -1]), ValueError),
    (dict(tensor_split=[0, 0]), ValueError), (dict(tensor_split="3,1"), TypeError),
    (dict(n_gpu_layers=1.5), TypeError), (dict(n_gpu_layers=True), TypeError),
    (dict(rpc_timeout=0), ValueError)])
def test_bad_placement_values(kw, err):
    with pytest.raises(err):
        Placement.make(**kw)


def test_placement_goes_to_model_not_decoder_when_model_given(gemma):
    with pytest.raises(ValueError, match="pass them to Model"):
        Decoder(gemma, n_gpu_layers=-1)
    with pytest.raises(ValueError, match="n_gpu_layers_draft"):
        Decoder(gemma, drafter="ngram", n_gpu_layers_draft=0)


def test_unreachable_server_is_an_error(gemma_path):
    t0 = time.time()
    with pytest.raises(RPCError, match="cannot connect"):
        Model(gemma_path, n_gpu_layers=-1, rpc_servers=f"127.0.0.1:{free_port()}")
    assert time.time() - t0 < 30
    assert Decoder(gemma_path).generate("Hi", max_tokens=2).tokens   # the process goes on


def test_server_options(servers):
    from specdec._core import rpc_serve
    with pytest.raises(ValueError, match="port"):
        rpc_serve("127.0.0.1", 0)
    with pytest.raises(ValueError, match="no device"):
        rpc_serve("127.0.0.1", free_port(), devices=["NoSuchGPU"])
    with pytest.raises(ValueError, match="split_mode='row'"):
        Model(specdec.default_model_path(), n_gpu_layers=2, split_mode="row", rpc_servers=servers)
    with pytest.raises(ValueError, match="tensor_split has 3"):
        Model(specdec.default_model_path(), n_gpu_layers=2, tensor_split=[1, 1, 1],
              rpc_servers=servers)
    with pytest.raises(ValueError, match="main_gpu=2"):
        Model(specdec.default_model_path(), n_gpu_layers=2, split_mode="none", main_gpu=2,
              rpc_servers=servers)


# --- gemma3-270m over two servers plus the local CPU --------------------------------------
#
# Remote memory changes nothing: the same requests give the same tokens as on this host, both
# without repacked weights (the servers' CPU backends never repack). Exact mode needs
# batch-invariant kernels, which the RPC protocol cannot switch on from the client: the
# Decoder checks the servers' kernels for its verify batches (Context.check_batch_invariance),
# and servers started with --batch-invariant compute as a local exact-mode context does.

GEMMA_DRAFTERS = ["ngram", "ngram-map", "ngram-cache", "suffix", "layerskip:6", "draft"]


@pytest.fixture(scope="module")
def gemma_flat(gemma_path):
    return Model(gemma_path, use_extra_bufts=False)


@pytest.fixture(scope="module")
def gemma_split(servers, gemma_path):
    # 12 of 18 layers (the output layer among them) on the two servers, 1:1; the rest here
    return Model(gemma_path, use_extra_bufts=False, n_gpu_layers=12, tensor_split=[1, 1],
                 rpc_servers=servers)


def _drafter_spec(drafter, gemma_path):
    return f"draft:{gemma_path}" if drafter == "draft" else drafter


@pytest.mark.parametrize("drafter", GEMMA_DRAFTERS)
def test_gemma_split_equals_local(gemma_split, gemma_flat, gemma_path, drafter):
    assert gemma_split.is_remote and [d["backend"] for d in gemma_split.devices] == ["RPC", "RPC"]
    spec = _drafter_spec(drafter, gemma_path)
    local = Decoder(gemma_flat, drafter=spec, n_max=4, n_ctx=1024)
    dec = Decoder(gemma_split, drafter=spec, n_max=4, n_ctx=1024,
                  n_gpu_layers_draft=0 if drafter == "draft" else None)
    res = dec.generate(TEXT, max_tokens=40)
    assert res.tokens == local.generate(TEXT, max_tokens=40).tokens
    if drafter in ("ngram", "suffix"):
        assert res.stats.accepted > 0
    if drafter == "draft":
        assert not dec.drafters[0].draft_model.is_remote        # -ngld 0: on this host
    if drafter == "layerskip:6":
        assert dec.drafters[0].draft_model.is_remote            # follows the target


@pytest.fixture(scope="module")
def invariant_servers():
    """Two servers computing with the reference kernels (--batch-invariant)."""
    with LocalRpcServers(2, extra=("--batch-invariant",)) as cluster:
        yield cluster.endpoints


@pytest.fixture(scope="module")
def gemma_local_exact(gemma_flat):
    return Decoder(gemma_flat, exact=True, n_ctx=1024).generate(TEXT, max_tokens=40).tokens


@pytest.fixture(scope="module")
def gemma_remote(servers, gemma_path):
    return Model(gemma_path, use_extra_bufts=False, n_gpu_layers=-1, rpc_servers=servers)


def test_exact_mode_over_rpc_checks_the_servers_kernels(gemma_remote, gemma_split):
    # default servers take ggml's tiled matmul for K-quant weights at 8 rows or more (layers
    # 0-5 of this gemma have some): verify batches of n_max + 1 = 9 rows are refused, by name
    # of the fix
    with pytest.raises(ValueError, match=r"between verify batches of 7 and 9 rows.*"
                                         r"--batch-invariant"):
        Decoder(gemma_remote, drafter="ngram", n_max=8, exact=True, n_ctx=1024)
    # gemma_split keeps layers 0-5 here: its servers' layers hold no K-quant weights, and the
    # check lets exact mode through at that length
    assert Decoder(gemma_split, drafter="ngram", n_max=8, exact=True,
                   n_ctx=1024).ctx.invariant_rows == 9
    # below the switch the servers' kernels hold: exact speculative output equals exact plain
    # output over the same servers (not the local one: the servers fuse ops)
    plain = Decoder(gemma_remote, exact=True, n_ctx=1024)
    spec = Decoder(gemma_remote, drafter="ngram", n_max=3, exact=True, n_ctx=1024)
    assert spec.ctx.invariant_rows == 4 and plain.ctx.invariant_rows == 2
    res = spec.generate(TEXT, max_tokens=40)
    assert res.tokens == plain.generate(TEXT, max_tokens=40).tokens and res.stats.accepted > 0


@pytest.mark.parametrize("drafter,n_max", [("ngram", 8), ("suffix", 16)])
def test_exact_mode_over_batch_invariant_servers(invariant_servers, gemma_path, gemma_local_exact,
                                                 drafter, n_max):
    """Servers started with --batch-invariant compute every row as a local exact-mode context
    does: exact output at any draft length, equal to the local exact output."""
    model = Model(gemma_path, use_extra_bufts=False, n_gpu_layers=-1,
                  rpc_servers=invariant_servers)
    dec = Decoder(model, drafter=drafter, n_max=n_max, exact=True, n_ctx=1024)
    assert dec.ctx.invariant_rows == n_max + 1
    res = dec.generate(TEXT, max_tokens=40)
    assert res.tokens == gemma_local_exact and res.stats.accepted > 0


def test_check_batch_invariance_arguments(gemma_split, gemma_flat):
    from specdec import Context
    with Context(gemma_split, n_ctx=256, n_batch=64, batch_invariant=True) as ctx:
        assert ctx.invariant_rows == 0                       # remote: not known until checked
        with pytest.raises(ValueError, match="max_rows"):
            ctx.check_batch_invariance(1)
        with pytest.raises(ValueError, match="n_ubatch"):
            ctx.check_batch_invariance(65)
        assert ctx.check_batch_invariance(4) == 0 and ctx.invariant_rows == 4
        assert ctx.seq_pos_max(0) == -1                      # left empty
    with Context(gemma_flat, n_ctx=256, batch_invariant=True) as ctx:
        assert ctx.invariant_rows == -1                      # CPU only: every row count
    with Context(gemma_split, n_ctx=256) as ctx:
        with pytest.raises(ValueError, match="batch_invariant=True"):
            ctx.check_batch_invariance(4)


def test_warm_up_decodes_every_verify_shape(gemma_split, gemma_flat):
    """Over RPC the first decode of a batch shape pays a round trip per new tensor shape: a
    Decoder of a remote target decodes each verify shape once at load, and leaves the
    context empty."""
    from specdec import Context
    with Context(gemma_split, n_ctx=256, n_batch=64) as ctx:
        with pytest.raises(ValueError, match="max_rows"):
            ctx.warm_up(0)
        with pytest.raises(ValueError, match="max_rows"):
            ctx.warm_up(65)
        ctx.warm_up(5)
        assert ctx.seq_pos_max(0) == -1
        assert ctx.perf()["n_p_eval"] + ctx.perf()["n_eval"] == 1 + 2 + 3 + 4 + 5
    remote = Decoder(gemma_split, drafter="ngram", n_max=4)
    assert remote.ctx.perf()["n_p_eval"] + remote.ctx.perf()["n_eval"] >= 15
    assert remote.ctx.seq_pos_max(0) == -1
    local = Decoder(gemma_flat, drafter="ngram", n_max=4)
    assert (remote.generate(TEXT, max_tokens=16).tokens
            == local.generate(TEXT, max_tokens=16).tokens)


def test_gemma_all_remote_plain(servers, gemma_path, gemma_flat):
    m = Model(gemma_path, use_extra_bufts=False, n_gpu_layers=-1, rpc_servers=servers.split(","))
    assert (Decoder(m).generate(TEXT, max_tokens=24).tokens
            == Decoder(gemma_flat).generate(TEXT, max_tokens=24).tokens)


def test_lazy_head_steps_aside_under_offload(gemma_split):
    # llama.cpp offloads the output layer first: with any layer remote, result_norm and the
    # LM head are on a server, and the lazy head (host memory only) must step aside
    dec = Decoder(gemma_split, drafter="ngram", lazy_logits=True)
    out = dec.generate(TEXT, max_tokens=24).tokens
    assert dec.ctx.lazy_logits.startswith("unavailable")
    ref = Decoder(gemma_split, drafter="ngram")
    assert ref.ctx.lazy_logits == "off"          # the Decoder does not try it off the host
    assert ref.generate(TEXT, max_tokens=24).tokens == out


def test_checkpoints_and_rollback_on_remote_memory(servers, gemma_path, gemma):
    toks = gemma.tokenize(TEXT)
    remote = Model(gemma_path, n_gpu_layers=-1, rpc_servers=servers, use_extra_bufts=False)
    local = Model(gemma_path, use_extra_bufts=False)
    a = rollback_and_checkpoint(remote, toks)
    b = rollback_and_checkpoint(local, toks)
    assert all((x == y).all() for x, y in zip(a, b))


# --- MTP and recurrent rollback with target and head both remote -------------------------

@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_mtp_remote_equals_local(servers, model_file, arch):
    from specdec.testing import bigram_successor, write_bigram_mtp_model
    path = model_file(f"rpc-bigram-{arch}.gguf", lambda p: write_bigram_mtp_model(p, arch=arch, noise=0.6))
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    local = Decoder(path, drafter="mtp", n_max=3).generate(prompt, max_tokens=32)
    succ = bigram_successor(path)
    want = [prompt[-1]]
    for _ in range(32):
        want.append(int(succ[want[-1]]))
    assert local.tokens == want[1:]
    # target and head both remote (the head is the target file's own NextN layer)
    dec = Decoder(path, drafter="mtp", n_max=3, n_gpu_layers=-1, rpc_servers=servers, check=True)
    assert dec.drafters[0].mtp_model is dec.model and dec.model.is_remote
    assert dec.ctx.rollback_trim and dec.ctx.n_rollback == 3       # snapshot rollback, trimmed graphs
    res = dec.generate(prompt, max_tokens=32)
    assert res.tokens == local.tokens
    assert res.stats.accepted > 0 and res.stats.drafted > res.stats.accepted  # rollbacks ran
    # the head on this host, the trunk remote (llama.cpp's -ngld 0)
    dec = Decoder(path, drafter="mtp", n_max=3, n_gpu_layers=-1, rpc_servers=servers,
                  n_gpu_layers_draft=0)
    assert not dec.drafters[0].mtp_model.is_remote
    assert dec.generate(prompt, max_tokens=32).tokens == local.tokens


def test_mtp_random_qwen35_remote_equals_local(servers, tiny_qwen35_path):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    flat = Model(tiny_qwen35_path, load_mtp=True, use_extra_bufts=False)
    remote = Model(tiny_qwen35_path, load_mtp=True, use_extra_bufts=False, n_gpu_layers=-1,
                   rpc_servers=servers)
    a = Decoder(flat, drafter="mtp", n_max=3).generate(prompt, max_tokens=24)
    b = Decoder(remote, drafter="mtp", n_max=3).generate(prompt, max_tokens=24)
    assert a.tokens == b.tokens and a.stats.drafted == b.stats.drafted


def test_recurrent_rollback_remote(servers, tiny_qwen35_path):
    remote = recurrent_rollback(Model(tiny_qwen35_path, n_gpu_layers=-1, rpc_servers=servers))
    local = recurrent_rollback(Model(tiny_qwen35_path))
    assert all((x == y).all() for x, y in zip(remote, local))


# --- a server that dies -------------------------------------------------------------------

def test_killed_server_raises_and_process_goes_on(servers, gemma_path):
    port = free_port()
    proc = start_rpc_server(port)
    try:
        dec = Decoder(gemma_path, drafter="ngram", n_gpu_layers=-1,
                      rpc_servers=f"127.0.0.1:{port}")
        st = dec.stream(TEXT, max_tokens=200)
        next(st)
        proc.kill()
        proc.wait()
        t0 = time.time()
        with pytest.raises(RPCError, match="127.0.0.1:%d" % port):
            for _ in st:
                pass
        assert time.time() - t0 < 30
        with pytest.raises(RPCError, match="unusable"):
            dec.generate("again", max_tokens=4)
        with pytest.raises(RPCError):
            dec.ctx.save_state(0)
    finally:
        proc.kill()
        proc.wait()
    # loading again: locally and on the live servers
    assert Decoder(gemma_path).generate(TEXT, max_tokens=4).tokens
    dec2 = Decoder(gemma_path, n_gpu_layers=-1, rpc_servers=servers)
    assert len(dec2.generate(TEXT, max_tokens=4).tokens) == 4


def test_cli_rpc_flags(gemma_path):
    # a server of its own: a server takes one client at a time, and this process holds the
    # module's servers
    port = free_port()
    proc = start_rpc_server(port)
    try:
        out = subprocess.run([sys.executable, "-m", "specdec", "generate", "-m", gemma_path,
                              "-p", TEXT, "-n", "8", "-d", "ngram", "-ngl", "10", "--rpc",
                              f"127.0.0.1:{port}", "--json"],
                             capture_output=True, text=True, timeout=300,
                             cwd=tempfile.gettempdir())
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 0, out.stderr
    bad = subprocess.run([sys.executable, "-m", "specdec", "generate", "-m", gemma_path, "-p", "x",
                          "-ngl", "3"], capture_output=True, text=True, timeout=300,
                         cwd=tempfile.gettempdir())
    assert bad.returncode == 1 and "--n-gpu-layers 3" in bad.stderr     # the CLI's flag


EXIT_SCRIPT = """
import sys
from specdec.testing.local_rpc import LocalRpcServers
import specdec
cluster = LocalRpcServers(1)
print(*[p.pid for p in cluster.procs], flush=True)
model = specdec.Model(sys.argv[1], n_gpu_layers=-1, rpc_servers=cluster.endpoints)
decoder = specdec.Decoder(model, n_ctx=64)
print(decoder.generate([1, 2, 3], max_tokens=3))
if sys.argv[2] == "raise":
    raise RuntimeError("the script fails with a remote model alive")
"""


@pytest.mark.parametrize("ending,rc", [("return", 0), ("raise", 1)])
def test_process_exits_cleanly_with_remote_models_alive(tmp_path, tiny_dense_path, ending, rc):
    """A script that ends (or fails) without freeing a remote model: the interpreter frees it
    at exit on a helper thread, and llama.cpp logs from there while Python is finalizing."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    p = subprocess.run([sys.executable, str(script), tiny_dense_path, ending],
                       capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir())
    for pid in p.stdout.splitlines()[0].split() if p.stdout else []:
        os.kill(int(pid), 9)        # the script's server outlives it
    assert p.returncode == rc, p.stderr[-2000:]
    assert "terminate called" not in p.stderr
