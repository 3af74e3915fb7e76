"""Tool calls: the grammar that holds a reply to the chat template's tool-call format, and
the reply read back as OpenAI ``tool_calls``.

A template that renders ``tools`` tells the model how to call them; the two formats most
templates use are known here, found in the template's source:

* ``hermes`` (Hermes, Qwen 2.5/3, ...): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n
  </tool_call>``, one block per call;
* ``llama3`` (Llama 3.1-3.3's JSON tool calling): ``{"name": ..., "parameters": {...}}``.

With ``tool_choice`` "required" (or a named function) the reply is constrained to one or
more calls of the offered tools, their arguments to each tool's JSON schema (llguidance's
Lark with ``%json``); with "auto" the reply is free and read back as calls when it holds
them; with "none" no tools are rendered.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..constraint import JSON_OPTIONS, _closed

#: format -> (the template text that marks it, the key of the arguments in a call)
FORMATS: Dict[str, Tuple[str, str]] = {
    "hermes": ("<tool_call>", "arguments"),
    "llama3": ("<|python_tag|>", "parameters"),
}


class ToolError(ValueError):
    """A request's tools or tool_choice that cannot be honoured."""


def template_format(source: Optional[str]) -> Optional[str]:
    """The tool-call format a chat template's source asks for (None: none known)."""
    if not source:
        return None
    for name, (marker, _) in FORMATS.items():
        if marker in source:
            return name
    if "tools" in source and '"parameters"' in source:
        return "llama3"
    return None


def check_tools(tools: Any) -> List[Dict[str, Any]]:
    """OpenAI's ``tools``: a list of ``{"type": "function", "function": {name, parameters}}``."""
    if not isinstance(tools, list) or not tools:
        raise ToolError("'tools' must be a non-empty list")
    out = []
    for t in tools:
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" \
                or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not fn["name"]:
            raise ToolError("each tool must be {'type': 'function', 'function': {'name': ..., "
                            "'parameters': {...}}}")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, Mapping):
            raise ToolError(f"tool {fn['name']!r}: 'parameters' must be a JSON schema object")
        out.append({"type": "function", "function": dict(fn, parameters=dict(params))})
    return out


def chosen(tools: List[Dict[str, Any]], tool_choice: Any) -> Optional[List[Dict[str, Any]]]:
    """The tools a reply must call (None: the reply is free, "auto" or "none")."""
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    if tool_choice == "required":
        return tools
    if isinstance(tool_choice, Mapping) and isinstance(tool_choice.get("function"), Mapping):
        name = tool_choice["function"].get("name")
        picked = [t for t in tools if t["function"]["name"] == name]
        if not picked:
            raise ToolError(f"tool_choice names {name!r}, which is not in 'tools'")
        return picked
    raise ToolError("'tool_choice' must be 'none', 'auto', 'required' or "
                    "{'type': 'function', 'function': {'name': ...}}")


def call_schema(fmt: str, tools: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The JSON schema of one call of one of ``tools`` in format ``fmt``."""
    key = FORMATS[fmt][1]
    alts = [{"type": "object",
             "properties": {"name": {"const": t["function"]["name"]},
                            key: t["function"]["parameters"]},
             "required": ["name", key], "additionalProperties": False} for t in tools]
    schema = alts[0] if len(alts) == 1 else {"anyOf": alts}
    # JSON written as under json_schema= (no free whitespace: a model could pad without end)
    return dict(_closed(schema), **{"x-guidance": dict(JSON_OPTIONS)})


def grammar(fmt: str, tools: Sequence[Dict[str, Any]], parallel: bool = True) -> str:
    """llguidance Lark: one call (or several, ``parallel``) of ``tools`` in format ``fmt``."""
    schema = json.dumps(call_schema(fmt, tools))
    rep = "+" if parallel else ""
    if fmt == "hermes":
        return (f'start: call{rep}\ncall: "<tool_call>\\n" obj "\\n</tool_call>" "\\n"?\n'
                f"obj: %json {schema}\n")
    return f'start: obj\nobj: %json {schema}\n'


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def parse(fmt: str, text: str) -> Tuple[Optional[str], List[Dict[str, Any]]]:
    """``(content, tool_calls)`` of a reply: OpenAI's calls (ids, names, arguments as JSON
    text) for the calls it holds; the text unchanged and no calls where it holds none."""
    key = FORMATS[fmt][1]
    if fmt == "hermes":
        bodies = _HERMES.findall(text)
        content = _HERMES.sub("", text).strip() or None
    else:
        bodies = [text.strip().removeprefix("<|python_tag|>")]
        content = None
    calls = []
    for b in bodies:
        try:
            obj = json.loads(b)
        except ValueError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": json.dumps(obj.get(key, {}))}})
    if not calls:
        return text, []
    return content, calls
