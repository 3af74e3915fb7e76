"""Exact mode: greedy speculative output equals plain output token for token on a real
quantized model, prompts longer than Gemma's 512-token sliding window included."""
import pytest

import specdec
from specdec import Decoder
from specdec.benchmark.prompts import all_prompts


def _prompts():
    ps = all_prompts()
    return [(p.name, p.text) for p in ps] + [("long", ps[0].text + "\n\n" + ps[5].text)]


@pytest.fixture(scope="module")
def exact_model(gemma_path):
    return specdec.Model(gemma_path, use_extra_bufts=False)


ORACLE_PROMPTS = {
    "code": "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"
            "    out = []\n    i = j = 0\n",
    "c": "#ifndef RING_BUFFER_H\n#define RING_BUFFER_H\n\n#include <stddef.h>\n#include <stdint.h>\n\n"
         "typedef struct ring_buffer {\n    uint8_t *data;\n    size_t capacity;\n    size_t head;\n"
         "    size_t tail;\n} ring_buffer_t;\n\nint ring_buffer_init(ring_buffer_t *rb, size_t capacity);\n",
    "prose": "The lighthouse keeper climbed the narrow stairs every evening at dusk. He had done so "
             "for thirty years, and in all that time",
    "records": "id,name,city,age\n1,Alice Martin,Lyon,34\n2,Bruno Keller,Basel,41\n"
               "3,Chiara Rossi,Turin,29\n4,",
}


@pytest.fixture(scope="module")
def oracle_book(exact_model):
    """Each prompt's exact-mode plain greedy continuation."""
    plain = Decoder(exact_model, exact=True, n_ctx=1024)
    book = {}
    for text in ORACLE_PROMPTS.values():
        book[tuple(plain.tokenize(text))] = plain.generate(text, max_tokens=112).tokens
    return book


@pytest.mark.parametrize("n_max", [4, 8, 16])
def test_oracle_drafter_changes_nothing(exact_model, oracle_book, n_max):
    """A drafter that proposes the exact plain continuation is accepted in full and the
    output is the plain output, whatever the verify batch size (2 to n_max + 1 rows)."""
    from specdec.benchmark.oracle import Oracle
    dec = Decoder(exact_model, drafter=Oracle(oracle_book), n_max=n_max, exact=True, n_ctx=1024)
    for name, text in ORACLE_PROMPTS.items():
        want = oracle_book[tuple(dec.tokenize(text))]
        res = dec.generate(text, max_tokens=96)
        assert res.tokens == want[:96], (
            f"{name}, n_max={n_max}: first differing token "
            f"{next(i for i, (x, y) in enumerate(zip(res.tokens, want)) if x != y)}")
        assert res.stats.drafted > 0
        assert res.stats.accepted == res.stats.drafted, (name, n_max)
        assert max(i for i, c in enumerate(res.stats.accepted_per_position) if c) == n_max - 1


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


def test_exact_refuses_a_ubatch_that_splits_the_verify(exact_model):
    with pytest.raises(ValueError, match="n_ubatch >= 9"):
        Decoder(exact_model, drafter="ngram", n_max=8, exact=True, n_ctx=256, n_ubatch=4)
    Decoder(exact_model, drafter="ngram", n_max=8, exact=True, n_ctx=256, n_ubatch=9)


@pytest.mark.parametrize("arch", ["dense", "mamba2", "qwen3next", "qwen35_nomtp"])
def test_one_token_prompt(request, arch):
    """Found by the Engine fuzz on mamba2: exact mode decoded a one-token prompt with a
    throw-away second row, which a target rolled back by checkpoints cannot drop (the
    request failed). Such targets decode it alone; drafters and the Engine still give plain
    decoding's tokens."""
    model = specdec.Model(request.getfixturevalue(f"tiny_{arch}_path"), use_extra_bufts=False)
    plain = Decoder(model, n_ctx=128, exact=True).generate([1], max_tokens=24)
    assert len(plain.tokens) == 24
    assert Decoder(model, drafter=["ngram", "suffix"], n_ctx=128,
                   exact=True).generate([1], max_tokens=24).tokens == plain.tokens
    with specdec.Engine(model, drafters=["ngram"], n_slots=2, n_ctx=128, exact=True) as eng:
        got = [h.result(60) for h in (eng.submit([1], max_tokens=24),
                                      eng.submit([1], max_tokens=24, drafter="plain"))]
    assert [r.tokens for r in got] == [plain.tokens, plain.tokens]
