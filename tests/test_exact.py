"""Exact mode: greedy speculative output equals plain output token for token on a real
quantized model, prompts longer than Gemma's 512-token sliding window included."""
import importlib.util
import sys
from pathlib import Path

import pytest

import specdec
from specdec import Decoder


def _prompts():
    path = Path(__file__).resolve().parent.parent / "bench" / "prompts.py"
    spec = importlib.util.spec_from_file_location("_bench_prompts", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    ps = mod.all_prompts()
    return [(p.name, p.text) for p in ps] + [("long", ps[0].text + "\n\n" + ps[5].text)]


@pytest.fixture(scope="module")
def exact_model(gemma_path):
    return specdec.Model(gemma_path, use_extra_bufts=False)


def test_exact_needs_unpacked_weights(gemma):
    with pytest.raises(ValueError, match="use_extra_bufts=False"):
        Decoder(gemma, exact=True)


def test_exact_short(exact_model):
    text = "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"
    plain = Decoder(exact_model, exact=True, n_ctx=1024).generate(text, max_tokens=48)
    spec = Decoder(exact_model, drafter="ngram", n_max=4, exact=True, n_ctx=1024,
                   check=True).generate(text, max_tokens=48)
    assert spec.tokens == plain.tokens
    spec = Decoder(exact_model, drafter=["suffix", "ngram"], n_max=6, exact=True, n_ctx=1024,
                   check=True).generate(text, max_tokens=48)
    assert spec.tokens == plain.tokens
    one = Decoder(exact_model, exact=True, n_ctx=64).generate([exact_model.bos], max_tokens=5)
    assert len(one.tokens) == 5   # a one-token prompt is padded, not decoded alone


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["ngram"])
def test_exact_equals_plain_on_gemma(exact_model, drafter):
    prompts = _prompts()
    assert len(prompts) >= 8
    assert max(len(exact_model.tokenize(t)) for _, t in prompts) > 512
    plain = Decoder(exact_model, exact=True, n_ctx=8192)
    spec = Decoder(exact_model, drafter=drafter, n_max=4, exact=True, n_ctx=8192)
    bad = []
    for name, text in prompts:
        a = plain.generate(text, max_tokens=256).tokens
        b = spec.generate(text, max_tokens=256).tokens
        if a != b:
            bad.append((name, next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)))
    assert not bad, f"exact mode diverged (prompt, first differing token): {bad}"
