"""A chat message's ``tool_calls`` is checked before the template renders it, and a wrong
shape is a 400 in OpenAI's error shape that names the field.

Found by the adversarial sweep: ``{"role": "assistant", "tool_calls": "bad"}`` reached the
template (Qwen 2.5's iterates over it), and the 400 said a Jinja render error.
"""
import re
from pathlib import Path

import pytest

import specdec
from specdec.serve.protocol import APIError, chat_spec, prompt_tokens
from specdec.testing.chat import write_tiny_chat

QWEN = Path(__file__).parent / "data" / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_tiny_chat(tmp_path_factory.mktemp("chat") / "qwen.gguf", "chatml",
                           chat_template=QWEN.read_text(), reply="Hi!", end_token="<|im_end|>")
    return specdec.Model(str(path))


def _tokens(model, calls):
    msgs = [{"role": "user", "content": "time?"},
            {"role": "assistant", "content": None, "tool_calls": calls}]
    return prompt_tokens(model, chat_spec({"messages": msgs}, ["tiny"]), None)


def test_well_formed_tool_calls_render(model):
    tokens, _, _ = _tokens(model, [CALL])
    assert "get_time" in model.detokenize(tokens)


@pytest.mark.parametrize("calls, field", [
    ("bad", r"messages\[1\]\.tool_calls must be a list of tool calls"),
    ({"function": {}}, r"messages\[1\]\.tool_calls must be a list"),
    (["bad"], r"messages\[1\]\.tool_calls\[0\] must be an object"),
    ([{"type": "function"}], r"messages\[1\]\.tool_calls\[0\]\.function must be an object"),
    ([{"function": {"arguments": "{}"}}], r"tool_calls\[0\]\.function\.name must be"),
    ([{"function": {"name": "f", "arguments": 3}}], r"tool_calls\[0\]\.function\.arguments"),
    ([CALL, {"type": "code", "function": CALL["function"]}], r"tool_calls\[1\]\.type must be"),
])
def test_malformed_tool_calls_name_the_field(model, calls, field):
    with pytest.raises(APIError) as e:
        _tokens(model, calls)
    err = e.value.body()["error"]
    assert e.value.status == 400 and err["type"] == "invalid_request_error"
    assert err["param"] == "messages"
    assert re.search(field, err["message"]) and "template" not in err["message"]
    assert _tokens(model, [CALL])[0]      # the model still renders a good chat
