"""qwen35 / qwen35moe / qwen3next GGUF models whose greedy output and MTP acceptance are known in advance.

Every trunk layer keeps its full tensor set, so decoding costs what a real
model of that shape costs, but the output projections (ssm_out, attn_output,
ffn_down, expert and shared-expert down) are zero. The residual stream then
stays the token embedding and the target computes a bigram:
``logits = output @ rmsnorm(embd[tok])``. Embedding rows are random +-1
vectors (RMS exactly 1, so RMS norms leave them unchanged, and exact in F16),
and ``output[next[t]] = s * embd[t]`` where ``next`` is one cycle through the
whole vocab, so greedy text never repeats before ``n_vocab`` tokens.

The MTP block maps ``concat(enorm(e), hnorm(h))`` through ``eh_proj = [I | 0]``
and its attention/FFN add zero, so its logits are the same bigram of the token
it is given: it predicts what the target will emit next and acceptance is
~100%. Gaussian noise on eh_proj (``noise``) lowers acceptance;
:func:`mtp_draft_accuracy` measures the resulting rate in numpy.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import gguf
import numpy as np

from specdec.testing.tiny import (
    Qwen35Dims,
    TINY_QWEN35,
    RandomFill,
    Shape,
    add_qwen35_kv,
    add_test_tokenizer,
    qwen35_layout,
    qwen3next_layout,
    write_gguf,
)

SUCCESSOR_KEY = "specdec.bigram.successor"
NOISE_KEY = "specdec.bigram.noise"

# logit of the successor; the next best token sits far below (random +-1 rows
# overlap by at most ~40% in the sizes below), so argmax survives F16/Q8_0
LOGIT_SCALE = 20.0

_ZERO_SUFFIXES = (
    "ssm_out.weight",
    "attn_output.weight",
    "ffn_down.weight",
    "ffn_down_exps.weight",
    "ffn_down_shexp.weight",
)

_SIZES: dict[str, Qwen35Dims] = {
    "tiny": dataclasses.replace(TINY_QWEN35, n_vocab=512),
    "mid": Qwen35Dims(
        n_vocab=32000,
        n_embd=1024,
        n_layer=8,
        n_head=8,
        n_head_kv=2,
        head_dim=128,
        n_rot=32,
        rope_sections=(6, 5, 5, 0),
        n_ff=2816,
        ssm_state=128,
        ssm_groups=8,
        ssm_v_heads=8,
    ),
    # what a ~1.4B model costs on a GPU (the mid size is launch-bound there): 24 layers of
    # n_embd 2048, 16 linear-attention groups and v heads; ~40 s per file to write
    "large": Qwen35Dims(
        n_vocab=32000,
        n_embd=2048,
        n_layer=24,
        n_head=16,
        n_head_kv=4,
        head_dim=128,
        n_rot=32,
        rope_sections=(6, 5, 5, 0),
        n_ff=5632,
        ssm_state=128,
        ssm_groups=16,
        ssm_v_heads=16,
    ),
}

# qwen35moe replaces each FFN by routed experts plus a gated shared expert
_MOE: dict[str, dict[str, int]] = {
    "tiny": {"n_expert": 4, "n_expert_used": 2, "n_ff_exp": 64, "n_ff_shexp": 64},
    "mid": {"n_expert": 8, "n_expert_used": 2, "n_ff_exp": 384, "n_ff_shexp": 384},
}

_DEFAULT_DTYPE = {"tiny": "f32", "mid": "f16", "large": "f16"}


def bigram_dims(size: str = "tiny", arch: str = "qwen35") -> Qwen35Dims:
    """Hyperparameters used by :func:`write_bigram_mtp_model` for ``size`` and ``arch``."""
    if size not in _SIZES:
        raise ValueError(f"size must be one of {sorted(_SIZES)}, got {size!r}")
    if arch == "qwen35":
        return _SIZES[size]
    if arch in ("qwen35moe", "qwen3next"):    # qwen3next: qwen35moe's shapes, fused ssm_ba
        if size not in _MOE:
            raise ValueError(f"arch {arch!r} has sizes {sorted(_MOE)}, not {size!r}")
        return dataclasses.replace(_SIZES[size], **_MOE[size])
    raise ValueError(f"arch must be 'qwen35', 'qwen35moe' or 'qwen3next', got {arch!r}")


def _sign_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """n distinct random +-1 rows of length d."""
    rows = rng.integers(0, 2, size=(n, d), dtype=np.int8)
    while True:
        _, first = np.unique(np.packbits(rows, axis=1), axis=0, return_index=True)
        dup = np.setdiff1d(np.arange(n), first)
        if dup.size == 0:
            return rows.astype(np.float32) * 2.0 - 1.0
        rows[dup] = rng.integers(0, 2, size=(dup.size, d), dtype=np.int8)


class _BigramFill:
    """Structured values for the bigram tensors, random ones (RandomFill) for the rest."""

    def __init__(self, d: Qwen35Dims, seed: int, noise: float, period: int | None = None) -> None:
        structure, weights, noise_seed = np.random.SeedSequence(seed).spawn(3)
        rng = np.random.default_rng(structure)
        order = rng.permutation(d.n_vocab)
        self.successor = np.empty(d.n_vocab, dtype=np.int64)
        if period is None:
            self.successor[order] = np.roll(order, -1)  # one cycle through every token
            self.embd = _sign_rows(rng, d.n_vocab, d.n_embd)
        else:   # cycles of `period` tokens; embedding dim 0 is +1 in every row
            cycles = order.reshape(-1, period)
            self.successor[cycles] = np.roll(cycles, -1, axis=1)
            self.embd = np.ones((d.n_vocab, d.n_embd), dtype=np.float32)
            self.embd[:, 1:] = _sign_rows(rng, d.n_vocab, d.n_embd - 1)
        self.random = RandomFill(int(weights.generate_state(1)[0]))
        self.noise_rng = np.random.default_rng(noise_seed)
        self.noise = noise
        self.d = d

    def __call__(self, name: str, ne: Shape) -> np.ndarray:
        shape = tuple(reversed(ne))
        if name == "token_embd.weight":
            return self.embd
        if name == "output.weight":
            out = np.empty_like(self.embd)
            out[self.successor] = self.embd * np.float32(LOGIT_SCALE / self.d.n_embd)
            return out
        if name.endswith(_ZERO_SUFFIXES):
            return np.zeros(shape, dtype=np.float32)
        if name.endswith("nextn.eh_proj.weight"):  # [I | 0]: keep enorm(e), drop hnorm(h)
            n = self.d.n_embd
            w = np.zeros(shape, dtype=np.float32)
            w[:, :n] = np.eye(n, dtype=np.float32)
            if self.noise:
                w += self.noise_rng.standard_normal(shape, dtype=np.float32) * np.float32(self.noise)
            return w
        return self.random(name, ne)


def write_bigram_mtp_model(
    path: str | os.PathLike[str],
    *,
    size: str = "tiny",
    noise: float = 0.0,
    arch: str = "qwen35",
    seed: int = 0,
    dtype: str | None = None,
    eos_token_id: int | None = None,
    period: int | None = None,
) -> Path:
    """Write a trunk-bigram model with one MTP block that predicts the trunk's next token.

    size "tiny": vocab 512, n_embd 128, 4 trunk layers; "mid": vocab 32000,
    n_embd 1024, 8 trunk layers (~190M params); "large": vocab 32000, n_embd 2048,
    24 trunk layers (~1.4B params, the cost of a GPU-sized model). Every 4th trunk layer is
    full attention, the others gated delta net. dtype defaults to "f32" for
    tiny and "f16" for mid; "q8_0" is accepted too. The successor map is
    stored under ``specdec.bigram.successor`` so tests can predict greedy output.
    ``eos_token_id`` makes one token of the cycle the end of generation, for
    stop tests (the test vocab has no EOS of its own).

    ``period`` splits the one cycle into cycles of that many tokens, so that greedy text
    repeats with that period, and makes embedding dim 0 the same (+1) for every token: a
    position-only feature that a DFlash draft's attention reads (``specdec.testing.dflash``).
    """
    d = bigram_dims(size, arch)
    dtype = dtype or _DEFAULT_DTYPE[size]
    if period is not None and not (1 < period <= d.n_vocab and d.n_vocab % period == 0):
        raise ValueError(f"period must divide the vocab size {d.n_vocab} and exceed 1, "
                         f"got {period}")
    fill = _BigramFill(d, seed, float(noise), period)

    def add_kv(w: gguf.GGUFWriter) -> None:
        add_qwen35_kv(w, d, n_nextn=1)
        add_test_tokenizer(w, d.n_vocab)
        succ = fill.successor.tolist()
        w.add_key_value(SUCCESSOR_KEY, succ, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT32)
        w.add_float32(NOISE_KEY, float(noise))
        if eos_token_id is not None:
            if not 0 <= eos_token_id < d.n_vocab:
                raise ValueError(f"eos_token_id {eos_token_id} outside the vocab of {d.n_vocab}")
            w.add_eos_token_id(eos_token_id)

    return write_gguf(
        path,
        arch,
        (qwen3next_layout if arch == "qwen3next" else qwen35_layout)(d, n_nextn=1),
        fill,
        add_kv,
        dtype=dtype,
        name=f"bigram-mtp-{arch}-{size}",
    )


class _Tensors:
    """Dequantized float32 tensors of a GGUF file, numpy shape (reversed ne)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.reader = gguf.GGUFReader(path)
        self.by_name = {t.name: t for t in self.reader.tensors}
        fields = self.reader.fields
        arch = fields["general.architecture"].contents()
        nextn = fields.get(f"{arch}.nextn_predict_layers")
        self.n_layer = int(fields[f"{arch}.block_count"].contents()) - (int(nextn.contents()) if nextn else 0)
        eos = fields.get(gguf.Keys.Tokenizer.EOS_ID)
        # the end-of-generation token (None: none); a draft for the model declares the same
        self.eos: int | None = int(eos.contents()) if eos is not None else None

    def __getitem__(self, name: str) -> np.ndarray:
        t = self.by_name[name]
        return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)

    def get(self, name: str, default: str) -> np.ndarray:
        return self[name if name in self.by_name else default]


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _check_zero_outputs(ts: _Tensors) -> None:
    for name in ts.by_name:
        if name.endswith(_ZERO_SUFFIXES) and np.any(ts[name]):
            raise ValueError(f"{name} is not zero: the residual stream is not the embedding")


def _successor(ts: _Tensors, tokens: np.ndarray) -> np.ndarray:
    embd, out, norm = ts["token_embd.weight"], ts["output.weight"], ts["output_norm.weight"]
    flat = np.asarray(tokens, dtype=np.int64).reshape(-1)
    result = np.empty(flat.shape, dtype=np.int64)
    for lo in range(0, flat.size, 1024):
        h = _rmsnorm(embd[flat[lo : lo + 1024]], norm)
        result[lo : lo + 1024] = np.argmax(h @ out.T, axis=-1)
    return result.reshape(np.shape(tokens))


def bigram_successor(path: str | os.PathLike[str], tokens: np.ndarray | None = None) -> np.ndarray:
    """The target's greedy next token for each of ``tokens`` (default: every token), from the weights.

    Recomputes llama.cpp's forward pass in numpy under the zero output
    projections (checked): ``argmax(output @ output_norm(embd[tok]))``.
    """
    ts = _Tensors(path)
    _check_zero_outputs(ts)
    n_vocab = int(ts.by_name["token_embd.weight"].shape[1])
    return _successor(ts, np.arange(n_vocab) if tokens is None else tokens)


def mtp_draft_accuracy(path: str | os.PathLike[str], *, n_samples: int = 256, seed: int = 0) -> float:
    """Fraction of first MTP drafts that match the target's next greedy token.

    Follows qwen35 graph_mtp: at position i the block gets the target's
    post-output_norm hidden h_i (which predicted x_{i+1}) and the token x_{i+1},
    and must predict x_{i+2}. Attention and FFN add zero (checked), so the
    block output is ``eh_proj @ concat(enorm(e), hnorm(h))``.
    """
    ts = _Tensors(path)
    _check_zero_outputs(ts)
    p = f"blk.{ts.n_layer}.nextn."
    embd, out = ts["token_embd.weight"], ts["output.weight"]
    x0 = np.random.default_rng(seed).integers(0, embd.shape[0], size=n_samples)
    x1 = _successor(ts, x0)
    x2 = _successor(ts, x1)
    h = _rmsnorm(embd[x0], ts["output_norm.weight"])
    e = _rmsnorm(embd[x1], ts[p + "enorm.weight"])
    cur = np.concatenate([e, _rmsnorm(h, ts[p + "hnorm.weight"])], axis=1) @ ts[p + "eh_proj.weight"].T
    cur = _rmsnorm(cur, ts.get(p + "shared_head_norm.weight", "output_norm.weight"))
    return float(np.mean(np.argmax(cur @ out.T, axis=-1) == x2))
