"""Logprobs of tokens that hold part of a UTF-8 character (byte-level or byte-fallback
tokens): chat's ``bytes`` are the token's own bytes, so that a client can join a character
split across tokens, as OpenAI's field is for.

They were the bytes of the token's text decoded with replacement: every such token said
``[239, 191, 189]`` (U+FFFD), on Gemma for any character outside its vocabulary.
"""
import pytest

import specdec

pytest.importorskip("llguidance")

TEXT = "é€"          # 2 + 3 bytes, one token each in the byte model


@pytest.fixture(scope="module")
def dec(tiny_bytes):
    with specdec.Decoder(tiny_bytes, n_ctx=128) as d:
        yield d


def test_chat_logprob_bytes_join_into_the_text(dec):
    for stream in (False, True):
        r = dec.create_chat_completion([{"role": "user", "content": "hi"}], chat_template="chatml",
                                       guided_regex=TEXT, logprobs=True, top_logprobs=2,
                                       max_tokens=16, stream=stream)
        if stream:
            content = [t for c in r if c["choices"] and c["choices"][0]["logprobs"]
                       for t in c["choices"][0]["logprobs"]["content"]]
        else:
            assert r["choices"][0]["message"]["content"] == TEXT
            content = r["choices"][0]["logprobs"]["content"]
        assert len(content) == len(TEXT.encode())
        assert bytes(b for t in content for b in t["bytes"]).decode() == TEXT
        assert [t["bytes"] for t in content] == [[b] for b in TEXT.encode()]
        for t in content:
            assert t["top_logprobs"][0]["bytes"] == t["bytes"]


def test_completion_logprobs_of_partial_characters(dec):
    r = dec.create_completion("hi", guided_regex=TEXT, logprobs=1, max_tokens=16)
    lp = r["choices"][0]["logprobs"]
    assert r["choices"][0]["text"] == TEXT
    assert len(lp["tokens"]) == len(TEXT.encode()) == len(lp["text_offset"])
    assert all(t == "\ufffd" for t in lp["tokens"])     # no token is a character of its own
    # each token's offset is where the character that holds its first byte begins
    assert lp["text_offset"] == [0, 0, 1, 1, 1]
    for stream_offsets in ([o for c in dec.create_completion("hi", guided_regex=TEXT, logprobs=1,
                                                             max_tokens=16, stream=True)
                            if c["choices"] and c["choices"][0]["logprobs"]
                            for o in c["choices"][0]["logprobs"]["text_offset"]],):
        assert stream_offsets == sorted(stream_offsets)
        assert all(0 <= o <= len(TEXT) for o in stream_offsets)
