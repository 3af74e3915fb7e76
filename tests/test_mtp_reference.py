"""specdec's MTP drafts against llama.cpp's own ``draft-mtp`` (slow: builds llama.cpp's tools).

``llama-speculative-simple --spec-type draft-mtp -v`` logs every draft token (its top
candidate per draft step) and every verification (``accepted A/K``). specdec's
controller records the same with ``record=True``. Both run greedy on the same model
and prompt, so every draft made from the same position (the same committed history)
must be the same tokens, with the same accepted count.
"""
from __future__ import annotations

import pytest

from specdec import Decoder, Model
from specdec._checks import CheckedController
from specdec.testing import write_bigram_mtp_model, write_tiny_qwen35

N_GEN = 96


@pytest.fixture(scope="module")
def llama_tools():
    from specdec.benchmark import llama_tools
    llama_tools.ensure_tools(("llama-speculative-simple",))
    return llama_tools


def _echo(path: str, prompt: str) -> str:
    """The prompt as llama.cpp prints it back (the test vocab detokenizes to hex)."""
    m = Model(path)
    return b"".join(m.token_to_piece(t, special=True) for t in
                    m.tokenize(prompt, add_special=True, parse_special=True)).decode("utf-8", "replace")


def _specdec_drafts(path: str, prompt: str, n_max: int, n_gen: int):
    """``{pos: (drafts, accepted)}`` of specdec's rounds, and the prompt length."""
    dec = Decoder(path, drafter="mtp", n_max=n_max, n_ctx=1024, n_threads=2)
    ctl = CheckedController(dec.ctx, dec.drafters, n_max=n_max, record=True)
    toks = dec.tokenize(prompt)
    ctl.start([toks], n_gen)
    ctl.run()
    return {pos: (d, a) for _, pos, d, a in ctl.draft_log}, len(toks)


def _llama_drafts(rounds, n_prompt: int):
    """Positions of llama.cpp's rounds: its first pending token is the last prompt token
    (it decodes the prompt but one, so its first draft is the first generated token, where
    specdec drafts from the first generated token), and each round moves by accepted + 1."""
    out, pos = {}, n_prompt - 1
    for d, a in rounds:
        if d:
            out[pos] = (d, a)
        pos += a + 1
    return out


def _compare(path: str, prompt: str, n_max: int, llama_tools):
    ref = llama_tools.run_spec_simple(path, prompt, N_GEN, spec_type="draft-mtp", n_max=n_max,
                                      drafts=True, echo=_echo(path, prompt), extra=("-c", "1024"))
    ours, n_prompt = _specdec_drafts(path, prompt, n_max, N_GEN)
    theirs = _llama_drafts(ref["drafts"], n_prompt)
    # the rounds of both start at the same positions once they meet (same state, same
    # draft, same verdict); llama.cpp trims its last drafts to the remaining budget
    last = n_prompt + N_GEN - 2 * n_max - 2
    common = sorted(p for p in ours.keys() & theirs.keys() if p < last)
    assert len(common) >= 0.6 * len([p for p in ours if p < last]) and len(common) >= 10, \
        f"too few rounds at the same positions ({len(common)} of {len(ours)})"
    for p in common:
        assert ours[p] == theirs[p], (f"position {p}: specdec drafted {ours[p][0]} (accepted "
                                      f"{ours[p][1]}), llama.cpp {theirs[p][0]} (accepted "
                                      f"{theirs[p][1]})")
    return [ours[p] for p in common]


@pytest.mark.slow
@pytest.mark.parametrize("n_max", [1, 3])
def test_drafts_equal_llama_draft_mtp_on_bigram(model_file, llama_tools, n_max):
    """The bigram model with a noisy head: every acceptance count from 0 to n_max occurs."""
    path = model_file("bigram-ref-n0.2.gguf", lambda p: write_bigram_mtp_model(p, noise=0.2))
    rounds = _compare(path, "hello world, this is a prompt for the bigram model", n_max,
                      llama_tools)
    assert {a for _, a in rounds} == set(range(n_max + 1))


@pytest.mark.slow
def test_drafts_equal_llama_draft_mtp_on_random_model(model_file, llama_tools):
    """Random weights: every draft depends on the MTP KV and on the target's hidden rows."""
    path = model_file("tiny-qwen35-ref.gguf", lambda p: write_tiny_qwen35(p, seed=11))
    _compare(path, "the quick brown fox jumps over the lazy dog", 2, llama_tools)
