"""The GBNF the structured bench sends llama-server (``benchmark.schema_gbnf``) is the language
specdec compiles the same JSON schema to: compact JSON (``constraint.JSON_OPTIONS``), the
same lexemes and bounds. Each text is tried on both compiled by llguidance over a byte-level
vocabulary: both accept it whole, or neither does."""
import json

import pytest

llguidance = pytest.importorskip("llguidance")

from specdec.benchmark.schema_gbnf import int_range, schema_gbnf  # noqa: E402
from specdec.benchmark.structured_prompts import ORDER_SCHEMA, TICKET_SCHEMA  # noqa: E402
from specdec.constraint import Constraint, tokenizer  # noqa: E402

ORDER = {"customer": "Ana", "email": "a@b.example", "city": "Lyon", "order_id": "LB-1",
         "total": 312.75, "items": [{"name": "flour", "quantity": 10},
                                    {"name": "tray", "quantity": 4}]}
TICKET = {"category": "billing", "priority": "urgent", "sentiment": "negative",
          "needs_human": True}


_matchers = {}


def _accepts(model, grammar: str, text: str) -> bool:
    m = _matchers.get(grammar)
    if m is None:
        m = _matchers[grammar] = llguidance.LLMatcher(tokenizer(model), grammar, log_level=0)
        assert not m.is_error(), m.get_error()
    m.reset()
    toks = model.tokenize(text, add_special=False)
    return m.validate_tokens(toks) == len(toks) and m.consume_tokens(toks) and m.is_accepting()


def _texts(value, schema):
    compact = json.dumps(value, ensure_ascii=False)      # ", " and ": ", as specdec writes
    yield compact, True
    yield json.dumps(value, indent=2), False                # llama-server's pretty print
    yield json.dumps(value, separators=(",", ":")), False
    yield compact + " ", False
    yield compact[:-1], False
    first = next(iter(schema["properties"]))
    yield json.dumps({k: value[k] for k in list(value)[1:]}), False      # a required key gone
    yield json.dumps({**value, "extra": 1}), False
    yield json.dumps({first: value[first], **value}), True               # same order, same text


@pytest.mark.parametrize("value, schema, changes", [
    (ORDER, ORDER_SCHEMA, [{"total": -0.5}, {"total": 1e3}, {"city": "x" * 30},
                           {"city": "x" * 31}, {"customer": 'a "quoted" \\ name'},
                           {"customer": "tab\there"}, {"items": []},
                           {"items": [{"name": "n", "quantity": q} for q in (1, 99, 9, 10)]},
                           {"items": [{"name": "n", "quantity": 1}] * 5},
                           {"items": [{"name": "n", "quantity": 0}]},
                           {"items": [{"name": "n", "quantity": 100}]},
                           {"order_id": 7}]),
    (TICKET, TICKET_SCHEMA, [{"category": "other"}, {"category": "Other"},
                             {"needs_human": False}, {"needs_human": "false"},
                             {"priority": "medium"}]),
])
def test_the_gbnf_and_the_schema_accept_the_same_texts(tiny_bytes, value, schema, changes):
    by_schema = Constraint(json_schema=schema).llguidance_grammar()
    by_gbnf = Constraint(grammar=schema_gbnf(schema)).llguidance_grammar()
    texts = list(_texts(value, schema))
    texts += [(json.dumps({**value, **c}, ensure_ascii=False), None) for c in changes]
    seen = set()
    for text, expected in texts:
        a, b = _accepts(tiny_bytes, by_schema, text), _accepts(tiny_bytes, by_gbnf, text)
        assert a == b, (text, a, b)
        assert expected is None or a == expected, text
        seen.add(a)
    assert seen == {True, False}


def test_int_range_has_every_integer_of_its_bounds_and_no_other(tiny_bytes):
    for lo, hi in ((0, 9), (1, 99), (7, 7), (5, 123), (10, 1999)):
        grammar = Constraint(grammar=f"root ::= {int_range(lo, hi)}").llguidance_grammar()
        for n in range(0, 2100):
            assert _accepts(tiny_bytes, grammar, str(n)) == (lo <= n <= hi), (lo, hi, n)
        assert not _accepts(tiny_bytes, grammar, "0" + str(hi))
    with pytest.raises(ValueError, match="minimum"):
        int_range(-1, 3)


def test_what_it_does_not_convert_is_refused():
    for schema, match in (({"type": "object", "properties": {"a": {"type": "string"}}},
                           "closed objects"),
                          ({"type": "object", "properties": {"a": {"type": "string"}},
                            "additionalProperties": False}, "required"),
                          ({"type": "string", "pattern": "a+"}, "pattern"),
                          ({"type": "null"}, "null")):
        with pytest.raises(ValueError, match=match):
            schema_gbnf(schema)
