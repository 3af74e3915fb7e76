"""Tiny llama models with a chat vocab and a chat template, whose greedy reply is known.

The vocab is byte-level BPE (GPT-2's byte-to-unicode alphabet, no merges) plus a chat
family's special tokens, so a real template's markers (``<start_of_turn>``, ``<|eot_id|>``,
``<|im_end|>``, ...) tokenize to single control tokens and llama.cpp marks its usual
end-of-turn tokens as end-of-generation. The weights compute a successor table: embeddings
are scaled one-hot rows (RMS 1, so RMS norms keep them), every layer's output projection is
zero so the residual stays the embedding, and ``output[succ[t]] = s * embd[t]``. Greedy
decoding then follows ``succ``: from any token it writes ``reply`` and then ``end_token``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np

from specdec.testing.tiny import LlamaDims, add_llama_kv, llama_layout, write_gguf

#: logit of the successor; every other logit is 0
LOGIT = 30.0


@dataclass(frozen=True)
class ChatVocab:
    """A chat family's special tokens: BOS/EOS texts (None: none) and the others."""

    bos: Optional[str]
    eos: str
    specials: tuple[str, ...]
    add_bos: bool


#: the special tokens of template families, as their GGUFs name them
FAMILIES: dict[str, ChatVocab] = {
    "gemma": ChatVocab("<bos>", "<eos>", ("<start_of_turn>", "<end_of_turn>"), True),
    "llama3": ChatVocab("<|begin_of_text|>", "<|end_of_text|>",
                        ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), True),
    "chatml": ChatVocab("<|endoftext|>", "<|endoftext|>", ("<|im_start|>", "<|im_end|>"), False),
    # a turn end that llama.cpp does not know by name: a control token, not end-of-generation
    "turnmark": ChatVocab("<s>", "</s>", ("<|user|>", "<|assistant|>", "<|end_turn|>"), True),
}


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (the texts of byte-level BPE tokens)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def successor_dims(n_vocab: int, *, n_ctx_train: int, n_layer: int = 1) -> LlamaDims:
    """A llama (one layer unless told) wide enough for one-hot embeddings of ``n_vocab``
    tokens."""
    return LlamaDims(n_vocab=n_vocab, n_embd=-(-n_vocab // 32) * 32, n_layer=n_layer, n_head=4,
                     n_head_kv=2, n_ff=64, n_ctx_train=n_ctx_train)


def successor_fill(succ: np.ndarray, d: LlamaDims, logit: float, *, noise: float = 0.0,
                   seed: int = 0) -> Callable[[str, tuple[int, ...]], np.ndarray]:
    """Weights whose greedy successor of token t is ``succ[t]`` (logit ``logit``, the others 0
    plus Gaussian ``noise``): scaled one-hot embeddings, zero layer outputs."""
    n_vocab = d.n_vocab
    scale = np.float32(np.sqrt(d.n_embd))
    embd = np.zeros((n_vocab, d.n_embd), np.float32)
    embd[np.arange(n_vocab), np.arange(n_vocab)] = scale
    out = np.zeros((n_vocab, d.n_embd), np.float32)
    out[succ, np.arange(n_vocab)] = np.float32(logit) / scale
    rng = np.random.default_rng(seed)
    if noise:
        out[:, :n_vocab] += rng.standard_normal((n_vocab, n_vocab), dtype=np.float32) \
            * np.float32(noise) / scale

    def fill(name: str, ne: tuple[int, ...]) -> np.ndarray:
        shape = tuple(reversed(ne))
        if name == "token_embd.weight":
            return embd
        if name == "output.weight":
            return out
        if name.endswith("norm.weight"):
            return np.ones(shape, np.float32)
        if name.endswith(("attn_output.weight", "ffn_down.weight")):
            return np.zeros(shape, np.float32)
        w: np.ndarray = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(ne[0]))
        return w

    return fill


def write_tiny_chat(
    path: str | os.PathLike[str],
    family: str,
    *,
    chat_template: Optional[str],
    reply: str = "Hi!",
    end_token: Optional[str] = None,
    n_layer: int = 1,
) -> Path:
    """A llama whose greedy reply to any prompt is ``reply`` then ``end_token``; its layers
    (``n_layer``, one unless told: more, for drafters that keep some) add nothing.

    ``family`` picks the special tokens (see ``FAMILIES``); ``chat_template`` is written as
    ``tokenizer.chat_template`` (None: no template). ``reply`` is ASCII with no character
    twice (each byte token has one successor); ``end_token`` defaults to the family's EOS.
    """
    fam = FAMILIES[family]
    if len(set(reply)) != len(reply) or not reply.isascii():
        raise ValueError("reply must be ASCII with no repeated character")
    alphabet = byte_alphabet()
    tokens = alphabet + [t for t in dict.fromkeys((fam.bos, fam.eos) + fam.specials) if t]
    ids = {t: i for i, t in enumerate(tokens)}
    end = ids[end_token or fam.eos]
    chain = [ids[alphabet[ord(c)]] for c in reply] + [end]
    n_vocab = len(tokens)
    succ = np.full(n_vocab, chain[0])
    for a, b in zip(chain, chain[1:]):
        succ[a] = b
    d = successor_dims(n_vocab, n_ctx_train=2048, n_layer=n_layer)
    fill = successor_fill(succ, d, LOGIT)

    def add_kv(w: gguf.GGUFWriter) -> None:
        add_llama_kv(w, d)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([gguf.TokenType.NORMAL] * 256
                          + [gguf.TokenType.CONTROL] * (n_vocab - 256))
        w.add_token_merges([f"{alphabet[ord('a')]} {alphabet[ord('b')]}"])
        if fam.bos:
            w.add_bos_token_id(ids[fam.bos])
        w.add_eos_token_id(ids[fam.eos])
        w.add_add_bos_token(fam.add_bos)
        if chat_template is not None:
            w.add_chat_template(chat_template)

    return write_gguf(path, "llama", llama_layout(d), fill, add_kv, name=f"tiny-chat-{family}")
