"""Logprobs under a constraint list only tokens the constraint allows as alternatives.

A row a grammar masks holds -inf for every token it refuses; where it allowed fewer tokens
than the ``top_logprobs`` asked, the list went on with refused tokens at -inf (the lowest
ids: ``(0, -inf), (1, -inf)``). The server's JSON could not carry them: a non-streamed
answer was a 500 ('Out of range float values are not JSON compliant') and a streamed one
sent ``-Infinity``, which is not JSON. OpenAI allows fewer alternatives than asked.
"""
import json
import math

import pytest

import specdec

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def dec(tiny_bytes):
    with specdec.Decoder(tiny_bytes, drafter="ngram", n_max=3, n_ctx=128) as d:
        yield d


def _finite(lps):
    assert lps, "logprobs were asked for"
    for lp in lps:
        assert math.isfinite(lp.logprob)
        assert all(math.isfinite(x) for _, x in lp.top)


@pytest.mark.parametrize("kw", [dict(regex="ab"), dict(choices=["ab", "ba", "b"]),
                                dict(json_schema={"type": "boolean"})])
def test_alternatives_are_allowed_tokens(dec, kw):
    res = dec.generate("hello", max_tokens=8, logprobs=3, **kw)
    _finite(res.logprobs)
    # regex 'ab': each row allows one token, which is the one chosen, at probability 1
    if "regex" in kw:
        assert [(lp.logprob, len(lp.top)) for lp in res.logprobs] == [(0.0, 1), (0.0, 1)]
    streamed = [lp for p in dec.stream("hello", max_tokens=8, logprobs=3, **kw).pieces()
                for lp in p.logprobs or []]
    _finite(streamed)


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("stream", [False, True])
def test_openai_shapes_are_json(dec, kind, stream):
    kw = dict(guided_regex="ab", max_tokens=8, stream=stream, temperature=0.7, seed=1)
    if kind == "chat":
        out = dec.create_chat_completion([{"role": "user", "content": "hi"}],
                                         chat_template="chatml", logprobs=True,
                                         top_logprobs=3, **kw)
    else:
        out = dec.create_completion("hello", logprobs=3, **kw)
    chunks = list(out) if stream else [out]
    # strict JSON, as a server sends it (allow_nan=False: no Infinity)
    for c in chunks:
        json.dumps(c, allow_nan=False)
    if kind == "completion" and not stream:
        assert out["choices"][0]["logprobs"]["top_logprobs"] == [{"a": 0.0}, {"b": 0.0}]
