"""specdec's MTP drafts against llama.cpp's own ``draft-mtp`` (slow: builds llama.cpp's tools),
round by round (tests/llama_reference.py)."""
from __future__ import annotations

import pytest

from llama_reference import compare
from specdec.testing import write_bigram_mtp_model, write_tiny_qwen35

N_GEN = 96


@pytest.fixture(scope="module")
def llama_tools():
    from specdec.benchmark import llama_tools
    llama_tools.ensure_tools(("llama-speculative-simple",))
    return llama_tools


@pytest.mark.slow
@pytest.mark.parametrize("n_max", [1, 3])
def test_drafts_equal_llama_draft_mtp_on_bigram(model_file, llama_tools, n_max):
    """The bigram model with a noisy head: every acceptance count from 0 to n_max occurs."""
    path = model_file("bigram-ref-n0.2.gguf", lambda p: write_bigram_mtp_model(p, noise=0.2))
    rounds = compare(path, "hello world, this is a prompt for the bigram model", n_max,
                     llama_tools, N_GEN)
    assert {a for _, a in rounds} == set(range(n_max + 1))


@pytest.mark.slow
def test_drafts_equal_llama_draft_mtp_on_random_model(model_file, llama_tools):
    """Random weights: every draft depends on the MTP KV and on the target's hidden rows."""
    path = model_file("tiny-qwen35-ref.gguf", lambda p: write_tiny_qwen35(p, seed=11))
    compare(path, "the quick brown fox jumps over the lazy dog", 2, llama_tools, N_GEN)
