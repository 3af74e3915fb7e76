"""DFlash draft GGUFs for periodic bigram targets, with an acceptance that can be dialled.

llama.cpp's dflash graph (src/models/dflash.cpp) drafts a whole block in one pass: the
target's layer inputs at every committed position are written into the draft's KV (K and V
from ``fc`` of the features), then the block ``[last, <mask> x n]`` at positions
``L .. L+n`` attends, non-causally, to that KV and to itself, and block row ``i`` predicts
the token at position ``L+i``. No mask row sees another's draft, so each must find its
token in the target's features alone.

The target is a bigram model (:func:`specdec.testing.bigram.write_bigram_mtp_model`) with
``period=T``: its greedy text repeats every ``T`` tokens, and its layer inputs are its token
embeddings, whose dim 0 is +1 for every token. The draft copies the token ``T`` positions
back, which is the token at ``L+i`` once the text is periodic (``T >= n + 1`` keeps that
position among the committed ones):

* K reads dim 0 of the features only, so every committed position has the same key before
  RoPE; Q (from the mask row) is that key turned back by ``T`` positions' RoPE phases, so
  the score ``sum_j cos(theta_j (q - p - T))`` peaks at ``p = q - T`` and, scaled by
  ``attention.scale``, leaves every other position ``_SCALE * rope_margin()`` nats lower;
* the block rows' own keys are zero (their embeddings are 0 on dim 0), so the block is
  ignored;
* V is the feature (the token embedding), ``wo`` the identity, the FFN adds zero, and the
  LM head maps the embedding of ``x`` to ``perm[x]``: ``perm`` is the identity on the tokens
  the draft gets right and a shift among the others, ``round(acceptance * T)`` right ones
  in every cycle of the target, so every request sees the dialled rate.

:func:`dflash_drafts` computes in numpy what the draft must propose from a token history.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import gguf
import numpy as np

from specdec.testing.bigram import LOGIT_SCALE, _Tensors, bigram_successor
from specdec.testing.tiny import add_test_tokenizer, write_gguf

ARCH = "dflash"
ACCEPTANCE_KEY = "specdec.dflash.acceptance"
PERM_KEY = "specdec.dflash.prediction"

# RoPE dims of the attention head and their base: 16 pairs with theta_j = 2**(-j/16) keep
# sum_j (1 - cos(theta_j d)) >= 4.2 for every 1 <= |d| <= 8192 (rope_margin)
_N_ROT = 32
_ROPE_BASE = 2.0
# score of the position T back over any other: _SCALE * rope_margin() nats
_SCALE = 8.0
_MAX_CONTEXT = 8192


def rope_margin(max_distance: int = _MAX_CONTEXT) -> float:
    """min over distances 1..max_distance of sum_j (1 - cos(theta_j d)) for the draft's RoPE."""
    theta = _ROPE_BASE ** (-2.0 * np.arange(_N_ROT // 2) / _N_ROT)
    d = np.arange(1, max_distance + 1, dtype=np.float64)
    return float((1.0 - np.cos(np.outer(d, theta))).sum(axis=1).min())


def target_period(target: str | os.PathLike[str]) -> int:
    """The period of the target's greedy text: the common length of its successor cycles."""
    succ = bigram_successor(target)
    seen = np.zeros(succ.size, dtype=bool)
    lengths = set()
    for start in range(succ.size):
        if seen[start]:
            continue
        n, t = 0, start
        while not seen[t]:
            seen[t] = True
            t = int(succ[t])
            n += 1
        lengths.add(n)
    if len(lengths) != 1:
        raise ValueError(f"the target's successor cycles have lengths {sorted(lengths)}; a "
                         f"DFlash draft needs one period (write_bigram_mtp_model(period=T))")
    return lengths.pop()


def _prediction(succ: np.ndarray, period: int, acceptance: float, seed: int) -> np.ndarray:
    """perm[x]: the token the draft proposes where the target's text has ``x`` (T back)."""
    rng = np.random.default_rng(seed)
    perm = np.arange(succ.size)
    n_right = int(round(acceptance * period))
    seen = np.zeros(succ.size, dtype=bool)
    wrong_all = []
    for start in range(succ.size):
        if seen[start]:
            continue
        cycle, t = [], start
        while not seen[t]:
            seen[t] = True
            cycle.append(t)
            t = int(succ[t])
        wrong_all.extend(rng.permutation(cycle)[n_right:].tolist())
    wrong = np.array(wrong_all, dtype=np.int64)
    if wrong.size == 1:
        raise ValueError("one wrong token in the whole vocab cannot be mapped elsewhere")
    perm[wrong] = np.roll(wrong, 1)         # a shift among the wrong tokens: none maps home
    return perm


def _draft_tensors(embd: np.ndarray, perm: np.ndarray, period: int, n_layers: int,
                   n_vocab: int) -> dict[str, np.ndarray]:
    n_target_vocab, E = embd.shape
    half = _N_ROT // 2
    theta = _ROPE_BASE ** (-2.0 * np.arange(half) / _N_ROT)
    n_ff = 32
    tok = np.zeros((n_vocab, E), dtype=np.float32)
    tok[:, 1] = np.sqrt(E)                  # RMS 1, zero on dim 0: the block's keys are zero
    fc = np.tile(np.eye(E, dtype=np.float32) / np.float32(n_layers), (1, n_layers))
    wq = np.zeros((E, E), dtype=np.float32)
    wq[:half, 1] = np.cos(theta * period)
    wq[half:_N_ROT, 1] = -np.sin(theta * period)
    wk = np.zeros((E, E), dtype=np.float32)
    wk[:half, 0] = 1.0
    out = np.zeros((n_target_vocab, E), dtype=np.float32)
    out[perm] = embd                        # logit of perm[x] is embd[x] . h
    out[:, :2] = 0.0                        # dim 0 is common to all, dim 1 is the mask's
    # the residual is sqrt(E) e_1 + embd[x], RMS sqrt(2): the head's logit gap is LOGIT_SCALE
    out *= np.float32(LOGIT_SCALE * np.sqrt(2.0) / E)
    return {
        "token_embd.weight": tok,
        "fc.weight": fc,
        "enc.output_norm.weight": np.ones(E, dtype=np.float32),
        "output_norm.weight": np.ones(E, dtype=np.float32),
        "output.weight": np.ascontiguousarray(out[:n_vocab]),
        "blk.0.attn_norm.weight": np.ones(E, dtype=np.float32),
        "blk.0.attn_q.weight": wq,
        "blk.0.attn_k.weight": wk,
        "blk.0.attn_v.weight": np.eye(E, dtype=np.float32),
        "blk.0.attn_output.weight": np.eye(E, dtype=np.float32),
        "blk.0.attn_q_norm.weight": np.ones(E, dtype=np.float32),
        "blk.0.attn_k_norm.weight": np.ones(E, dtype=np.float32),
        "blk.0.ffn_norm.weight": np.ones(E, dtype=np.float32),
        "blk.0.ffn_gate.weight": np.zeros((n_ff, E), dtype=np.float32),
        "blk.0.ffn_up.weight": np.zeros((n_ff, E), dtype=np.float32),
        "blk.0.ffn_down.weight": np.zeros((E, n_ff), dtype=np.float32),
    }


def write_dflash_draft(
    path: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    acceptance: float = 1.0,
    seed: int = 0,
    dtype: str = "f32",
    block_size: int | None = None,
    target_layers: tuple[int, ...] | None = None,
    n_vocab: int | None = None,
    mask_token: int | None = None,
    causal: bool = False,
) -> Path:
    """Write a DFlash draft for the periodic bigram target at ``target`` (module notes).

    ``acceptance`` is the share of tokens of every target cycle that the draft gets right
    (rounded to whole tokens of the period). ``block_size`` defaults to the target's period,
    the longest block the draft can fill (n_max = block_size - 1). ``target_layers``
    defaults to two layers; ``n_vocab``, ``mask_token`` (-1: none), a ``block_size`` past
    the period or ``causal=True`` make the bad drafts that tests refuse.
    """
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance!r}")
    ts = _Tensors(target)
    embd = ts["token_embd.weight"]
    n_target_vocab, E = embd.shape
    if not np.all(embd[:, 0] == 1.0):
        raise ValueError("the target's embeddings have no constant dim 0: write it with "
                         "write_bigram_mtp_model(period=T)")
    period = target_period(target)
    succ = bigram_successor(target)
    if target_layers is None:
        target_layers = (1, ts.n_layer - 1)
    n_vocab = n_target_vocab if n_vocab is None else int(n_vocab)
    block_size = period if block_size is None else int(block_size)
    mask_token = n_target_vocab - 1 if mask_token is None else int(mask_token)
    if rope_margin() * _SCALE < 20.0:
        raise AssertionError("the RoPE constants leave too small an attention margin")
    perm = _prediction(succ, period, acceptance, seed)
    tensors = _draft_tensors(embd, perm, period, len(target_layers), n_vocab)
    layout = {name: tuple(reversed(a.shape)) for name, a in tensors.items()}

    def add_kv(w: gguf.GGUFWriter) -> None:
        w.add_block_count(1)
        w.add_context_length(_MAX_CONTEXT)
        w.add_embedding_length(E)
        w.add_feed_forward_length(tensors["blk.0.ffn_up.weight"].shape[0])
        w.add_head_count(1)
        w.add_head_count_kv(1)
        w.add_key_length(E)
        w.add_value_length(E)
        w.add_rope_dimension_count(_N_ROT)
        w.add_rope_freq_base(_ROPE_BASE)
        w.add_layer_norm_rms_eps(1e-6)
        # the score of two unit-RMS heads is sum_j (2E/R) cos(...): scale it to _SCALE
        w.add_float32(f"{ARCH}.attention.scale", float(_SCALE * _N_ROT / (2.0 * E)))
        w.add_key_value(f"{ARCH}.target_layers", [int(i) for i in target_layers],
                        gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        w.add_uint32(f"{ARCH}.block_size", block_size)
        if causal:
            w.add_bool(f"{ARCH}.attention.causal", True)
        add_test_tokenizer(w, n_vocab)
        if ts.eos is not None:
            w.add_eos_token_id(ts.eos)   # the target's vocabulary, its end token included
        if mask_token >= 0:
            w.add_uint32(gguf.Keys.Tokenizer.MASK_ID, mask_token)
        w.add_float32(ACCEPTANCE_KEY, float(acceptance))
        w.add_key_value(PERM_KEY, perm.tolist(), gguf.GGUFValueType.ARRAY,
                        sub_type=gguf.GGUFValueType.UINT32)

    return write_gguf(path, ARCH, layout, lambda name, ne: tensors[name], add_kv, dtype=dtype,
                      name="bigram-dflash")


def dflash_prediction(draft: str | os.PathLike[str]) -> np.ndarray:
    """The draft's ``perm``: the token it proposes where the text ``T`` back has ``x``."""
    field = gguf.GGUFReader(draft).fields[PERM_KEY]
    return np.array(field.contents(), dtype=np.int64)


def dflash_drafts(draft: str | os.PathLike[str], history: Sequence[int], n: int,
                  period: int) -> list[int]:
    """What the draft proposes after the committed ``history`` (positions 0..L-1): block row
    ``i`` (1..n) copies the token at ``L + i - period`` through ``perm``."""
    perm = dflash_prediction(draft)
    L = len(history)
    return [int(perm[history[L + i - period]]) for i in range(1, n + 1) if L + i - period >= 0]
