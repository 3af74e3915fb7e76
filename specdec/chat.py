"""Chat: OpenAI-style messages turned into a prompt by the model's chat template.

The template is the GGUF's ``tokenizer.chat_template`` (or one given), a Jinja source rendered
in Jinja2's immutable sandbox with the globals HF transformers and llama-cpp-python give it
(``bos_token``, ``eos_token``, ``add_generation_prompt``, ``raise_exception``,
``strftime_now``), or the name of a llama.cpp built-in template, rendered by llama.cpp's C++
(``llama_chat_apply_template``). Jinja2 is imported on first use, so ``import specdec`` stays
light.
"""
from __future__ import annotations

import datetime
import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ._core import Model, chat_apply_template, chat_builtin_templates
from ._template_limits import (DEFAULT_LIMITS, ChatTemplateError, TemplateLimits, check_source,
                               run_limited, sandbox_class)

Message = Mapping[str, Any]

#: text of an assistant turn used to find what closes a turn (see ``ChatTemplate.end_of_turn``)
_PROBE = "specdec-probe-3b7e"


def _text_of(content: Any, i: int) -> Optional[str]:
    """A message's content as text: a string, None, or OpenAI content parts of type text."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        out = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise ValueError(f"messages[{i}].content: only text parts "
                                 f"({{'type': 'text', 'text': ...}}) are supported, got {part!r:.80}")
            out.append(part["text"])
        return "".join(out)
    raise ValueError(f"messages[{i}].content must be a string or a list of text parts, "
                     f"got {type(content).__name__}")


_TOOL_CALL = "{'type': 'function', 'function': {'name': ..., 'arguments': ...}}"


def _check_tool_calls(calls: Any, i: int) -> None:
    """An assistant message's ``tool_calls`` in OpenAI's shape: templates index into it, and
    a wrong shape would fail inside the template with an error that names no field."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, (list, tuple)):
        raise ValueError(f"{where} must be a list of tool calls ({_TOOL_CALL}), "
                         f"got {type(calls).__name__}")
    for j, call in enumerate(calls):
        if not isinstance(call, Mapping):
            raise ValueError(f"{where}[{j}] must be an object {_TOOL_CALL}, "
                             f"got {type(call).__name__}")
        if call.get("type", "function") != "function":
            raise ValueError(f"{where}[{j}].type must be 'function', got {call.get('type')!r:.40}")
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            raise ValueError(f"{where}[{j}].function must be an object with 'name' and "
                             f"'arguments', got {type(fn).__name__}")
        if not isinstance(fn.get("name"), str) or not fn.get("name"):
            raise ValueError(f"{where}[{j}].function.name must be a non-empty string, "
                             f"got {fn.get('name')!r:.40}")
        if not isinstance(fn.get("arguments"), (str, Mapping)):
            raise ValueError(f"{where}[{j}].function.arguments must be a JSON string (or an "
                             f"object), got {type(fn.get('arguments')).__name__}")


def normalize_messages(messages: Sequence[Message]) -> List[Dict[str, Any]]:
    """Checked copies of OpenAI-style messages, each content flattened to text."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} objects")
    if not messages:
        raise ValueError("messages must not be empty")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content', "
                             f"got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{i}].role must be a non-empty string, got {role!r:.40}")
        if "content" not in m and not m.get("tool_calls"):
            raise ValueError(f"messages[{i}] has no 'content'")
        if m.get("tool_calls") is not None:
            _check_tool_calls(m["tool_calls"], i)
        d = dict(m)
        d["content"] = _text_of(m.get("content"), i)
        out.append(d)
    return out


#: names the renderer sets itself (and chat_prompt's own arguments): not template variables
RESERVED_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token",
                                "model", "chat_template", "template_limits"})


def check_variables(variables: Mapping[str, Any]) -> None:
    """Refuse template variables that would replace what the renderer passes itself."""
    for k in variables:
        if not isinstance(k, str) or not k.isidentifier():
            raise ChatTemplateError(f"template variable name {k!r:.40} is not an identifier")
        if k in RESERVED_VARIABLES:
            raise ChatTemplateError(f"template variable {k!r} cannot be set: the chat renderer "
                                    "sets it itself")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators: Optional[Tuple[str, str]] = None, sort_keys: bool = False) -> str:
    # HF's tojson: no HTML escaping (Jinja's default would turn '<' into \u003c)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@functools.lru_cache(maxsize=1)
def _generation_tag() -> type:
    """``{% generation %}...{% endgeneration %}``, which HF templates wrap around the
    assistant's text for training masks: its body renders as is (as in transformers and
    llama.cpp)."""
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return GenerationTag


@functools.lru_cache(maxsize=32)
def _compile(source: str, limits: TemplateLimits) -> Any:
    from jinja2.ext import loopcontrols

    check_source(source)
    env = sandbox_class()(limits.max_chars, trim_blocks=True, lstrip_blocks=True,
                          extensions=[loopcontrols, _generation_tag()])
    env.filters["tojson"] = env._bounded_filter("tojson", _tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return run_limited(lambda: env.from_string(source), limits.seconds, "compilation")


@functools.lru_cache(maxsize=1)
def builtin_names() -> Tuple[str, ...]:
    """llama.cpp's built-in template names (``chat_template="chatml"``, ...)."""
    return tuple(chat_builtin_templates())


class ChatTemplate:
    """A Jinja chat template, or a llama.cpp built-in one by name.

    ``bos_token`` / ``eos_token`` are the texts of the model's BOS and EOS tokens, which
    Jinja templates write themselves. ``limits`` bound the compilation and each render
    (time, and the size of every value the template builds; see ``_template_limits``): any
    failure, those included, is a :class:`ChatTemplateError`.
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 limits: TemplateLimits = DEFAULT_LIMITS) -> None:
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("a chat template must be a non-empty string: Jinja source or "
                                    "a llama.cpp built-in name")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.limits = limits
        self.builtin: Optional[str] = source if source in builtin_names() else None
        if self.builtin is None and "{{" not in source and "{%" not in source:
            raise ChatTemplateError(f"{source[:80]!r} is neither Jinja nor a llama.cpp built-in "
                                    f"template name ({', '.join(builtin_names())})")
        self._template = None if self.builtin else _compile(source, limits)

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
               **variables: Any) -> str:
        """The prompt text of ``messages``; ``variables`` reach Jinja templates (``tools``,
        ``date_string``, ...)."""
        msgs = normalize_messages(messages)
        if self.builtin is not None:
            return chat_apply_template(self.builtin, [(m["role"], m["content"] or "")
                                                      for m in msgs], add_generation_prompt)
        assert self._template is not None
        check_variables(variables)
        ctx = dict(variables, messages=msgs, add_generation_prompt=add_generation_prompt,
                   bos_token=self.bos_token, eos_token=self.eos_token)
        return run_limited(lambda: self._template.render(**ctx), self.limits.seconds, "render")

    @functools.cached_property
    def end_of_turn(self) -> Optional[str]:
        """The text that closes an assistant turn (``<end_of_turn>``, ``<|eot_id|>``,
        ``<|im_end|>``, ...), found by rendering a short conversation; None if the
        template writes nothing there."""
        try:
            text = self.render([{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": _PROBE}],
                               add_generation_prompt=False)
        except ChatTemplateError:
            return None
        at = text.rfind(_PROBE)
        if at < 0:
            return None
        tail = text[at + len(_PROBE):].lstrip()
        marker = tail.split("\n", 1)[0].rstrip()
        return marker or None


def model_tokens(model: Model) -> Tuple[str, str]:
    """The texts of the model's BOS and EOS tokens ("" where it has none)."""
    return tuple(model.token_text(t) if t >= 0 else "" for t in (model.bos, model.eos))  # type: ignore[return-value]


@functools.lru_cache(maxsize=32)
def _template(source: str, bos: str, eos: str, limits: TemplateLimits) -> ChatTemplate:
    return ChatTemplate(source, bos_token=bos, eos_token=eos, limits=limits)


def template_for(model: Model, chat_template: Optional[str] = None,
                 limits: TemplateLimits = DEFAULT_LIMITS) -> ChatTemplate:
    """``chat_template`` (Jinja or a built-in name), else the model's own template."""
    source = chat_template if chat_template is not None else model.chat_template
    if source is None:
        raise ChatTemplateError(
            "this model has no chat template (no tokenizer.chat_template in the GGUF): pass "
            "chat_template= a Jinja string or a llama.cpp built-in name "
            f"({', '.join(builtin_names())})")
    bos, eos = model_tokens(model)
    return _template(source, bos, eos, limits)


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered conversation: its prompt tokens, and what ends the reply where the turn's
    end is not one of the vocab's end-of-generation tokens: a stop string for a turn end
    in text, a stop token for a control token (whose text is empty)."""

    text: str
    tokens: List[int]
    stop: List[str]
    stop_token_ids: List[int]


def chat_prompt(model: Model, messages: Sequence[Message], *,
                chat_template: Optional[str] = None, add_generation_prompt: bool = True,
                template_limits: TemplateLimits = DEFAULT_LIMITS,
                **variables: Any) -> ChatPrompt:
    """Render and tokenize ``messages`` for ``model``.

    Special-token text in the rendered prompt is parsed as special tokens; BOS is added
    only where the model wants one and the template did not write it.
    """
    tmpl = template_for(model, chat_template, template_limits)
    text = tmpl.render(messages, add_generation_prompt=add_generation_prompt, **variables)
    add_bos = not (tmpl.bos_token and text.startswith(tmpl.bos_token))
    tokens = model.tokenize(text, add_special=add_bos, parse_special=True)
    stop, stop_ids = [], []
    eot = tmpl.end_of_turn
    if eot and eot != tmpl.eos_token:
        ids = model.tokenize(eot, add_special=False, parse_special=True)
        if ids and not model.is_eog(ids[0]):    # an end-of-generation token ends it already
            if model.token_to_piece(ids[0]):
                stop.append(eot)
            else:
                stop_ids.append(ids[0])
    return ChatPrompt(text=text, tokens=tokens, stop=stop, stop_token_ids=stop_ids)
