"""Generation options that other servers define and specdec does not honour: refused, never ignored.

A client moving from vLLM, llama.cpp's server (llama-server) or llama-cpp-python sends their
field names; a field specdec silently dropped would let it believe a constraint, a penalty or
a sampler ran when it did not. ``specdec serve`` answers such a field with a 400 naming it,
and :meth:`specdec.Decoder.chat` refuses it as a keyword instead of handing it to the chat
template. Fields no such server defines stay ignored, as OpenAI's own clients expect.

Each row: the field, the values that ask for nothing specdec does not already do (sent by
clients that fill in defaults), and who defines it. The lists were collected from vLLM's
``entrypoints/openai/protocol.py`` (``CompletionRequest``, ``ChatCompletionRequest``),
llama.cpp's ``tools/server/server-schema.cpp`` and llama-cpp-python's ``server/types.py``.
A field specdec learns to honour leaves this table (and is then parsed where it is used).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

VLLM, LLAMA, LCP, OPENAI = "vLLM", "llama-server", "llama-cpp-python", "OpenAI"

#: field -> (values that are no-ops, the servers that define it)
REFUSED: Dict[str, Tuple[Tuple[Any, ...], Tuple[str, ...]]] = {
    # structured output and tools (see issue 31)
    "guided_decoding_backend": ((), (VLLM,)),
    "guided_whitespace_pattern": ((), (VLLM,)),
    "structural_tag": ((), (VLLM,)),
    "functions": (([],), (OPENAI, LCP)),
    "function_call": (("none", "auto"), (OPENAI, LCP)),
    "grammar_lazy": ((False,), (LLAMA,)),
    "grammar_triggers": (([],), (LLAMA,)),
    # choices and penalties
    "best_of": ((1,), (OPENAI, VLLM, LCP)),
    "n_cmpl": ((1,), (LLAMA,)),
    "repeat_penalty": ((1,), (LLAMA, LCP)),
    "use_beam_search": ((False,), (VLLM,)),
    "length_penalty": ((1,), (VLLM,)),
    # other samplers
    "mirostat": ((0,), (LLAMA,)),
    "mirostat_mode": ((0,), (LCP,)),
    "typical_p": ((1,), (LLAMA,)),
    "top_n_sigma": ((-1,), (LLAMA,)),
    "xtc_probability": ((0,), (LLAMA,)),
    "dynatemp_range": ((0,), (LLAMA,)),
    "dry_multiplier": ((0,), (LLAMA,)),
    "min_keep": ((0,), (LLAMA,)),
    "samplers": ((), (LLAMA,)),
    "allowed_token_ids": ((), (VLLM,)),
    "bad_words": (([],), (VLLM,)),
    "logits_processors": ((), (VLLM,)),
    # length, stopping and the text returned
    "echo": ((False,), (OPENAI, VLLM, LLAMA, LCP)),
    "suffix": (("",), (OPENAI, VLLM, LCP)),
    "n_predict": ((), (LLAMA,)),
    "min_tokens": ((0,), (VLLM, LCP)),
    "ignore_eos": ((False,), (VLLM, LLAMA)),
    "include_stop_str_in_output": ((False,), (VLLM,)),
    "skip_special_tokens": ((True,), (VLLM,)),
    "spaces_between_special_tokens": ((True,), (VLLM,)),
    "truncate_prompt_tokens": ((), (VLLM,)),
    "prompt_logprobs": ((), (VLLM,)),
    "continuous_usage_stats": ((False,), (VLLM,)),   # in stream_options
    "n_probs": ((0,), (LLAMA,)),
    "post_sampling_probs": ((False,), (LLAMA,)),
    "return_tokens": ((False,), (LLAMA,)),
    "return_tokens_as_token_ids": ((False,), (VLLM,)),
    "n_indent": ((0,), (LLAMA,)),
    "t_max_predict_ms": ((-1, 0), (LLAMA,)),
    "t_max_prompt_ms": ((-1, 0), (LLAMA,)),
    # chat rendering, reasoning, adapters
    "chat_template": ((), (VLLM,)),
    "add_generation_prompt": ((True,), (VLLM,)),
    "continue_final_message": ((False,), (VLLM, LLAMA)),
    "documents": ((), (VLLM,)),
    "reasoning_effort": ((), (OPENAI, VLLM, LLAMA)),
    "include_reasoning": ((True,), (VLLM,)),
    "lora": (([],), (LLAMA,)),
    "mm_processor_kwargs": ((), (VLLM,)),
    "priority": ((0,), (VLLM,)),
    "cache_salt": ((), (VLLM,)),
}

#: fields above that are chat template variables in Python (``Decoder.chat(...,
#: add_generation_prompt=False)`` renders with them; the server takes them in
#: ``chat_template_kwargs``, and refuses them at the top level of a body)
#: fields the server honours in a request's body that are not keywords of ``Decoder.chat``
#: (which takes the constraint options themselves, ``grammar=``, ``json_schema=``, ...):
#: refused there rather than handed to the template
BODY_ONLY = frozenset({"response_format", "guided_json", "guided_regex", "guided_choice",
                       "guided_grammar", "tool_choice"})

TEMPLATE_VARIABLES = frozenset({"add_generation_prompt", "documents", "reasoning_effort"})


def _same(a: Any, b: Any) -> bool:
    # True == 1 in Python; a boolean where a number is neutral (or the reverse) is not neutral
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def refused_field(options: Mapping[str, Any]) -> Optional[str]:
    """The first field of ``options`` that asks for something specdec does not do (None: none).

    A field sent as null, or with a value that asks for nothing (``n: 1``,
    ``echo: false``), is accepted."""
    for name, value in options.items():
        row = REFUSED.get(name)
        if row is None or value is None:
            continue
        if not any(_same(value, n) for n in row[0]):
            return name
    return None


def refusal(name: str) -> str:
    """Why ``name`` is refused, for the error message."""
    who = ", ".join(REFUSED[name][1])
    return (f"'{name}' ({who}) is not supported by specdec; it is refused rather than "
            f"ignored, so that no client believes it was applied")
