"""GGML_ABORT on the calling thread becomes LlamaAbortError (specdec/_abort.h).

The aborts here come from files that pass the pre-checks but that llama.cpp's graph code
asserts on: a qwen35 with no attention layer (``GGML_ASSERT(buffer)`` on the first decode),
key groups that do not divide the value heads (``GGML_ASSERT(H_v % H_k == 0)`` in the graph
build of a decode) and value heads of another size than the keys (at context creation).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
import sys
import threading

import numpy as np
import pytest

import specdec
from specdec import Batch, Context, DecodeTimeoutError, Decoder, GGUFError, LlamaAbortError, Model
from specdec.testing import write_tiny_qwen35
from specdec.testing.gguf_fuzz import dump, load
from specdec.testing.tiny import TINY_QWEN35


def _qwen35(model_file, name, **dims):
    d = dataclasses.replace(TINY_QWEN35, checked=False, **dims)
    return model_file(name, lambda p: write_tiny_qwen35(p, dims=d))


@pytest.fixture(scope="module")
def no_attention_path(model_file):
    return _qwen35(model_file, "abort-no-attention.gguf", full_attention_interval=5)


@pytest.fixture(scope="module")
def bad_groups_path(model_file):
    return _qwen35(model_file, "abort-bad-groups.gguf", ssm_groups=3, ssm_v_heads=4)


@pytest.fixture(scope="module")
def bad_value_head_path(model_file):
    return _qwen35(model_file, "abort-value-head.gguf", head_dim_v=16)


def _greedy(path, n=12):
    return Decoder(path, n_ctx=128).generate([1, 2, 3, 4], max_tokens=n).tokens


def _one_token_batch(tok=1):
    b = Batch(4)
    b.add(tok, 0, 0, True)
    return b


def test_decode_abort_leaves_context_unusable(no_attention_path, tiny_dense_path):
    before = _greedy(tiny_dense_path)
    m = Model(no_attention_path)
    ctx = Context(m, n_ctx=64, n_batch=8)
    with pytest.raises(LlamaAbortError, match="GGML_ASSERT") as ei:
        ctx.decode(_one_token_batch())
    assert "GGML_ASSERT" in ei.value.llama_message
    assert ".cpp:" in ei.value.llama_message   # llama.cpp's file and line
    # freed and refusing: every entry point says why, none touches llama.cpp
    for use in (lambda: ctx.decode(_one_token_batch()), lambda: ctx.logits(0),
                lambda: ctx.seq_rm(0), lambda: ctx.clear(), lambda: ctx.save_state(),
                lambda: ctx.seq_pos_max(0)):
        with pytest.raises(LlamaAbortError, match="unusable"):
            use()
    ctx.close()   # closing twice is fine
    del ctx
    # the model itself was only read: a new context aborts the same way, not worse
    assert m.tokenize("hello")
    ctx2 = Context(m, n_ctx=64, n_batch=8)
    with pytest.raises(LlamaAbortError):
        ctx2.decode(_one_token_batch())
    # the process goes on: another model loads and generates the same as before
    assert _greedy(tiny_dense_path) == before


def test_decoder_surfaces_the_abort(no_attention_path, tiny_dense_path):
    dec = Decoder(no_attention_path, drafter="ngram", n_ctx=128, lazy_logits=False)
    with pytest.raises(LlamaAbortError):
        dec.generate("hello", max_tokens=4)
    with pytest.raises(LlamaAbortError, match="unusable"):
        dec.generate("hello", max_tokens=4)
    # with the head chosen by timing it (the default), the first decode is at load: the
    # Decoder is not made, and the abort is the one error raised
    with pytest.raises(LlamaAbortError, match="GGML_ASSERT") as ei:
        Decoder(no_attention_path, drafter="ngram", n_ctx=128)
    assert ei.value.__context__ is None
    assert len(_greedy(tiny_dense_path)) == 12


@pytest.mark.parametrize("which,assert_", [("bad_value_head_path", "n_embd_head"),
                                            ("bad_groups_path", "H_v % H_k")])
def test_context_creation_abort(which, assert_, request, tiny_dense_path):
    m = Model(request.getfixturevalue(which))
    with pytest.raises(LlamaAbortError, match="creating the context") as ei:
        Context(m, n_ctx=64)
    assert assert_ in ei.value.llama_message
    # the half-built context was freed inside llama.cpp; the model is still usable
    fresh = Model(request.getfixturevalue(which))
    assert m.tokenize("hello world") == fresh.tokenize("hello world")
    assert m.detokenize([5, 6, 7]) == fresh.detokenize([5, 6, 7])
    assert len(_greedy(tiny_dense_path)) == 12


def test_load_abort_is_a_gguf_error(tiny_dense_path, tmp_path):
    m = load(open(tiny_dense_path, "rb").read())
    toks = m.find("tokenizer.ggml.tokens").value
    toks[5], toks[6] = "", "[EMPTY_5]"
    p = tmp_path / "empty-token.gguf"
    p.write_bytes(dump(m))
    with pytest.raises(GGUFError, match="llama.cpp aborted.*id_to_token") as ei:
        Model(p)
    assert isinstance(ei.value.__cause__, LlamaAbortError)
    assert len(_greedy(tiny_dense_path)) == 12


def test_abort_in_another_thread(no_attention_path, tiny_dense_path):
    """The conversion is per thread (the GIL is released around decode)."""
    errors = []

    def work():
        ctx = Context(Model(no_attention_path), n_ctx=64, n_batch=8)
        try:
            ctx.decode(_one_token_batch())
        except LlamaAbortError as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 2
    assert len(_greedy(tiny_dense_path)) == 12


def test_repeated_aborts_do_not_leak(no_attention_path):
    """Each abort frees what the failed call built (RAII unwinding): RSS stays flat."""
    code = f"""
import os, resource, specdec
from specdec import Batch, Context, Model, LlamaAbortError
m = Model({no_attention_path!r})
def once():
    ctx = Context(m, n_ctx=64, n_batch=8)
    b = Batch(4); b.add(1, 0, 0, True)
    try:
        ctx.decode(b)
    except LlamaAbortError:
        pass
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
for _ in range(20):
    once()
r0 = rss()
for _ in range(200):
    once()
print((rss() - r0) / 2**20)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, MALLOC_ARENA_MAX="1"), timeout=300,
                         cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr[-2000:]
    grew = float(out.stdout.strip().splitlines()[-1])
    assert grew < 20, f"RSS grew {grew:.1f} MB over 200 aborted decodes"


def test_compute_thread_aborts_are_refused_by_two_checks(tiny_qwen35_path, tmp_path):
    """Where no exception can unwind (ggml-cpu kernels), the inputs are refused before the call.
    An f16 conv kernel (ggml_ssm_conv takes f32: "GGML_ASSERT" in the compute threads) is
    refused by the file's pre-check, and with that skipped, by the graph check when the
    context is made (``_graph_check.h``), naming the node: the process never reaches it."""
    m = load(open(tiny_qwen35_path, "rb").read())
    for t in m.tensors:
        if t.name.endswith("ssm_conv1d.weight"):
            t.type, t.data = 1, t.data[: len(t.data) // 2]
    p = tmp_path / "f16-conv.gguf"
    p.write_bytes(dump(m))
    with pytest.raises(GGUFError, match="ssm_conv1d.weight' must be f32"):
        Model(p)
    code = f"""
import specdec._core as c
c._check_gguf_file = lambda path: None
from specdec import Batch, Context, GGUFError, Model
try:
    ctx = Context(Model({str(p)!r}), n_ctx=64, n_batch=8)
except GGUFError as e:
    print("refused:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused:" in out.stdout and "SSM_CONV" in out.stdout and "(f16)" in out.stdout, out.stdout


def test_decode_watchdog_stops_a_decode_and_keeps_the_context(tiny_dense_path):
    """A decode past the watchdog's limit stops between graph nodes with DecodeTimeoutError;
    its tokens are not in the context, which decodes again as before."""
    m = Model(tiny_dense_path)
    ctx = Context(m, n_ctx=256, n_batch=128)
    assert ctx.decode_timeout == 0     # adaptive by default
    b = Batch(128)
    for i in range(100):
        b.add(1 + i % 50, i, 0, i == 99)
    ctx.decode_timeout = 1e-9
    with pytest.raises(DecodeTimeoutError, match="watchdog"):
        ctx.decode(b)
    ctx.decode_timeout = 0
    ctx.seq_rm(0, -1, -1)
    ctx.decode(b)
    ref = Context(m, n_ctx=256, n_batch=128)
    ref.decode(b)
    assert (ctx.logits(99) == ref.logits(99)).all()
    ctx.decode_timeout = -1   # off
    ctx.seq_rm(0, -1, -1)
    ctx.decode(b)
