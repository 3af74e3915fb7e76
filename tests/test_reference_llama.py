"""specdec against llama.cpp's own binaries, built from the same pinned tree (slow)."""
import importlib.util
import sys
from pathlib import Path

import pytest

import specdec

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name):
    # by path: putting the repo root on sys.path would shadow the installed package
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def llama_tools():
    tools = _load("llama_tools")
    tools.ensure_tools(("llama-simple",))
    return tools


@pytest.mark.slow
def test_greedy_equals_llama_simple(gemma_path, llama_tools):
    """Plain greedy output of specdec equals llama-simple's on gemma3-270m, 64+ tokens each."""
    prompts = _load("prompts").all_prompts()
    dec = specdec.Decoder(gemma_path, n_ctx=4096, n_threads=2)
    mismatches = []
    for p in prompts:
        ours = dec.generate(p.text, max_tokens=64)
        ref = llama_tools.run_simple(gemma_path, p.text, 64, threads=2)
        if ours.text != ref:
            mismatches.append((p.name, ours.text, ref))
    assert len(prompts) >= 5
    assert not mismatches, "\n\n".join(f"{n}:\nours {o!r}\nref  {r!r}" for n, o, r in mismatches)
