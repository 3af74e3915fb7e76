"""Structured output, by property: random JSON schemas and random grammars (every output
parses and validates, sampled and speculative), and the law of sampled speculation under a
grammar (chi-square against the masked, renormalised target)."""
from __future__ import annotations

import json
import math
import random
import re

import numpy as np
import pytest

import specdec
from specdec import Decoder
from specdec.drafters import Drafter

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st   # noqa: E402

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def decoders(tiny_bytes):
    return [Decoder(tiny_bytes, n_ctx=1024), Decoder(tiny_bytes, drafter="ngram", n_max=4, n_ctx=1024)]


# --- random schemas -----------------------------------------------------------------------

_leaf = st.one_of(
    st.just({"type": "boolean"}), st.just({"type": "null"}),
    st.builds(lambda lo, n: {"type": "integer", "minimum": lo, "maximum": lo + n},
              st.integers(-50, 50), st.integers(0, 1000)),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(lambda p: {"type": "string", "pattern": p},
              st.sampled_from(["^[a-z]{1,4}$", "^[0-9]{2}-[A-Z]$", "^(yes|no)$"])),
    st.builds(lambda vs: {"enum": vs},
              st.lists(st.one_of(st.text("abcxyz", min_size=1, max_size=4), st.integers(-9, 99),
                                 st.booleans(), st.none()), min_size=1, max_size=4, unique=True)),
)


def _obj(children):
    return st.builds(
        lambda props, req: {"type": "object", "properties": dict(props),
                            "required": [k for k, _ in props][:req],
                            "additionalProperties": False},
        st.lists(st.tuples(st.text("abcdefgh", min_size=1, max_size=5), children),
                 min_size=1, max_size=3, unique_by=lambda kv: kv[0]),
        st.integers(0, 3))


def _arr(children):
    return st.builds(lambda it, lo, n: {"type": "array", "items": it, "minItems": lo,
                                        "maxItems": lo + n},
                     children, st.integers(0, 1), st.integers(0, 2))


SCHEMAS = st.recursive(_leaf, lambda ch: st.one_of(_obj(ch), _arr(ch)), max_leaves=6)


@SETTINGS
@given(schema=SCHEMAS, seed=st.integers(0, 2**32), spec=st.booleans())
def test_random_schemas_give_valid_json(decoders, schema, seed, spec):
    dec = decoders[spec]
    res = dec.generate("x", max_tokens=400, json_schema=schema,
                       sampling={"temperature": 1.0, "seed": seed})
    assert res.finish_reason == "eos", (schema, res.text)
    jsonschema.validate(json.loads(res.text), schema)


# --- random grammars: regular by construction, so each has a Python regex twin -------------

_CHARS = "abcxyz019-"


def _literal(draw):
    s = draw(st.text(_CHARS, min_size=1, max_size=4))
    return json.dumps(s), re.escape(s)


def _class(draw):
    cs = sorted(set(draw(st.text(_CHARS.replace("-", ""), min_size=1, max_size=4))))
    return "[" + "".join(cs) + "]", "[" + "".join(cs) + "]"


@st.composite
def _expr(draw, depth=0, rep=True):
    # no repetition of a repetition: llguidance's GBNF converter writes (x?)? as x?? (a bug)
    kind = draw(st.sampled_from((["lit", "cls", "seq", "alt"] + ["rep"] * rep) if depth < 3
                                else ["lit", "cls"]))
    if kind == "lit":
        return _literal(draw)
    if kind == "cls":
        return _class(draw)
    parts = draw(st.lists(_expr(depth + 1), min_size=2, max_size=3))
    if kind == "seq":
        return " ".join(g for g, _ in parts), "".join(f"(?:{r})" for _, r in parts)
    if kind == "alt":
        return "(" + " | ".join(g for g, _ in parts) + ")", "|".join(f"(?:{r})" for _, r in parts)
    g, r = draw(_expr(depth + 1, rep=False))
    lo = draw(st.integers(0, 2))
    hi = max(lo + draw(st.integers(0, 3)), 1)     # x{0,0}: refused by llguidance
    return f"({g}){{{lo},{hi}}}", f"(?:{r}){{{lo},{hi}}}"


@st.composite
def grammars(draw):
    """A GBNF grammar of a few rules, and the regex of the same language."""
    body, rx = draw(_expr())
    extra, erx = draw(_expr(2))
    return (f"root ::= {body} tail\ntail ::= {extra}\n", f"(?:{rx})(?:{erx})")


@SETTINGS
@given(gr=grammars(), seed=st.integers(0, 2**32), spec=st.booleans())
def test_random_grammars_give_matching_text(decoders, gr, seed, spec):
    gbnf, rx = gr
    res = decoders[spec].generate("x", max_tokens=300, grammar=gbnf,
                                  sampling={"temperature": 1.0, "seed": seed})
    assert res.finish_reason == "eos", (gbnf, res.text)
    assert re.fullmatch(rx, res.text, re.S), (gbnf, rx, res.text)


# --- the law of sampled speculation under a grammar -----------------------------------------

class SkewedDrafter(Drafter):
    """Draws each draft token from a fixed q that puts mass where the grammar refuses ('z')
    and elsewhere than the target does: rejection sampling must still give the target's
    masked law."""

    Q = {"a": 0.15, "c": 0.55, "z": 0.3}

    def __init__(self, seed: int) -> None:
        super().__init__("skewed")
        self.rng = random.Random(seed)
        self.ids = {ch: ord(ch) for ch in self.Q}   # byte tokens: id == byte

    def propose(self, seq, last_token, n_max):
        toks = self.rng.choices(list(self.ids.values()), weights=list(self.Q.values()),
                                k=min(n_max, 2))
        return toks, [{self.ids[c]: p for c, p in self.Q.items()} for _ in toks]


def _expected(temperature: float) -> dict:
    """P(x1 x2) under regex [a-d]{2} for the tiny model: each row's logits are 30 at the
    successor ('a' after anything, 'b' after 'a', the end after 'b'), else 0; masked to
    a-d, softmax at T."""
    boost = math.exp(30.0 / temperature)

    def p(prev: str, x: str) -> float:
        succ = {"a": "b", "b": None}.get(prev, "a")
        w = {c: boost if c == succ else 1.0 for c in "abcd"}
        return w[x] / sum(w.values())
    return {x1 + x2: p("x", x1) * p(x1, x2) for x1 in "abcd" for x2 in "abcd"}


@pytest.mark.slow      # 3000 requests per case
@pytest.mark.parametrize("speculative", [False, True])
def test_sampled_law_under_a_grammar(tiny_bytes, speculative):
    from scipy.stats import chisquare
    t = 15.0
    dec = (Decoder(tiny_bytes, drafter=SkewedDrafter(7), n_max=2, n_ctx=256) if speculative
           else Decoder(tiny_bytes, n_ctx=256))
    n = 3000
    counts = dict.fromkeys(_expected(t), 0)
    drafted = 0
    for i in range(n):
        res = dec.generate("x", max_tokens=4, regex="[a-d]{2}",
                           sampling={"temperature": t, "seed": 1000 + i})
        counts[res.text] += 1
        drafted += res.stats.drafted
    exp = _expected(t)
    keys = sorted(exp)
    obs = np.array([counts[k] for k in keys], dtype=float)
    want = np.array([exp[k] for k in keys]) * n
    assert chisquare(obs, want).pvalue > 1e-3, dict(zip(keys, obs))
    if speculative:
        assert drafted > n / 2      # the drafts ran (the ones refused by the grammar are cut)
