"""specdec's DFlash drafts against llama.cpp's own ``draft-dflash`` (slow: builds llama.cpp's
tools), round by round (tests/llama_reference.py), on the synthetic periodic bigram target
and DFlash draft of specdec.testing."""
from __future__ import annotations

import pytest

from llama_reference import compare
from specdec.testing import write_bigram_mtp_model, write_dflash_draft

N_GEN = 96
PERIOD = 16


@pytest.fixture(scope="module")
def llama_tools():
    from specdec.benchmark import llama_tools
    llama_tools.ensure_tools(("llama-speculative-simple",))
    return llama_tools


@pytest.mark.slow
@pytest.mark.parametrize("n_max", [3, 7])
def test_drafts_equal_llama_draft_dflash(model_file, llama_tools, n_max):
    """A draft right on 70% of every cycle's tokens: rejected and fully accepted drafts."""
    target = model_file(f"bigram-qwen35-period{PERIOD}.gguf",
                        lambda p: write_bigram_mtp_model(p, period=PERIOD))
    draft = model_file("dflash-ref-0.7.gguf",
                       lambda p: write_dflash_draft(p, target, acceptance=0.7))
    rounds = compare(target, "hello world, this is a prompt for the bigram model", n_max,
                     llama_tools, N_GEN, spec_type="draft-dflash", drafter=f"dflash:{draft}",
                     draft=draft, extra=("--spec-draft-p-min", "0"))
    assert {0, n_max} <= {a for _, a in rounds}
