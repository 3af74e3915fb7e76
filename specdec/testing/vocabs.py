"""One letter language under several byte-level BPE vocabularies, for drafts across tokenizers.

The text is a cycle through the 52 ASCII letters in a seeded order (``accents=True`` adds 12
two-byte letters, ``ACCENTS``, each with its own lead and continuation byte). A vocabulary
holds the 256 byte tokens (GPT-2's alphabet), one token per accented letter, one token per
pair of the cycle (their merges) and ``<|endoftext|>``; the model is a one-layer llama whose
greedy output continues the cycle in that vocabulary's own segmentation (one-hot embeddings,
zero layer outputs, ``output[succ[t]] = logit * embd[t]``, as in ``chat.py``). Variants of
the same text:

* ``"target"``: pairs start at even positions of the cycle;
* ``"permuted"``: the same tokens and merges under shuffled ids;
* ``"shifted"``: pairs start at odd positions, so every target pair straddles two draft tokens;
* ``"chars"``: bytes only: a target pair is two or more draft tokens, and an accented letter
  is two bytes, the first of them a partial UTF-8 character;
* ``"padded"``: the target's tokens and ids plus 200 control padding tokens.

Greedy text therefore agrees between variants, so a translated draft is accepted almost
always; ``noise`` adds Gaussian noise to the logits (sampling tests) without moving the argmax
for small values.
"""
from __future__ import annotations

import os
import string
from pathlib import Path

import gguf
import numpy as np

from specdec.testing.chat import byte_alphabet, successor_dims, successor_fill
from specdec.testing.tiny import add_llama_kv, llama_layout, write_gguf

VARIANTS = ("target", "permuted", "shifted", "chars", "padded")
EOS_TEXT = "<|endoftext|>"
N_PAD = 200
#: two-byte letters whose lead bytes differ and whose continuation bytes differ, so that a
#: byte-level bigram can spell them
ACCENTS = "éąłƒǎșɐʃαωжя"


def letter_cycle(seed: int = 0, *, accents: bool = False) -> str:
    """The letters in the order the language cycles through them."""
    letters = list(string.ascii_letters + (ACCENTS if accents else ""))
    return "".join(np.random.default_rng(seed).permutation(letters).tolist())


def _spell(text: str) -> str:
    """Text as byte-level BPE token text (GPT-2's stand-ins for its UTF-8 bytes)."""
    alphabet = byte_alphabet()
    return "".join(alphabet[b] for b in text.encode("utf-8"))


def _vocab(variant: str, cycle: str) -> tuple[list[str], list[int], list[str]]:
    """Token texts, token types and merges."""
    n = len(cycle)
    first = {"target": 0, "permuted": 0, "padded": 0, "shifted": 1}.get(variant)
    pairs = [] if first is None else [
        (cycle[k % n], cycle[(k + 1) % n]) for k in range(first, n + first, 2)]
    wide = [] if first is None else [c for c in cycle if len(_spell(c)) > 1]
    merges = [" ".join(_spell(c)) for c in wide] + [f"{_spell(a)} {_spell(b)}" for a, b in pairs]
    tokens = (byte_alphabet() + [_spell(c) for c in wide] + [_spell(a + b) for a, b in pairs]
              + [EOS_TEXT])
    types = [gguf.TokenType.NORMAL] * (len(tokens) - 1) + [gguf.TokenType.CONTROL]
    if variant == "padded":
        tokens += [f"<pad_{i}>" for i in range(N_PAD)]
        types += [gguf.TokenType.CONTROL] * N_PAD
    return tokens, types, merges


def _successors(tokens: list[str], cycle: str) -> np.ndarray:
    """Each token's greedy successor: the token that starts where it ends in the cycle (the
    pair there if this vocabulary has one, else the letter, else the letter's first byte);
    a letter's first byte is followed by its second. Any other token is followed by the
    token at the cycle's start."""
    ids = {t: i for i, t in enumerate(tokens)}
    n = len(cycle)

    def starting_at(k: int) -> int:
        a, b = _spell(cycle[k % n]), _spell(cycle[(k + 1) % n])
        return ids.get(a + b, ids.get(a, ids[a[0]]))

    succ = np.full(len(tokens), starting_at(0))
    for k, c in enumerate(cycle):
        sc = _spell(c)
        for t in (sc, _spell(cycle[k - 1]) + sc):   # the letter, and a pair ending in it
            if t in ids:
                succ[ids[t]] = starting_at(k + 1)
        if len(sc) > 1:
            succ[ids[sc[0]]] = ids[sc[1]]
            succ[ids[sc[1]]] = starting_at(k + 1)
    return succ


def write_letter_model(
    path: str | os.PathLike[str],
    variant: str = "target",
    *,
    seed: int = 0,
    accents: bool = False,
    logit: float = 30.0,
    noise: float = 0.0,
) -> Path:
    """A one-layer llama speaking the letter cycle ``letter_cycle(seed, accents=accents)`` in
    ``variant``'s vocabulary (see the module docstring); ``logit`` is the successor's logit."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    cycle = letter_cycle(seed, accents=accents)
    tokens, types, merges = _vocab(variant, cycle)
    succ = _successors(tokens, cycle)
    n_vocab = len(tokens)
    order = np.arange(n_vocab)
    if variant == "permuted":   # same texts under other ids
        order = np.random.default_rng(seed + 1).permutation(n_vocab)
        inv = np.argsort(order)              # old id -> new id
        tokens = [tokens[o] for o in order]
        types = [types[o] for o in order]
        succ = inv[succ[order]]
    d = successor_dims(n_vocab, n_ctx_train=4096)
    fill = successor_fill(succ, d, logit, noise=noise, seed=seed + 2)

    def add_kv(w: gguf.GGUFWriter) -> None:
        add_llama_kv(w, d)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges or [f"{byte_alphabet()[0]} {byte_alphabet()[1]}"])
        w.add_eos_token_id(tokens.index(EOS_TEXT))
        w.add_add_bos_token(False)

    return write_gguf(path, "llama", llama_layout(d), fill, add_kv, name=f"letters-{variant}")
