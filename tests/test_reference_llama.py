"""specdec against llama.cpp's own binaries, built from the same pinned tree (slow)."""
import pytest

import specdec
from specdec.benchmark import prompts


@pytest.fixture(scope="module")
def llama_tools():
    from specdec.benchmark import llama_tools as tools
    tools.ensure_tools(("llama-simple",))
    return tools


@pytest.mark.slow
def test_greedy_equals_llama_simple(gemma_path, llama_tools):
    """Plain greedy output of specdec equals llama-simple's on gemma3-270m, 64+ tokens each."""
    all_prompts = prompts.all_prompts()
    # each llama-simple run decodes its prompt in one batch from an empty context: so does each
    # generate here (prefix reuse would keep the BOS row and split the prompt pass otherwise)
    dec = specdec.Decoder(gemma_path, n_ctx=4096, n_threads=2, prefix_reuse=False)
    mismatches = []
    for p in all_prompts:
        ours = dec.generate(p.text, max_tokens=64)
        ref = llama_tools.run_simple(gemma_path, p.text, 64, threads=2)
        if ours.text != ref:
            mismatches.append((p.name, ours.text, ref))
    assert len(all_prompts) >= 5
    assert not mismatches, "\n\n".join(f"{n}:\nours {o!r}\nref  {r!r}" for n, o, r in mismatches)


@pytest.mark.slow
def test_a_prompt_with_escapes_reaches_llama_cpp_as_written(gemma_path, llama_tools):
    """Source code with escapes in its string literals ("\\n", "\\t", "\\r\\n"): llama.cpp's
    common options would turn them into control characters (``--escape`` is on by default),
    and its side would decode another prompt than specdec's. The bench passes ``--no-escape``:
    the prompt's echo is found, the run measured."""
    llama_tools.ensure_tools(("llama-speculative-simple",))
    text = ('def dialect():\n    lineterminator = "\\r\\n"\n    sep = "\\t"\n'
            '    return lineterminator + sep + "\\\\"\n\n') * 3
    res = llama_tools.run_spec_simple(gemma_path, text, 8, spec_type="ngram-simple", n_max=3,
                                      threads=2, extra=("--spec-ngram-simple-size-n", "3"))
    assert res["n_predict"] >= 1
