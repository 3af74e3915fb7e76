"""A structured request's JSON schema as GBNF in specdec's whitespace policy, for llama-server.

Why: llama-server turns a ``json_schema`` field into a grammar that lets the model put any
whitespace between tokens (its converter's ``space`` rule), and gemma takes the room to
pretty-print, while specdec writes JSON compactly (``constraint.JSON_OPTIONS``: one space
after ``:`` and ``,``, no other whitespace). Both sides decoding the same schema would then
not write the same answers. This GBNF, sent in llama-server's ``grammar`` field, is the
language specdec's schema compiles to: the same separators (read from ``JSON_OPTIONS``), the
same string, number and integer lexemes as llguidance's JSON (strings: any character but
``"``, ``\\`` and controls, or an escape; ``maxLength`` counts characters), properties in the
schema's order. It covers the keywords the structured requests use (object with
``properties`` / ``required`` / ``additionalProperties: false``, string with ``maxLength``,
``enum``, number, integer with ``minimum`` / ``maximum`` from 0, boolean, array with ``items``
and ``maxItems``) and refuses others. The bench checks the two languages agree: specdec's own
constrained decoding under this GBNF must equal its decoding under the schema
(``structured._exact_check``).
"""
from __future__ import annotations

import json
import re
from typing import Any, Dict, List

from ..constraint import JSON_OPTIONS

_KNOWN = {"type", "properties", "required", "additionalProperties", "maxLength", "enum",
          "minimum", "maximum", "items", "maxItems"}
_CHAR = r'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
_NUMBER = r'"-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?'
_INTEGER = r'"-"? ("0" | [1-9] [0-9]*)'


def _lit(text: str) -> str:
    """A GBNF string literal of ``text``."""
    return json.dumps(text)


def _digits(lo: str, hi: str) -> str:
    """Digit strings of one length from ``lo`` to ``hi`` (same length, ``lo <= hi``)."""
    if len(lo) == 1:
        return f"[{lo}-{hi}]"
    if lo[0] == hi[0]:
        return f'"{lo[0]}" ' + _digits(lo[1:], hi[1:])
    n = len(lo) - 1
    alts = [f'"{lo[0]}" ' + _digits(lo[1:], "9" * n)]
    if int(lo[0]) + 1 <= int(hi[0]) - 1:
        alts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}] [0-9]{{{n}}}")
    alts.append(f'"{hi[0]}" ' + _digits("0" * n, hi[1:]))
    return "(" + " | ".join(alts) + ")"


def int_range(lo: int, hi: int) -> str:
    """GBNF of the integers ``lo..hi`` (``0 <= lo <= hi``), without leading zeros."""
    if not 0 <= lo <= hi:
        raise ValueError(f"integer range {lo}..{hi}: only 0 <= minimum <= maximum")
    alts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a = str(lo) if n == len(str(lo)) else "1" + "0" * (n - 1)
        b = str(hi) if n == len(str(hi)) else "9" * n
        alts.append(_digits(a, b))
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _repeat(item: str, sep: str, most: int) -> str:
    """``item`` up to ``most`` times (none allowed), ``sep`` between."""
    if most <= 0:
        return '""'
    more = f" ({sep} {item}){{0,{most - 1}}}" if most > 1 else ""
    return f"({item}{more})?"


def _value(schema: Dict[str, Any], name: str, rules: Dict[str, str]) -> str:
    """The rule name of ``schema``'s values (rules added to ``rules``)."""
    unknown = set(schema) - _KNOWN
    if unknown:
        raise ValueError(f"schema_gbnf does not convert {sorted(unknown)}")
    item_sep, key_sep = _lit(JSON_OPTIONS["item_separator"]), _lit(JSON_OPTIONS["key_separator"])
    if "enum" in schema:
        body = " | ".join(_lit(json.dumps(v)) for v in schema["enum"])
    else:
        kind = schema.get("type")
        if kind == "object":
            props = schema.get("properties", {})
            if schema.get("additionalProperties", True) is not False:
                raise ValueError("schema_gbnf converts closed objects only "
                                 "(additionalProperties: false)")
            required = set(schema.get("required", ()))
            parts: List[str] = []
            for i, (k, sub) in enumerate(props.items()):
                if k not in required:
                    raise ValueError(f"schema_gbnf converts required properties only, not {k!r}")
                kv = f"{_lit(json.dumps(k))} {key_sep} {_value(sub, f'{name}-{k}', rules)}"
                parts.append(kv if i == 0 else f"{item_sep} {kv}")
            body = " ".join(['"{"', *parts, '"}"'])
        elif kind == "array":
            item = _value(schema.get("items", {"type": "string"}), f"{name}-item", rules)
            body = f'"[" {_repeat(item, item_sep, int(schema.get("maxItems", 1 << 20)))} "]"'
        elif kind == "string":
            rules.setdefault("char", _CHAR)
            most = schema.get("maxLength")
            body = '"\\"" char' + ("*" if most is None else f"{{0,{int(most)}}}") + ' "\\""'
        elif kind == "number":
            body = _NUMBER
        elif kind == "integer":
            if "minimum" in schema or "maximum" in schema:
                body = int_range(int(schema.get("minimum", 0)), int(schema["maximum"]))
            else:
                body = _INTEGER
        elif kind == "boolean":
            body = '"true" | "false"'
        else:
            raise ValueError(f"schema_gbnf does not convert type {kind!r}")
    rule = re.sub(r"[^a-zA-Z0-9-]", "-", name)
    rules[rule] = body
    return rule


def schema_gbnf(schema: Dict[str, Any]) -> str:
    """GBNF of ``schema``'s JSON as specdec writes it (see the module's docstring)."""
    rules: Dict[str, str] = {}
    root = _value(schema, "root-value", rules)
    rules["root"] = root
    return "\n".join(f"{k} ::= {v}" for k, v in reversed(list(rules.items()))) + "\n"
