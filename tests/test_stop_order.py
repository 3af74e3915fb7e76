"""Of several stop strings, the one that begins first cuts the text, whatever their order in
the list and whatever the drafter.

The output checked each stop string in list order and cut at the first listed one it found
in the text of a new token: ``stop=["5", "6"]`` on a first token "65" gave the text "6", a
stop string, where OpenAI's rule is that the text holds none. The oracle here is plain
decoding's tokens without stops: after each token the stop strings found in its text so far
cut it at the earliest start, and the tokens end with the one in which that stop begins.
"""
import random

import pytest

import specdec

PROMPT = [1, 2, 3, 1, 2, 3]
N = 120


@pytest.fixture(scope="module")
def setup(tiny_dense):
    with specdec.Decoder(tiny_dense, n_ctx=256) as plain:
        full = plain.generate(PROMPT, max_tokens=N)
    decoders = [specdec.Decoder(tiny_dense, n_ctx=256),
                specdec.Decoder(tiny_dense, n_ctx=256, drafter="ngram:1", n_max=6),
                specdec.Decoder(tiny_dense, n_ctx=256, drafter="suffix", n_max=8)]
    yield tiny_dense, full, decoders
    for d in decoders:
        d.close()


def _expected(model, full, stops):
    """(text, number of tokens, finish_reason) by the rule, from the tokens without stops."""
    for k in range(1, len(full.tokens) + 1):
        text = model.detokenize(full.tokens[:k])
        found = [text.find(s) for s in stops if s in text]
        if found:
            cut = min(found)
            keep = k
            while keep > 0 and len(model.detokenize(full.tokens[:keep - 1])) >= cut:
                keep -= 1
            return text[:cut], keep, "stop"
    return full.text, len(full.tokens), "length"


def test_the_earliest_stop_cuts_not_the_first_listed(setup):
    model, full, decoders = setup
    first = model.detokenize(full.tokens[:1])
    assert len(first) >= 2, first
    stops = [first[1], first[0]]          # the later one listed first
    res = decoders[0].generate(PROMPT, max_tokens=N, stop=stops)
    assert (res.text, res.tokens, res.finish_reason) == ("", [], "stop")


def test_random_stop_sets_follow_the_rule(setup):
    model, full, decoders = setup
    text = full.text
    rnd = random.Random(0)
    for case in range(60):
        stops = []
        for _ in range(rnd.randint(1, 4)):
            a = rnd.randrange(len(text))
            stops.append(text[a:a + rnd.randint(1, 6)] if rnd.random() < 0.85 else "zz")
        dec = decoders[case % 3]
        want = _expected(model, full, stops)
        if case % 2:
            res = dec.generate(PROMPT, max_tokens=N, stop=stops)
        else:
            s = dec.stream(PROMPT, max_tokens=N, stop=stops)
            assert "".join(s) == s.result.text
            res = s.result
        got = (res.text, len(res.tokens), res.finish_reason)
        assert got == want, (stops, dec.drafters)
        assert res.tokens == full.tokens[:len(res.tokens)]
        assert not any(s in res.text for s in stops)
