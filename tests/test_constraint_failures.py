"""Constraints no output can match, or that llguidance cannot follow to the end, are errors.

Before, llguidance's error state allowed the end of text alone and the request ended there
with ``finish_reason="eos"``: ``regex="[^\\s\\S]"`` (an empty class) or a schema that refers
only to itself gave ``""``, and ``regex="a{99999999}"`` (past llguidance's lexer limit after
one token) gave ``"a"``, each looking like a match. Now the first is a ``ValueError`` when
the request is made (the first token's mask, computed then, is kept for the first row) and
the second fails the request with a ``ValueError`` naming llguidance's error; a regex that
ends in a lone backslash (which llguidance dropped) and text with a lone surrogate are
refused up front. The decoder, the engine and the server go on afterwards.
"""
import pytest

pytest.importorskip("llguidance")

import specdec   # noqa: E402

UNSATISFIABLE = [dict(regex="[^\\s\\S]"), dict(json_schema={"$ref": "#"})]
#: llguidance builds its lexer lazily: this regex fails at its second byte
TOO_BIG = dict(regex="a{99999999}")


@pytest.fixture(scope="module")
def dec(tiny_bytes):
    d = specdec.Decoder(tiny_bytes, drafter="ngram", n_max=3, n_ctx=128)
    yield d
    d.close()


def _usable(dec):
    assert dec.generate("hello", max_tokens=8).text == "ab"
    assert dec.generate("hello", max_tokens=8, regex="a|b").text == "a"


@pytest.mark.parametrize("kw", UNSATISFIABLE, ids=["empty-class", "self-ref-schema"])
@pytest.mark.parametrize("how", ["generate", "stream"])
def test_unsatisfiable_constraint_is_refused_up_front(dec, kw, how):
    with pytest.raises(ValueError, match="no output can match this constraint"):
        if how == "generate":
            dec.generate("hello", max_tokens=6, **kw)
        else:
            dec.stream("hello", max_tokens=6, **kw)
    _usable(dec)


@pytest.mark.parametrize("how", ["generate", "stream"])
def test_constraint_failing_mid_output_fails_the_request(dec, how):
    with pytest.raises(ValueError, match="constrained output failed after 1 tokens: lexer error"):
        if how == "generate":
            dec.generate("hello", max_tokens=6, **TOO_BIG)
        else:
            "".join(dec.stream("hello", max_tokens=6, **TOO_BIG))
    _usable(dec)


@pytest.mark.parametrize("kw, match", [
    (dict(regex="a\\"), "incomplete escape"),
    (dict(regex="ab\\\\\\"), "incomplete escape"),
    (dict(regex="\ud800"), "lone surrogate"),
    (dict(choices=["a", "\udfff"]), "lone surrogate"),
    (dict(grammar='root ::= "\ud800"'), "lone surrogate"),
])
def test_text_llguidance_would_misread_is_refused(dec, kw, match):
    with pytest.raises(ValueError, match=match):
        dec.generate("hello", max_tokens=4, **kw)
    _usable(dec)


def test_escaped_backslashes_still_match(dec):
    # an even run of backslashes at the end is an escaped backslash, not an incomplete escape
    assert dec.generate("hello", max_tokens=4, regex="a\\\\").text == "a\\"


def test_engine_refuses_and_fails_alike_and_goes_on(tiny_bytes):
    with specdec.Engine(tiny_bytes, drafters=["ngram"], n_slots=2, n_ctx=64) as engine:
        with pytest.raises(ValueError, match="no output can match"):
            engine.submit("x", max_tokens=4, **UNSATISFIABLE[0])
        bad = engine.submit("x", max_tokens=6, **TOO_BIG)
        good = engine.submit("x", max_tokens=6, choices=["ab", "ba"])
        with pytest.raises(ValueError, match="constrained output failed"):
            bad.result(timeout=60)
        assert good.result(timeout=60).text == "ab"
        assert engine.submit("x", max_tokens=4).result(timeout=60).text == "ab"
        assert engine.stats()["failed"] == 1


def test_openai_face_answers_a_bad_request(dec):
    # the server's protocol code: there a ValueError is a 400 (test_serve_structured)
    with pytest.raises(ValueError, match="no output can match"):
        dec.create_completion("hello", max_tokens=4, guided_regex="[^\\s\\S]")
    with pytest.raises(ValueError, match="constrained output failed"):
        dec.create_completion("hello", max_tokens=4, guided_regex="a{99999999}")
    out = dec.create_completion("hello", max_tokens=4, guided_choice=["ab"])
    assert out["choices"][0]["text"] == "ab"
