"""The synthetic GGUF writers produce the layouts llama.cpp loads and the bigram/MTP math holds."""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from specdec.testing import (
    bigram_successor,
    mtp_draft_accuracy,
    write_bigram_mtp_model,
    write_tiny_dense,
    write_tiny_qwen35,
)

F32, F16, Q8_0 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q8_0
OUT_PROJ = (
    "ssm_out.weight",
    "attn_output.weight",
    "ffn_down.weight",
    "ffn_down_exps.weight",
    "ffn_down_shexp.weight",
)


class Model:
    """GGUFReader view: KV values, ggml shapes and dequantized tensors by name."""

    def __init__(self, path: Path) -> None:
        self.reader = gguf.GGUFReader(path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = self.kv("general.architecture")

    def kv(self, key: str, default: object = None) -> object:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def akv(self, key: str, default: object = None) -> object:
        return self.kv(f"{self.arch}.{key}", default)

    def ne(self, name: str) -> tuple[int, ...]:
        return tuple(int(n) for n in self.tensors[name].shape)

    def type(self, name: str) -> gguf.GGMLQuantizationType:
        return self.tensors[name].tensor_type

    def __getitem__(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)


def rmsnorm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def cycle_lengths(succ: np.ndarray) -> list[int]:
    seen = np.zeros(succ.size, dtype=bool)
    lengths = []
    for start in range(succ.size):
        n, t = 0, start
        while not seen[t]:
            seen[t] = True
            t, n = int(succ[t]), n + 1
        if n:
            lengths.append(n)
    return lengths


# --- tiny random qwen35 -------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "n_blocks", "nextn", "n_tensors"),
    [({}, 5, 1, 71), ({"mtp": False}, 4, None, 56), ({"mtp_only": True}, 5, 1, 18)],
)
def test_tiny_qwen35_layout(
    tmp_path: Path, kwargs: dict, n_blocks: int, nextn: int | None, n_tensors: int
) -> None:
    m = Model(write_tiny_qwen35(tmp_path / "m.gguf", **kwargs))
    assert m.arch == "qwen35"
    assert m.akv("block_count") == n_blocks
    assert m.akv("nextn_predict_layers") == nextn
    assert len(m.tensors) == n_tensors
    assert m.akv("rope.dimension_sections") == [2, 1, 1, 0]
    assert (m.akv("ssm.inner_size"), m.akv("ssm.state_size"), m.akv("ssm.group_count")) == (128, 32, 2)
    assert m.ne("token_embd.weight") == (128, 256)
    assert m.ne("output.weight") == (128, 256)
    if not kwargs.get("mtp_only"):
        for il in range(3):  # gated delta net
            assert m.ne(f"blk.{il}.attn_qkv.weight") == (128, 2 * 32 * 2 + 128)
            assert m.ne(f"blk.{il}.ssm_conv1d.weight") == (4, 256)
            assert m.ne(f"blk.{il}.ssm_a") == (4,)
            assert f"blk.{il}.attn_q.weight" not in m.tensors
        assert m.ne("blk.3.attn_q.weight") == (128, 32 * 4 * 2)
        assert m.ne("blk.3.attn_k.weight") == (128, 32 * 2)
        assert "blk.3.ssm_a" not in m.tensors
    else:
        assert not any(name.startswith(f"blk.{il}.") for name in m.tensors for il in range(4))
    if nextn:
        assert m.ne("blk.4.nextn.eh_proj.weight") == (256, 128)
        assert m.ne("blk.4.attn_output.weight") == (128, 128)
        assert m.ne("blk.4.ffn_down.weight") == (256, 128)
    else:
        assert not any(name.startswith("blk.4.") for name in m.tensors)


def test_tiny_qwen35_variants_share_weights(tmp_path: Path) -> None:
    full = Model(write_tiny_qwen35(tmp_path / "full.gguf", seed=3))
    trunk = Model(write_tiny_qwen35(tmp_path / "trunk.gguf", seed=3, mtp=False))
    head = Model(write_tiny_qwen35(tmp_path / "head.gguf", seed=3, mtp_only=True))
    other = Model(write_tiny_qwen35(tmp_path / "other.gguf", seed=4))
    for name in trunk.tensors:
        np.testing.assert_array_equal(full[name], trunk[name])
    for name in head.tensors:
        np.testing.assert_array_equal(full[name], head[name])
    assert not np.array_equal(full["token_embd.weight"], other["token_embd.weight"])


def test_test_tokenizer(tmp_path: Path) -> None:
    m = Model(write_tiny_qwen35(tmp_path / "m.gguf", n_vocab=300))
    assert m.kv("tokenizer.ggml.model") == "test"
    assert m.kv("tokenizer.ggml.tokens") == [f"tok_{i}" for i in range(300)]
    assert m.kv("tokenizer.ggml.scores") == [0.0] * 300
    assert m.kv("tokenizer.ggml.add_bos_token") is False
    assert m.kv("tokenizer.ggml.bos_token_id") is None  # the test vocab has no BOS/EOS
    assert m.ne("token_embd.weight") == (128, 300)


@pytest.mark.parametrize(("dtype", "qtype"), [("f32", F32), ("f16", F16), ("q8_0", Q8_0)])
def test_tiny_qwen35_dtypes(tmp_path: Path, dtype: str, qtype: gguf.GGMLQuantizationType) -> None:
    m = Model(write_tiny_qwen35(tmp_path / "m.gguf", dtype=dtype))
    for name in ("token_embd.weight", "output.weight", "blk.0.attn_qkv.weight", "blk.4.nextn.eh_proj.weight"):
        assert m.type(name) == qtype
    for name in ("output_norm.weight", "blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias"):
        assert m.type(name) == F32
    ref = Model(write_tiny_qwen35(tmp_path / "ref.gguf"))
    np.testing.assert_allclose(m["blk.3.attn_q.weight"], ref["blk.3.attn_q.weight"], atol=0.02)


def test_tiny_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_tiny_qwen35(tmp_path / "m.gguf", mtp=False, mtp_only=True)
    with pytest.raises(ValueError):
        write_tiny_dense(tmp_path / "m.gguf", dtype="q4_0")


# --- tiny random llama --------------------------------------------------------


def test_tiny_dense_layout(tmp_path: Path) -> None:
    m = Model(write_tiny_dense(tmp_path / "d.gguf", n_vocab=512))
    assert m.arch == "llama"
    assert m.akv("block_count") == 2
    assert (m.akv("embedding_length"), m.akv("feed_forward_length")) == (64, 128)
    assert (m.akv("attention.head_count"), m.akv("attention.head_count_kv")) == (4, 2)
    assert m.akv("rope.dimension_count") == 16  # llama requires n_rot == head dim
    assert m.akv("nextn_predict_layers") is None
    assert len(m.tensors) == 3 + 2 * 9
    assert m.ne("token_embd.weight") == (64, 512)
    assert m.ne("blk.1.attn_q.weight") == (64, 64)
    assert m.ne("blk.1.attn_k.weight") == (64, 32)
    assert m.ne("blk.1.ffn_down.weight") == (128, 64)
    assert m.ne("blk.1.ffn_norm.weight") == (64,)


# --- bigram MTP models --------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_bigram_layout(tmp_path: Path, arch: str) -> None:
    m = Model(write_bigram_mtp_model(tmp_path / "b.gguf", arch=arch))
    assert m.arch == arch
    assert m.akv("block_count") == 5
    assert m.akv("nextn_predict_layers") == 1
    assert m.akv("full_attention_interval") == 4
    assert m.ne("token_embd.weight") == (128, 512)
    assert m.type("token_embd.weight") == F32
    assert "blk.3.attn_q.weight" in m.tensors and "blk.2.ssm_a" in m.tensors
    if arch == "qwen35moe":
        assert (m.akv("expert_count"), m.akv("expert_used_count")) == (4, 2)
        assert (m.akv("expert_feed_forward_length"), m.akv("expert_shared_feed_forward_length")) == (64, 64)
        assert m.ne("blk.0.ffn_gate_exps.weight") == (128, 64, 4)
        assert m.ne("blk.0.ffn_down_exps.weight") == (64, 128, 4)
        assert m.ne("blk.4.ffn_gate_inp.weight") == (128, 4)
        assert m.ne("blk.4.ffn_gate_inp_shexp.weight") == (128,)
        assert "blk.0.ffn_gate.weight" not in m.tensors
    else:
        assert m.akv("expert_count") is None
        assert m.ne("blk.0.ffn_down.weight") == (256, 128)


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_bigram_trunk_is_a_long_cycle(tmp_path: Path, arch: str) -> None:
    path = write_bigram_mtp_model(tmp_path / "b.gguf", arch=arch, seed=1)
    m = Model(path)
    zeroed = [name for name in m.tensors if name.endswith(OUT_PROJ)]
    # per block: attention/ssm out + FFN down (+ shared-expert down)
    assert len(zeroed) == 5 * (3 if arch == "qwen35moe" else 2)
    assert not any(np.any(m[name]) for name in zeroed)
    assert not np.any(m["blk.0.ffn_up.weight" if arch == "qwen35" else "blk.0.ffn_up_exps.weight"] == 0)

    embd = m["token_embd.weight"]
    np.testing.assert_allclose(np.sqrt(np.mean(embd**2, axis=1)), 1.0)  # norms leave rows unchanged
    logits = rmsnorm(embd) * m["output_norm.weight"] @ m["output.weight"].T
    succ = np.argmax(logits, axis=1)
    top2 = np.sort(logits, axis=1)[:, -2:]
    assert np.min(top2[:, 1] - top2[:, 0]) > 5.0  # margin survives F16/Q8_0 rounding
    assert cycle_lengths(succ) == [512]
    np.testing.assert_array_equal(succ, bigram_successor(path))
    np.testing.assert_array_equal(succ, m.kv("specdec.bigram.successor"))


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_bigram_mtp_head_predicts_the_next_trunk_token(tmp_path: Path, arch: str) -> None:
    path = write_bigram_mtp_model(tmp_path / "b.gguf", arch=arch)
    m = Model(path)
    n = 128
    eh = m["blk.4.nextn.eh_proj.weight"]
    np.testing.assert_array_equal(eh, np.hstack([np.eye(n), np.zeros((n, n))]))
    for norm in ("output_norm", "blk.4.nextn.enorm", "blk.4.nextn.hnorm", "blk.4.nextn.shared_head_norm"):
        np.testing.assert_array_equal(m[norm + ".weight"], 1.0)

    # graph_mtp: h = target's post-output_norm hidden at x0, e = embd[x1], predict x2 = next(x1)
    succ = np.asarray(m.kv("specdec.bigram.successor"))
    embd, out = m["token_embd.weight"], m["output.weight"]
    x0 = np.arange(512)
    x1 = succ[x0]
    h = rmsnorm(embd[x0])
    cur = np.concatenate([rmsnorm(embd[x1]), rmsnorm(h)], axis=1) @ eh.T
    np.testing.assert_array_equal(np.argmax(rmsnorm(cur) @ out.T, axis=1), succ[x1])
    assert mtp_draft_accuracy(path, n_samples=512) == 1.0


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_bigram_survives_rounding(tmp_path: Path, dtype: str) -> None:
    ref = Model(write_bigram_mtp_model(tmp_path / "ref.gguf"))
    path = write_bigram_mtp_model(tmp_path / "b.gguf", dtype=dtype)
    m = Model(path)
    assert m.type("output.weight") == {"f16": F16, "q8_0": Q8_0}[dtype]
    assert m.type("blk.4.nextn.eh_proj.weight") == m.type("output.weight")
    np.testing.assert_array_equal(bigram_successor(path), ref.kv("specdec.bigram.successor"))
    assert mtp_draft_accuracy(path, n_samples=512) == 1.0


def test_bigram_noise_lowers_acceptance(tmp_path: Path) -> None:
    clean = Model(write_bigram_mtp_model(tmp_path / "clean.gguf", seed=2))
    path = write_bigram_mtp_model(tmp_path / "noisy.gguf", seed=2, noise=0.2)
    noisy = Model(path)
    assert noisy.kv("specdec.bigram.noise") == pytest.approx(0.2)
    eh = "blk.4.nextn.eh_proj.weight"
    assert np.std(noisy[eh] - clean[eh]) == pytest.approx(0.2, rel=0.05)
    for name in clean.tensors:
        if name != eh:
            np.testing.assert_array_equal(noisy[name], clean[name])
    accuracy = mtp_draft_accuracy(path, n_samples=512)
    assert 0.3 < accuracy < 0.95
    again = write_bigram_mtp_model(tmp_path / "again.gguf", seed=2, noise=0.2)
    assert mtp_draft_accuracy(again, n_samples=512) == accuracy  # the noise is seeded


def test_bigram_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_bigram_mtp_model(tmp_path / "b.gguf", size="huge")
    with pytest.raises(ValueError):
        write_bigram_mtp_model(tmp_path / "b.gguf", arch="llama")


@pytest.mark.slow
def test_bigram_mid(tmp_path: Path) -> None:
    start = time.perf_counter()
    path = write_bigram_mtp_model(tmp_path / "mid.gguf", size="mid")
    assert time.perf_counter() - start < 60
    m = Model(path)
    assert (m.akv("embedding_length"), m.akv("block_count"), m.akv("feed_forward_length")) == (1024, 9, 2816)
    assert m.ne("token_embd.weight") == (1024, 32000)
    assert m.type("blk.0.attn_qkv.weight") == F16
    assert [il for il in range(8) if f"blk.{il}.attn_q.weight" in m.tensors] == [3, 7]
    n_params = sum(int(np.prod(t.shape)) for t in m.reader.tensors)
    assert 150e6 < n_params < 200e6

    succ = np.asarray(m.kv("specdec.bigram.successor"))
    assert cycle_lengths(succ) == [32000]
    sample = np.random.default_rng(0).integers(0, 32000, size=512)
    np.testing.assert_array_equal(bigram_successor(path, sample), succ[sample])
    assert mtp_draft_accuracy(path, n_samples=256) == 1.0
