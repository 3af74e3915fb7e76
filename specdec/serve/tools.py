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
from dataclasses import dataclass
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


_OPEN, _CLOSE, _PYTHON_TAG = "<tool_call>", "</tool_call>", "<|python_tag|>"
#: a call's opening, name first, up to its arguments' value (the order the grammar writes)
_HEADER = {key: re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"%s"\s*:\s*' % key)
           for _, key in FORMATS.values()}


@dataclass
class _Call:
    name: Optional[str] = None   # None: not known yet
    arguments: str = ""          # the arguments' JSON text so far
    bad: bool = False            # the call's whole text is not a call


def _value_end(s: str, i: int) -> Tuple[int, bool]:
    """Where the JSON value starting at ``s[i]`` ends (as far as ``s`` goes), and whether it
    is complete: brackets counted outside strings."""
    depth, in_str, esc = 0, False, False
    for j in range(i, len(s)):
        ch = s[j]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
                if depth == 0:
                    return j + 1, True
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]" or (ch == "," and depth == 0):
            if depth == 0:           # a number, true, false or null: ended before this
                return len(s[:j].rstrip()), True
            depth -= 1
            if depth == 0:
                return j + 1, True
    return len(s), False


def _read_call(body: str, key: str, complete: bool) -> _Call:
    """One call's text (its arguments as the model wrote them, once its name is known);
    ``complete``: the text will not grow."""
    m = _HEADER[key].match(body)
    if m is not None:
        end, _ = _value_end(body, m.end())
        call = _Call(json.loads(m.group(1)), body[m.end():end])
        if complete:
            call.bad = not _is_call(body)
        return call
    if not complete:
        return _Call()
    try:
        obj = json.loads(body)
    except ValueError:
        return _Call(bad=True)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return _Call(bad=True)
    return _Call(obj["name"], json.dumps(obj.get(key, {})))    # another order: written anew


def _is_call(body: str) -> bool:
    try:
        obj = json.loads(body)
    except ValueError:
        return False
    return isinstance(obj, dict) and isinstance(obj.get("name"), str)


def _held(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` may begin ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def read(fmt: str, text: str, final: bool) -> Tuple[str, List[_Call]]:
    """A reply (or the part of it decoded so far, ``final`` False) as ``(content, calls)``:
    the text outside calls, and the calls in order. Reading more of a reply only extends
    both (the text that may begin a call's marker waits), which is what lets a stream send
    them as deltas."""
    key = FORMATS[fmt][1]
    if fmt == "llama3":
        body = text.lstrip()
        if body.startswith(_PYTHON_TAG):
            body = body[len(_PYTHON_TAG):]
        elif not final and _PYTHON_TAG.startswith(body):
            return "", []
        if not body.lstrip().startswith("{"):
            return (text if body.strip() or final else ""), []
        call = _read_call(body, key, final)
        return ("", [call]) if not call.bad else (text, [])
    content, calls, pos = [], [], 0
    while True:
        k = text.find(_OPEN, pos)
        if k < 0:
            tail = text[pos:]
            content.append(tail if final else tail[:len(tail) - _held(tail, _OPEN)])
            break
        content.append(text[pos:k])
        end = text.find(_CLOSE, k)
        body = text[k + len(_OPEN):end if end >= 0 else len(text)]
        calls.append(_read_call(body.strip() if end >= 0 or final else body.lstrip(), key,
                                end >= 0 or final))
        if end < 0:
            break
        pos = end + len(_CLOSE)
    if any(c.bad for c in calls):
        return text, []
    return "".join(content), calls


def parse(fmt: str, text: str) -> Tuple[Optional[str], List[Dict[str, Any]]]:
    """``(content, tool_calls)`` of a reply: OpenAI's calls (ids, names, arguments as the
    model wrote them) for the calls it holds; the text unchanged and no calls where it holds
    none, or where one of them is not a call."""
    content, calls = read(fmt, text, final=True)
    if not calls:
        return text, []
    return content.strip() or None, [
        {"id": _call_id(), "type": "function",
         "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class CallStream:
    """A reply in tool-call format ``fmt`` sent as it decodes, as OpenAI streams one: its
    text outside calls as content, each call as a first delta with its index, id, type and
    name, then its arguments in fragments as they decode. Accumulated, the deltas give what
    :func:`parse` reads from the whole reply (the calls exactly; the content but for white
    space around calls). Whitespace is held until more text follows it, so that a reply of
    calls alone sends none."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.text = ""
        self.sent = 0                      # characters of content sent (white space held)
        self.calls: List[Tuple[str, int]] = []   # per call started: its id, arguments sent

    def feed(self, text: str) -> List[Tuple[str, Any]]:
        """The deltas ``text`` adds: ``("content", str)`` or ``("call", OpenAI's delta)``."""
        self.text += text
        return self._deltas(final=False)

    def close(self) -> List[Tuple[str, Any]]:
        """The deltas left at the reply's end."""
        return self._deltas(final=True)

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def _deltas(self, final: bool) -> List[Tuple[str, Any]]:
        content, calls = read(self.fmt, self.text, final)
        if final and not calls:
            if self.calls:
                return []       # a call sent in part ended as no call (cut by max_tokens)
            content = self.text     # no calls after all: the text as it is, as ``parse`` has it
        out: List[Tuple[str, Any]] = []
        ready = content if final and not calls else content.rstrip()
        if not ready.strip():
            ready = ""                      # white space alone waits
        if len(ready) > self.sent:
            out.append(("content", ready[self.sent:]))
            self.sent = len(ready)
        for j, c in enumerate(calls):
            if c.name is None:
                break                       # later calls wait for this one's name
            if j == len(self.calls):
                self.calls.append((_call_id(), 0))
                out.append(("call", {"index": j, "id": self.calls[j][0], "type": "function",
                                     "function": {"name": c.name, "arguments": ""}}))
            cid, n = self.calls[j]
            if len(c.arguments) > n:
                out.append(("call", {"index": j, "function": {"arguments": c.arguments[n:]}}))
                self.calls[j] = (cid, len(c.arguments))
        return out
