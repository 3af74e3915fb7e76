"""EAGLE-3 draft GGUFs for the bigram targets, with an acceptance that can be dialled.

The bigram target (:mod:`specdec.testing.bigram`) keeps its residual stream equal to the
token embedding, so every layer's input at position ``P`` is ``embd[x_P]`` and the target
predicts ``succ(x_P)``. llama.cpp's eagle3 graph (src/models/eagle3.cpp) sees, at position
``P``, the token ``x_{P+1}`` and ``g_P = fc(features_P)``, and must predict ``x_{P+2}``.

The draft written here (hidden size ``D = E + R``, ``E`` the target's):

* its token embedding is ``[embd[t] | 1 ... 1]``; the ``R`` constant dims serve attention;
* attention (one head, ``head_dim = D``) attends to the current position only: Q and K
  read the constant dims alone, so after RoPE their dot product depends on the relative
  position only, and the RoPE base and scale make it largest, by a wide margin, at distance
  0 (:func:`rope_margin`). V carries the token embedding and ``wo`` puts it back, so the
  attention output is ``embd[x_{P+1}]`` plus ``noise`` times a fixed random mix of ``g``;
* ``fc`` reads the **last extracted target layer's input** only: ``g`` is a fixed random
  projection of it into the ``R`` dims past ``E``. With ``norm_before_residual`` the
  residual carries ``rmsnorm(g)`` there, scaled up, and the LM head ignores those dims; a
  later draft step's ``g`` (the previous pre-norm state, as in llama.cpp) is therefore the
  same vector again;
* the FFN adds zero; the LM head is the target's bigram head, ``output[succ[t]] = embd[t]``.

At ``noise=0`` the draft is the target's bigram of its input token (acceptance ~100%); the
noise mixes a feature-determined vector into the state and lowers acceptance.
:func:`eagle3_draft_accuracy` predicts the first-draft acceptance from the two files in
numpy, so a test can tell whether the features reached the draft as they should.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np

from specdec.testing.bigram import LOGIT_SCALE, _rmsnorm, _Tensors, bigram_successor
from specdec.testing.tiny import add_test_tokenizer, write_gguf

ARCH = "eagle3"
NOISE_KEY = "specdec.eagle3.noise"

# constant dims of the draft's token rows that Q and K read (RoPE pairs)
_N_CONST = 32
# RoPE base of the draft: with 16 pairs, frequencies 1 .. 2**-15 rad/position keep
# sum(1 - cos(theta_i * d)) >= 4.2 for every distance 1 <= d <= 8192 (rope_margin)
_ROPE_BASE = 2.0
# size of Q and K on the constant dims: the score of any other position is at least
# 2 * _QK**2 * 4.2 / sqrt(D) below the current one's
_QK = 16.0
# the scale of g in the residual: large enough that a later draft step's g (the previous
# pre-norm state) is the same unit vector as the first step's, token part aside
_G_SCALE = 32.0


def rope_margin(max_distance: int = 8192) -> float:
    """min over distances 1..max_distance of sum_i (1 - cos(theta_i d)) for the draft's RoPE."""
    n_pairs = _N_CONST // 2
    theta = _ROPE_BASE ** (-2.0 * np.arange(n_pairs) / _N_CONST)
    d = np.arange(1, max_distance + 1, dtype=np.float64)
    return float((1.0 - np.cos(np.outer(d, theta))).sum(axis=1).min())


def _target_facts(target: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(embedding rows, successor per token, n_layer, n_vocab) of a bigram target."""
    ts = _Tensors(target)
    embd = ts["token_embd.weight"]
    succ = bigram_successor(target)
    return embd, succ, ts.n_layer, embd.shape[0]


def _draft_tensors(embd: np.ndarray, succ: np.ndarray, noise: float, seed: int) -> dict[str, np.ndarray]:
    n_vocab, E = embd.shape
    K = _N_CONST
    D = E + K
    n_ff = 32
    rng = np.random.default_rng(seed)
    tok = np.ones((n_vocab, D), dtype=np.float32)
    tok[:, :E] = embd
    fc = np.zeros((D, 3 * E), dtype=np.float32)
    # g: the last extracted layer's input, randomly projected into the K dims past E
    fc[E:, 2 * E:] = rng.standard_normal((K, E), dtype=np.float32) / np.float32(np.sqrt(E))
    norm2 = np.zeros(D, dtype=np.float32)
    norm2[E:] = _G_SCALE
    # concat(embd_norm, g_norm) -> head dims: Q, K from the constant dims, V = token + noise
    wq = np.zeros((D, 2 * D), dtype=np.float32)
    wq[np.arange(K), E + np.arange(K)] = _QK
    wv = np.zeros((D, 2 * D), dtype=np.float32)
    wv[K + np.arange(E), np.arange(E)] = 1.0
    mix = rng.standard_normal((E, K), dtype=np.float32) / np.float32(np.sqrt(K))
    wv[K:, D + E:] = mix * np.float32(noise / _G_SCALE)
    wo = np.zeros((D, D), dtype=np.float32)
    wo[np.arange(E), K + np.arange(E)] = 1.0
    # the residual carries g (scaled by _G_SCALE) in dims E.., which the head ignores;
    # output_norm undoes that scale on dims ..E
    out_norm = np.ones(D, dtype=np.float32)
    out_norm[:E] = _G_SCALE
    out = np.zeros((n_vocab, D), dtype=np.float32)
    out[succ, :E] = embd * np.float32(LOGIT_SCALE / E)
    return {
        "token_embd.weight": tok,
        "fc.weight": fc,
        "output_norm.weight": out_norm,
        "output.weight": out,
        "blk.0.attn_norm.weight": np.ones(D, dtype=np.float32),
        "blk.0.attn_norm_2.weight": norm2,
        "blk.0.attn_q.weight": wq,
        "blk.0.attn_k.weight": wq.copy(),
        "blk.0.attn_v.weight": wv,
        "blk.0.attn_output.weight": wo,
        "blk.0.ffn_norm.weight": np.ones(D, dtype=np.float32),
        "blk.0.ffn_gate.weight": np.zeros((n_ff, D), dtype=np.float32),
        "blk.0.ffn_up.weight": np.zeros((n_ff, D), dtype=np.float32),
        "blk.0.ffn_down.weight": np.zeros((D, n_ff), dtype=np.float32),
    }


def write_eagle3_draft(
    path: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    noise: float = 0.0,
    seed: int = 0,
    dtype: str = "f32",
    target_layers: tuple[int, ...] | None = None,
    target_hidden_size: int | None = None,
    n_vocab: int | None = None,
) -> Path:
    """Write an EAGLE-3 draft for the bigram target at ``target`` (see the module notes).

    ``noise`` dials acceptance down from ~100% (:func:`noise_for_acceptance` finds the
    noise for a wanted rate). ``target_layers`` defaults to llama.cpp's usual low/mid/high
    choice, ``(2, n/2, n-1)`` clipped to the target. ``target_layers``,
    ``target_hidden_size`` and a smaller ``n_vocab`` may be set wrong on purpose (tests of
    the errors); the tensors follow the target otherwise.
    """
    embd, succ, n_layer, n_target_vocab = _target_facts(target)
    eos = _Tensors(target).eos
    n_vocab = n_target_vocab if n_vocab is None else int(n_vocab)
    if not 0 < n_vocab <= n_target_vocab:
        raise ValueError(f"n_vocab must be in 1..{n_target_vocab}, got {n_vocab}")
    E = embd.shape[1]
    if target_layers is None:
        target_layers = (min(2, n_layer - 1), n_layer // 2, n_layer - 1)
    tensors = _draft_tensors(embd, succ, float(noise), seed)
    for name in ("token_embd.weight", "output.weight"):
        tensors[name] = np.ascontiguousarray(tensors[name][:n_vocab])
    hidden = int(target_hidden_size or E)
    if hidden != E:     # fc shaped for the declared size, so that llama.cpp loads the file
        fc = np.zeros((E + _N_CONST, 3 * hidden), dtype=np.float32)
        k = min(hidden, E)
        for b in range(3):
            fc[:, b * hidden:b * hidden + k] = tensors["fc.weight"][:, b * E:b * E + k]
        tensors["fc.weight"] = fc
    layout = {name: tuple(reversed(a.shape)) for name, a in tensors.items()}

    def add_kv(w: gguf.GGUFWriter) -> None:
        w.add_block_count(1)
        w.add_context_length(8192)
        w.add_embedding_length(E + _N_CONST)
        w.add_feed_forward_length(tensors["blk.0.ffn_up.weight"].shape[0])
        w.add_head_count(1)
        w.add_head_count_kv(1)
        w.add_rope_dimension_count(_N_CONST)
        w.add_rope_freq_base(_ROPE_BASE)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_key_value(f"{ARCH}.target_layers", [int(i) for i in target_layers],
                        gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        w.add_uint32(f"{ARCH}.target_hidden_size", hidden)
        w.add_bool(f"{ARCH}.norm_before_residual", True)
        add_test_tokenizer(w, n_vocab)
        if eos is not None:
            w.add_eos_token_id(eos)      # the target's vocabulary, its end token included
        w.add_float32(NOISE_KEY, float(noise))

    return write_gguf(path, ARCH, layout, lambda name, ne: tensors[name], add_kv, dtype=dtype,
                      name="bigram-eagle3")


def _pre_norm(t: dict[str, np.ndarray], embd: np.ndarray, x0: np.ndarray,
              x1: np.ndarray) -> np.ndarray:
    """The decoder's pre-norm state for the pair (x1, features of x0)."""
    feats = np.concatenate([embd[x0]] * 3, axis=1)
    g = feats @ t["fc.weight"].T
    e = _rmsnorm(t["token_embd.weight"][x1], t["blk.0.attn_norm.weight"])
    g_norm = _rmsnorm(g, t["blk.0.attn_norm_2.weight"])
    attn = (np.concatenate([e, g_norm], axis=1) @ t["blk.0.attn_v.weight"].T) @ t["blk.0.attn_output.weight"].T
    return attn + g_norm


def _first_drafts(t: dict[str, np.ndarray], embd: np.ndarray, x0: np.ndarray,
                  x1: np.ndarray) -> np.ndarray:
    logits = _rmsnorm(_pre_norm(t, embd, x0, x1), t["output_norm.weight"]) @ t["output.weight"].T
    return np.argmax(logits, axis=-1)


def _first_draft_hits(t: dict[str, np.ndarray], embd: np.ndarray, succ: np.ndarray,
                      x0: np.ndarray) -> np.ndarray:
    x1 = succ[x0]
    return _first_drafts(t, embd, x0, x1) == succ[x1]


def eagle3_first_draft(target: str | os.PathLike[str], draft: str | os.PathLike[str],
                       x0: np.ndarray, x1: np.ndarray) -> np.ndarray:
    """The draft's first token after the pair (``x1``, features of ``x0``), in numpy: what
    it must propose when ``x0`` is the newest committed token and ``x1`` the pending one."""
    embd = _Tensors(target)["token_embd.weight"]
    ds = _Tensors(draft)
    t = {name: ds[name] for name in ds.by_name}
    return _first_drafts(t, embd, np.asarray(x0, dtype=np.int64), np.asarray(x1, dtype=np.int64))


def eagle3_draft_accuracy(target: str | os.PathLike[str], draft: str | os.PathLike[str], *,
                          n_samples: int = 512, seed: int = 0) -> float:
    """Fraction of first drafts that match the target's next greedy token, in numpy.

    At position ``P`` of a greedy text the draft sees ``x_{P+1} = succ(x_P)`` and
    ``g = fc(features)`` with every feature ``embd[x_P]`` (the bigram target's layer inputs),
    and must predict ``succ(x_{P+1})``. Attention is taken to return the current position's
    value (:func:`rope_margin` bounds the rest).
    """
    embd, succ, _, n_vocab = _target_facts(target)
    ds = _Tensors(draft)
    t = {name: ds[name] for name in ds.by_name}
    x0 = np.random.default_rng(seed).integers(0, n_vocab, size=n_samples)
    return float(np.mean(_first_draft_hits(t, embd, succ, x0)))


def noise_for_acceptance(target: str | os.PathLike[str], acceptance: float, *, seed: int = 0,
                         n_samples: int = 512) -> float:
    """The draft noise whose predicted first-draft acceptance is ``acceptance`` (bisection
    over the numpy model of :func:`eagle3_draft_accuracy`)."""
    if not 0.0 < acceptance < 1.0:
        raise ValueError(f"acceptance must be in (0, 1), got {acceptance!r}")
    embd, succ, _, n_vocab = _target_facts(target)
    x0 = np.random.default_rng(seed).integers(0, n_vocab, size=n_samples)
    x1 = succ[x0]
    # the noise scales one block of attn_v only, and the LM head reads dims ..E, where the
    # output norm's weight is uniform: the head's argmax is that of out @ (pre0 + noise * d)
    pre0 = _pre_norm(_draft_tensors(embd, succ, 0.0, seed), embd, x0, x1)
    t1 = _draft_tensors(embd, succ, 1.0, seed)
    head = t1["output.weight"]
    base, slope = pre0 @ head.T, (_pre_norm(t1, embd, x0, x1) - pre0) @ head.T
    lo, hi = 0.0, 8.0
    for _ in range(20):
        mid = 0.5 * (lo + hi)
        if np.mean(np.argmax(base + np.float32(mid) * slope, axis=-1) == succ[x1]) > acceptance:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
