"""specdec's MTP drafts against llama.cpp's own ``draft-mtp`` (slow: builds llama.cpp's tools).

``llama-speculative-simple --spec-type draft-mtp -v`` logs every draft token (its top
candidate per draft step) and every verification (``accepted A/K``). specdec's
controller records the same with ``record=True``. Both run greedy on the same model
and prompt, so round for round the drafts, and the accepted counts, must be equal.
"""
from __future__ import annotations

import pytest

from specdec import Decoder
from specdec._controller import Controller
from specdec.testing import write_bigram_mtp_model, write_tiny_qwen35

N_GEN = 96


@pytest.fixture(scope="module")
def llama_tools():
    from specdec.benchmark import llama_tools
    llama_tools.ensure_tools(("llama-speculative-simple",))
    return llama_tools


def _specdec_drafts(path: str, prompt: str, n_max: int, n_gen: int):
    dec = Decoder(path, drafter="mtp", n_max=n_max, n_ctx=1024, n_threads=2)
    ctl = Controller(dec.ctx, dec.drafters, n_max=n_max, record=True)
    ctl.start([dec.tokenize(prompt)], n_gen)
    ctl.run()
    return [(d, a) for _, d, a in ctl.draft_log], ctl.tokens()


def _compare(path: str, prompt: str, n_max: int, llama_tools):
    ref = llama_tools.run_spec_simple(path, prompt, N_GEN, spec_type="draft-mtp", n_max=n_max,
                                      drafts=True, extra=("-c", "1024"))
    ours, tokens = _specdec_drafts(path, prompt, n_max, N_GEN)
    theirs = ref["drafts"]
    # llama.cpp trims its last drafts to the remaining budget and may overshoot -n by a
    # draft: compare the rounds both ran in full
    n = min(len(ours), len(theirs)) - 2
    assert n >= 10, f"too few rounds to compare ({len(ours)} ours, {len(theirs)} llama.cpp)"
    for i in range(n):
        assert ours[i] == theirs[i], (f"round {i}: specdec drafted {ours[i][0]} (accepted "
                                      f"{ours[i][1]}), llama.cpp {theirs[i][0]} (accepted "
                                      f"{theirs[i][1]})")
    return ours[:n]


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
