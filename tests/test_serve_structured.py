"""Structured output through `specdec serve` and the real `openai` client: response_format
(a pydantic model through ``parse``, ``json_object``), llama-server's and vLLM's fields, and
tool calls with ``tool_choice="required"``, streaming and not; bad schemas get a 400."""
import json
import sys
from typing import Literal

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("starlette")
pytest.importorskip("llguidance")

from serve_server import QWEN, Server   # noqa: E402

from specdec.testing.chat import write_tiny_chat   # noqa: E402

HELLO = [{"role": "user", "content": "Hello"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {}}}}


class Answer(pydantic.BaseModel):
    ok: bool
    count: int
    label: Literal["cat", "dog"]
    name: str = pydantic.Field(max_length=8)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny_chat(tmp_path_factory.mktemp("serve") / "qwen.gguf", "chatml",
                           chat_template=QWEN.read_text(), reply="Hi_thEre!",
                           end_token="<|im_end|>")
    s = Server(path, "--n-ctx", "1024", "--slots", "2", "--drafter", "ngram", "--n-max", "4")
    yield s
    s.stop()


def test_parse_with_a_pydantic_model(server):
    c = server.client()
    done = c.beta.chat.completions.parse(model="tiny", messages=HELLO, response_format=Answer,
                                        max_tokens=200, temperature=0)
    got = done.choices[0].message.parsed
    assert isinstance(got, Answer) and got.label in ("cat", "dog")


@pytest.mark.parametrize("stream", [False, True])
def test_json_object(server, stream):
    c = server.client()
    kw = dict(model="tiny", messages=HELLO, max_tokens=60, temperature=0,
              response_format={"type": "json_object"})
    if stream:
        text = "".join(ch.choices[0].delta.content or ""
                       for ch in c.chat.completions.create(stream=True, **kw) if ch.choices)
    else:
        text = c.chat.completions.create(**kw).choices[0].message.content
    # the tiny model's best object: as long as the budget, or closed
    assert text.startswith("{")
    if text.endswith("}"):
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("body", [
    {"guided_choice": ["alpha", "beta"]}, {"guided_regex": "[0-9]{3}"},
    {"json_schema": {"enum": ["x", "y"]}}, {"grammar": 'root ::= "yes" | "no"'},
    {"guided_json": {"type": "boolean"}}, {"guided_grammar": 'root ::= "a" "b"+'},
])
def test_llama_server_and_vllm_fields(server, body):
    status, out = server.post("/v1/completions", {"prompt": "x", "max_tokens": 12,
                                                  "temperature": 0, **body})
    assert status == 200, out
    text = out["choices"][0]["text"]
    key, value = next(iter(body.items()))
    if key == "guided_choice":
        assert text in value
    elif key == "guided_regex":
        assert len(text) == 3 and text.isdigit()
    elif key == "json_schema":
        assert json.loads(text) in ("x", "y")
    elif key == "grammar":
        assert text in ("yes", "no")
    elif key == "guided_json":
        assert isinstance(json.loads(text), bool)
    else:
        assert text.startswith("ab") and set(text[1:]) == {"b"}


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_required(server, stream):
    c = server.client()
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}],
              tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False,
              max_tokens=200, temperature=0)
    if stream:
        calls, finish = {}, None
        for ch in c.chat.completions.create(stream=True, **kw):
            if not ch.choices:
                continue
            for tc in ch.choices[0].delta.tool_calls or []:     # the arguments in fragments
                if tc.index in calls:
                    calls[tc.index].function.arguments += tc.function.arguments
                else:
                    calls[tc.index] = tc
            finish = ch.choices[0].finish_reason or finish
        assert finish == "tool_calls"
        fns = [tc.function for tc in calls.values()]
    else:
        msg = c.chat.completions.create(**kw).choices[0]
        assert msg.finish_reason == "tool_calls"
        fns = [tc.function for tc in msg.message.tool_calls]
    assert len(fns) == 1 and fns[0].name in ("get_weather", "get_time")
    args = json.loads(fns[0].arguments)
    if fns[0].name == "get_weather":
        assert isinstance(args["city"], str) and len(args["city"]) <= 12


@pytest.mark.parametrize("helper", [False, True])
def test_streamed_tool_call_is_openai_deltas(server, helper):
    """A call streams as OpenAI's: a first delta with the call's index, id, type and name,
    then its arguments in fragments as they decode. Added up (by hand, or by the openai
    client's own stream helper), they are the call the reply not streamed holds."""
    c = server.client()
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}],
              tools=[WEATHER, CLOCK], parallel_tool_calls=False, max_tokens=200, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = c.chat.completions.create(**kw).choices[0].message
    want = [(t.function.name, t.function.arguments) for t in whole.tool_calls]
    assert want[0][0] == "get_weather" and isinstance(json.loads(want[0][1])["city"], str)
    if helper:
        with c.chat.completions.stream(**kw) as st:
            final = st.get_final_completion().choices[0]
        assert final.finish_reason == "tool_calls"
        assert [(t.function.name, t.function.arguments)
                for t in final.message.tool_calls] == want
        return
    chunks = [ch for ch in c.chat.completions.create(stream=True, **kw) if ch.choices]
    deltas = [tc for ch in chunks for tc in ch.choices[0].delta.tool_calls or []]
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert len(rest) >= 2      # the arguments in several fragments, as the rounds decode them
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    assert [("get_weather", "".join(d.function.arguments for d in rest))] == want
    assert not any(ch.choices[0].delta.content for ch in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_named_tool_choice(server):
    c = server.client()
    msg = c.chat.completions.create(
        model="tiny", messages=HELLO, tools=[WEATHER, CLOCK], parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=200,
        temperature=0).choices[0].message
    assert [tc.function.name for tc in msg.tool_calls] == ["get_time"]


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"json_schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}},
     "json_schema"),
    ({"guided_regex": "(ab"}, "guided_regex"),
    ({"grammar": "root ::= ("}, "grammar"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_regex"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_bad_constraints_get_a_400(server, body, param):
    status, out = server.post("/v1/chat/completions", {"messages": HELLO, **body})
    assert status == 400, out
    assert set(out["error"]) == {"message", "type", "param", "code"}
    assert out["error"]["type"] == "invalid_request_error"
    assert out["error"]["param"] == param
    # and the server goes on
    assert server.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 4})[0] == 200
