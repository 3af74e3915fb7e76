"""What `specdec serve` refuses, through its HTTP face and the real `openai` client:
malformed and out-of-range bodies, oversized ones (announced or chunked), unknown paths and
methods, and the fields of other servers' requests that specdec does not honour. Each gets a
4xx in OpenAI's error shape, and the server stays up and answers the next request.

Apart from test_serve.py (what it answers) because the refusals are one concept with their
own table (``BAD``); both run on the ``ending`` server of ``serve_server.py``.
"""
import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from serve_server import HELLO, REPLY, ending, models   # noqa: E402,F401 (fixtures)


BAD = [
    ("/v1/chat/completions", None, b"{not json", 400),
    ("/v1/chat/completions", None, b"[1, 2]", 400),
    ("/v1/chat/completions", {"model": "tiny"}, None, 400),
    ("/v1/chat/completions", {"messages": "hi"}, None, 400),
    ("/v1/chat/completions", {"messages": []}, None, 400),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, None, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, None, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     None, 400),
    ("/v1/chat/completions", {"model": "gpt-9", "messages": HELLO}, None, 404),
    ("/v1/chat/completions", {"model": 7, "messages": HELLO}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "temperature": -1}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "temperature": "hot"}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "top_p": 2}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "max_tokens": 0}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "max_tokens": 1.5}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "max_completion_tokens": -3}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "n": 0}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "n": 17}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "stop": 5}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "stop": [""]}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "seed": "x"}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "stream": "yes"}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "top_logprobs": 3}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "logprobs": True, "top_logprobs": 21}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "logprobs": "yes"}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "tools": [{"type": "function"}]}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "presence_penalty": 3.0}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "repetition_penalty": 0}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "logit_bias": {"x": 10}}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "logit_bias": {"5": 1000}}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "logit_bias": {"99999": 1}}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "response_format": {"type": "xml"}},
     None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "specdec": 3}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "stop_token_ids": ["x"]}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "stop_token_ids": 5}, None, 400),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [-1]}, None, 400),
    ("/v1/chat/completions", {"messages": HELLO, "chat_template_kwargs": []}, None, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 4000}]}, None, 413),
    # lone surrogates (valid JSON escapes, no UTF-8): quoted back in errors, never a 500
    ("/v1/chat/completions", None, b'{"model": "x\\udfff", "messages": [{"role": "user"}]}',
     404),
    ("/v1/completions", None, b'{"prompt": "x", "stop": ["\\ud800"], "stream": true}', 400),
    ("/v1/completions", {"model": "tiny"}, None, 400),
    ("/v1/completions", {"prompt": ""}, None, 400),
    ("/v1/completions", {"prompt": []}, None, 400),
    ("/v1/completions", {"prompt": ["a", "b"]}, None, 400),
    ("/v1/completions", {"prompt": [[1], [2]]}, None, 400),
    ("/v1/completions", {"prompt": [1, "a"]}, None, 400),
    ("/v1/completions", {"prompt": [1, 99999]}, None, 400),
    ("/v1/completions", {"prompt": [-1]}, None, 400),
    ("/v1/completions", {"prompt": "x", "logprobs": 6}, None, 400),
    ("/v1/completions", {"prompt": "x", "echo": True}, None, 400),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, None, 400),
    ("/v1/completions", {"prompt": "x", "best_of": 3}, None, 400),
    ("/v1/completions", {"prompt": "x" * 600}, None, 413),
    ("/v1/completions", {"prompt": [1] * 512}, None, 413),
    ("/v1/completions", None, b'{"prompt": "' + b"x" * (9 << 20) + b'"}', 413),
    ("/v1/completions", None, b'{"prompt": "' + b"x" * (9 << 20) + b'"}', "413-chunked"),
]


@pytest.mark.parametrize("path, body, raw, status", BAD,
                         ids=[f"{i}-{s}" for i, (_, _, _, s) in enumerate(BAD)])
def test_bad_requests(ending, path, body, raw, status):
    if raw is not None and len(raw) > 1 << 20:
        got, out = _big_body(ending, path, raw, chunked=status == "413-chunked")
        status = 413
    else:
        got, out = ending.post(path, body, raw=raw)
    assert got == status, out
    err = out["error"]
    assert isinstance(err["message"], str) and err["message"] and "type" in err
    assert ending.get("/health")[0] == 200


def _big_body(server, path, raw, *, chunked):
    """A body over the limit: announced by Content-Length (answered before it is sent), or
    sent in chunks with no length (answered once the limit is crossed)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.putrequest("POST", path)
        conn.putheader("Content-Type", "application/json")
        if chunked:
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            try:
                for i in range(0, len(raw), 1 << 16):
                    part = raw[i:i + (1 << 16)]
                    conn.send(b"%x\r\n%s\r\n" % (len(part), part))
                conn.send(b"0\r\n\r\n")
            except OSError:   # the server answered and closed before the end
                pass
        else:
            conn.putheader("Content-Length", str(len(raw)))
            conn.endheaders()
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_bad_paths_and_methods(ending):
    status, out = ending.get("/v1/nothing")
    assert status == 404 and out["error"]["message"]
    status, out = ending.get("/v1/completions")
    assert status == 405 and out["error"]["message"]


def test_errors_through_the_client(ending):
    c = ending.client()
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-9", messages=HELLO)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="tiny", messages=HELLO, n=99)
    with pytest.raises(openai.APIStatusError) as e:
        c.completions.create(model="tiny", prompt="x" * 600)
    assert e.value.status_code == 413 and e.value.code == "context_length_exceeded"
    assert c.chat.completions.create(model="tiny", messages=HELLO,
                                     temperature=0).choices[0].message.content == REPLY


def _asking_value(neutral):
    """A value of a refused field that asks for something (none of its no-op values)."""
    if not neutral:
        return "x"
    n = neutral[0]
    if isinstance(n, bool):
        return not n
    if isinstance(n, (int, float)):
        return max(neutral) + 1
    return {str: "x-other", list: ["x"], dict: {"type": "json_object"}}[type(n)]


def test_refused_fields_through_extra_body(ending):
    """Every field of vLLM's, llama-server's and llama-cpp-python's requests that specdec does
    not honour gets a 400 naming it, on both endpoints; its no-op values and unknown fields
    are accepted."""
    from specdec.refused import REFUSED

    c = ending.client()
    for name, (neutral, _) in REFUSED.items():
        extra = {name: _asking_value(neutral)}
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2,
                                      extra_body=extra)
        assert e.value.param == name and f"'{name}'" in e.value.message, (name, e.value)
        assert e.value.code == "unsupported_parameter"
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body=extra)
        assert e.value.param == name, (name, e.value)
    neutral = {name: row[0][0] for name, row in REFUSED.items() if row[0]}
    r = c.chat.completions.create(model="tiny", messages=HELLO, temperature=0,
                                  extra_body=dict(neutral, some_field_nobody_defines=1))
    assert r.choices[0].message.content == REPLY
    assert ending.get("/health")[0] == 200
