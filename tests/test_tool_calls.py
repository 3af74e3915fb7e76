"""Tool-call replies read as they decode (``specdec.serve.tools.CallStream``): the deltas of
any split of a reply add up to what ``parse`` reads from the whole reply."""
import json
import random

import pytest

from specdec.serve.tools import CallStream, parse

REPLIES = {
    "hermes": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"n": [1, {"a": "}]"}], "q": "x\\"y\\\\"}}\n</tool_call>\n',
        'Sure! <tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"x": -1.5e3, "y": null}}\n</tool_call>',
        '<tool_call>{"arguments": {"x": 2}, "name": "rev"}</tool_call>',     # other order
        "no calls at all, though <tool almost\n",
        "\n\nHello <b>world</b>\n",
        '<tool_call>\n{"name": "a", "arguments": 7}\n</tool_call>',
    ],
    "llama3": [
        '{"name": "f", "parameters": {"k": "v", "z": [true, false]}}',
        '<|python_tag|>{"name": "f", "parameters": {}}',
        ' {"parameters": {"a": 1}, "name": "g"}',
        "Hello there",
        '  {"not": "a call"}',
    ],
}


def _streamed(fmt, text, rng):
    st, deltas, i = CallStream(fmt), [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        deltas += st.feed(text[i:i + n])
        i += n
    return deltas + st.close()


@pytest.mark.parametrize("fmt, text", [(f, t) for f, ts in REPLIES.items() for t in ts])
def test_deltas_add_up_to_the_whole_reply(fmt, text):
    content, calls = parse(fmt, text)
    rng = random.Random(0)
    for _ in range(40):
        deltas = _streamed(fmt, text, rng)
        got_content = "".join(v for k, v in deltas if k == "content") or None
        got = {}
        for kind, d in (x for x in deltas if x[0] == "call"):
            if "id" in d:        # a call's first delta: its index, id, type and name
                assert d["index"] == len(got) and d["type"] == "function"
                assert d["id"].startswith("call_") and d["function"]["arguments"] == ""
                got[d["index"]] = [d["function"]["name"], ""]
            else:
                assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
                got[d["index"]][1] += d["function"]["arguments"]
        assert [tuple(v) for v in got.values()] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in calls]
        assert got_content == content
    for c in calls:
        json.loads(c["function"]["arguments"])


def test_arguments_are_the_models_text():
    _, calls = parse("hermes", '<tool_call>\n{"name": "a", "arguments": {"city": "Zürich"}}'
                               '\n</tool_call>')
    assert calls[0]["function"]["arguments"] == '{"city": "Zürich"}'


def test_a_call_cut_short_is_no_call_whole_and_stops_streaming():
    text = '<tool_call>\n{"name": "a", "arguments": {"x": 1'
    assert parse("hermes", text) == (text, [])
    st = CallStream("hermes")
    deltas = st.feed(text) + st.close()
    assert deltas[0][1]["function"]["name"] == "a"
    assert "".join(d[1]["function"].get("arguments", "") for d in deltas) == '{"x": 1'
    assert not any(k == "content" for k, _ in deltas) and st.called


@pytest.mark.parametrize("text", REPLIES["hermes"][:2] + REPLIES["hermes"][3:5])
def test_streamed_logprobs_of_a_chat_with_tools_are_all_sent(text):
    # a streamed chat with tools sent no logprobs at all (the non-streamed answer had them)
    from specdec.serve.protocol import Chunks, Envelope
    rng = random.Random(1)
    chunks = Chunks(Envelope("chat", "m"), False, n=2, tool_format="hermes")
    sent = {0: [], 1: []}
    fed = {0: [], 1: []}
    out = []
    for index in (0, 1):
        i = 0
        while i < len(text):
            n = rng.randint(1, 6)
            items = [(c.encode(), -0.5 * (i + j), [(c.encode(), -0.5 * (i + j))])
                     for j, c in enumerate(text[i:i + n])]
            fed[index] += [lp for _, lp, _ in items]
            out += chunks.piece(index, text[i:i + n], items)
            i += n
        out += chunks.end(index, _Result())
    for c in out:
        for choice in c["choices"]:
            for t in (choice["logprobs"] or {}).get("content", []):
                sent[choice["index"]].append(t["logprob"])
    assert sent == fed


class _Result:
    finish_reason = "eos"
