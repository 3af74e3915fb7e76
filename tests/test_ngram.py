"""The n-gram (prompt lookup) drafter: its lookups, and lossless greedy output."""
import pytest

from specdec import Decoder
from specdec.drafters import create
from specdec.drafters._run import run_begin, run_observe, run_propose

CODE = '''def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b


def div(a, b):
'''


def test_lookup_semantics(gemma):
    from specdec import Context
    d = create("ngram")
    d.bind(Context(gemma, n_ctx=64), 1)
    run_begin(d, 0, [1, 2, 3, 4, 5, 6, 2, 3])
    run_observe(d, 0, [1, 2, 3, 4, 5, 6, 2, 3])
    # key [2, 3] + pending 4 matched at 1..3: continue with 5, 6, 2, 3
    assert run_propose(d, 0, 4, 3) == [5, 6, 2]
    assert run_propose(d, 0, 4, 10) == [5, 6, 2, 3]
    assert run_propose(d, 0, 9, 4) == []
    run_observe(d, 0, [4, 5])
    # latest occurrence wins: ... 2 3 4 5 | pending 6 -> key [4, 5, 6] seen once -> 2, 3, 4, 5
    assert run_propose(d, 0, 6, 4) == [2, 3, 4, 5]


def test_fallback_to_shorter_keys(gemma):
    from specdec import Context
    d = create("ngram", n_min_key=1)
    d.bind(Context(gemma, n_ctx=64), 1)
    run_begin(d, 0, [7, 8, 9, 1, 2])
    run_observe(d, 0, [7, 8, 9, 1, 2])
    assert run_propose(d, 0, 8, 2) == [9, 1]   # only the 1-gram [8] matches


@pytest.mark.parametrize("n_max", [1, 3, 6])
def test_greedy_equal_to_plain_synthetic(tiny_dense, n_max):
    prompt = list(range(3, 40)) * 3
    plain = Decoder(tiny_dense, n_ctx=512).generate(prompt, max_tokens=64)
    spec = Decoder(tiny_dense, drafter="ngram", n_max=n_max, n_ctx=512, check=True).generate(
        prompt, max_tokens=64)
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted > 0


def test_ngram_speeds_up_repetition(gemma_path):
    # exact mode: batch-invariant kernels, so every token must equal plain decoding's
    plain = Decoder(gemma_path, n_ctx=1024, exact=True).generate(CODE, max_tokens=60)
    spec = Decoder(gemma_path, drafter="ngram", n_max=4, n_ctx=1024, exact=True,
                   check=True).generate(CODE, max_tokens=60)
    assert spec.stats.accepted > 10
    assert spec.stats.rounds < 60
    assert len(spec.tokens) == len(plain.tokens) == 60
    assert spec.tokens == plain.tokens


def test_the_longest_match_wins_over_the_latest(gemma):
    """The key [2, 3] + pending 4 occurs twice; the older occurrence is preceded by the same
    9, 8 as the current text (a match of 5 tokens, against 3 for the latest), so it is the
    passage being repeated and its continuation is drafted."""
    from specdec import Context
    d = create("ngram")
    d.bind(Context(gemma, n_ctx=64), 1)
    hist = [9, 8, 2, 3, 4, 50, 51, 52, 1, 2, 3, 4, 60, 61, 7, 9, 8, 2, 3]
    run_begin(d, 0, hist)
    run_observe(d, 0, hist)
    assert run_propose(d, 0, 4, 3) == [50, 51, 52]
    # a context that matches the latest occurrence as long: the latest wins
    hist2 = [5, 2, 3, 4, 50, 6, 2, 3, 4, 60, 7, 2, 3]
    run_begin(d, 0, hist2)
    run_observe(d, 0, hist2)
    assert run_propose(d, 0, 4, 1) == [60]
