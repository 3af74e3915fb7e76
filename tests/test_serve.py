"""`specdec serve` through the real `openai` client: sync, async, streaming, errors, load.

Servers run as `python -m specdec serve` children on tiny chat models (specdec.testing.chat):
``ending`` replies "Hi_thEre!" then <|im_end|>; ``looping`` never ends its reply (its chain
goes through <|im_start|>, a control token with no text), so its streams run to max_tokens
and an n-gram drafter gets accepted. ``SPECDEC_SERVE_SOAK_S`` lengthens the load test.
"""
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import specdec   # noqa: E402
from specdec.benchmark.serve import ServerProcess, free_port   # noqa: E402
from specdec.testing.chat import write_tiny_chat   # noqa: E402

QWEN = (Path(__file__).parent / "data" / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja")
REPLY = "Hi_thEre!"
KEY = "sk-test-123"
SOAK_S = float(os.environ.get("SPECDEC_SERVE_SOAK_S", "8"))


class Server(ServerProcess):
    """`python -m specdec serve` on a free port, with helpers to talk to it."""

    def __init__(self, model, *args):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = Path(tempfile.mkdtemp()) / "server.log"
        super().__init__([sys.executable, "-m", "specdec", "serve", "-m", str(model), "--port",
                          str(port), "--served-model-name", "tiny", *args], port, log,
                         timeout=120)

    def request(self, method, path, body=None, *, raw=None, headers=None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def get(self, path, **kw):
        status, text = self.request("GET", path, **kw)
        return status, (json.loads(text) if text.startswith("{") else text)

    def post(self, path, body=None, **kw):
        status, text = self.request("POST", path, body, **kw)
        return status, json.loads(text)

    def client(self, **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"),
                             max_retries=0, **kw)

    def rss_kb(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    tmpl = QWEN.read_text()
    return {"ending": write_tiny_chat(d / "ending.gguf", "chatml", chat_template=tmpl,
                                      reply=REPLY, end_token="<|im_end|>"),
            "looping": write_tiny_chat(d / "looping.gguf", "chatml", chat_template=tmpl,
                                       reply=REPLY, end_token="<|im_start|>")}


@pytest.fixture(scope="module")
def ending(models):
    s = Server(models["ending"], "--n-ctx", "512", "--slots", "2")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def looping(models):
    s = Server(models["looping"], "--n-ctx", "4096", "--slots", "4", "--drafter", "ngram",
               "--n-max", "4", "--api-key", KEY)
    yield s
    s.stop()


HELLO = [{"role": "user", "content": "Hello"}]
IDLE = {"status": "ok", "slots": 4, "running": 0, "queued": 0}   # the looping server at rest


def test_models_and_health(ending):
    assert [m.id for m in ending.client().models.list()] == ["tiny"]
    assert ending.client().models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        ending.client().models.retrieve("other")
    assert ending.get("/health") == (200, {"status": "ok", "slots": 2, "running": 0, "queued": 0})


def test_banner_and_access_log(ending, looping):
    """The first minute: a line saying where the server listens and what answers there, then
    one access-log line per request, without -v."""
    assert ending.get("/v1/models")[0] == 200
    assert ending.post("/v1/completions", {"prompt": "x", "echo": True})[0] == 400
    log = ending.log_path.read_text()
    assert (f"listening on {ending.url} (OpenAI API at {ending.url}/v1) | model tiny (" in log
            and "drafters: none (plain decoding) | 2 slots of 512 tokens" in log), log
    assert '"GET /v1/models" 200' in log and '"POST /v1/completions" 400' in log, log
    looping.get("/health")
    assert "drafters: ngram | 4 slots of 4096 tokens" in looping.log_path.read_text()


def test_default_port_is_the_readmes():
    """One default port: the code's, which the README's examples use."""
    from specdec.serve.cli import DEFAULT_PORT

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    serving = readme.split("### Serving")[1].split("\n### ")[0]
    ports = set(re.findall(r"(?:127\.0\.0\.1|localhost):(\d+)", serving))
    assert ports == {str(DEFAULT_PORT)}, ports
    assert "--port" not in serving.split("```")[1]     # the example runs on the default


def test_chat_sync(ending):
    r = ending.client().chat.completions.create(model="tiny", messages=HELLO, temperature=0)
    assert r.usage.model_extra["speculation"]["acceptance_rate"] is None   # nothing drafted
    c = r.choices[0]
    assert (c.message.role, c.message.content, c.finish_reason) == ("assistant", REPLY, "stop")
    assert r.usage.completion_tokens == len(REPLY)
    assert r.usage.total_tokens == r.usage.prompt_tokens + len(REPLY) and r.usage.prompt_tokens > 20
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")


def test_completions_sync_and_stop(ending):
    c = ending.client()
    r = c.completions.create(model="tiny", prompt="abc", max_tokens=4, temperature=0)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (REPLY[:4], "length")
    r = c.completions.create(model="tiny", prompt="abc", max_tokens=20, temperature=0,
                             stop=["th"])
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("Hi_", "stop")
    r = c.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=20, temperature=0)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (REPLY, "stop")


def test_streaming(ending):
    c = ending.client()
    chunks = list(c.chat.completions.create(model="tiny", messages=HELLO, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == REPLY and len(chunks) > 3
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(REPLY)
    pieces = list(c.completions.create(model="tiny", prompt="abc", max_tokens=6,
                                       temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == REPLY[:6]
    assert pieces[-1].choices[0].finish_reason == "length"


def test_async_client_concurrent(ending):
    async def main():
        c = openai.AsyncOpenAI(base_url=ending.url + "/v1", api_key="none", max_retries=0)
        async def one(i):
            if i % 2:
                r = await c.chat.completions.create(model="tiny", messages=HELLO, temperature=0)
                return r.choices[0].message.content
            s = await c.chat.completions.create(model="tiny", messages=HELLO, temperature=0,
                                                stream=True)
            return "".join([ch.choices[0].delta.content or "" async for ch in s])
        out = await asyncio.gather(*(one(i) for i in range(6)))
        await c.close()
        return out
    assert asyncio.run(main()) == [REPLY] * 6


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


def test_penalties_and_logit_bias(ending, models):
    """OpenAI's logit_bias and penalties, and vLLM's repetition_penalty, are honoured."""
    z = specdec.Model(str(models["ending"]), vocab_only=True).tokenize("Z", add_special=False)
    c = ending.client()
    r = c.completions.create(model="tiny", prompt="x", max_tokens=4, temperature=0,
                             logit_bias={str(z[0]): 100})
    assert r.choices[0].text == "ZZZZ"
    # a huge bias and a presence penalty: Z once, then the penalty hands it back to the reply
    r = c.completions.create(model="tiny", prompt="x", max_tokens=3, temperature=0,
                             logit_bias={str(z[0]): 30}, presence_penalty=2.0,
                             extra_body={"repetition_penalty": 100})
    assert r.choices[0].text.startswith("Z") and r.choices[0].text != "ZZZ"


def test_n_choices(looping):
    """``n`` choices run together; choice i is what the same request seeded ``seed + i``
    gives alone; streamed, each choice's chunks carry its index and its own finish."""
    c = looping.client(api_key=KEY)
    kw = dict(model="tiny", prompt="Hi_thEre!", max_tokens=12, temperature=1.0, seed=5)
    r = c.completions.create(n=3, **kw)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    alone = [c.completions.create(**dict(kw, seed=5 + i)).choices[0].text for i in range(3)]
    assert [ch.text for ch in r.choices] == alone
    assert r.usage.completion_tokens == 36
    parts, finish = ["", ""], [None, None]
    for ch in c.completions.create(n=2, stream=True, **kw):
        for choice in ch.choices:
            parts[choice.index] += choice.text
            finish[choice.index] = choice.finish_reason or finish[choice.index]
    assert parts == alone[:2] and finish == ["length", "length"]


def test_api_key(looping):
    assert looping.get("/health")[0] == 200      # open, for load balancers
    with pytest.raises(openai.AuthenticationError):
        looping.client().models.list()
    with pytest.raises(openai.AuthenticationError):
        looping.client(api_key="wrong").models.list()
    assert looping.post("/v1/completions", {"prompt": "x"})[0] == 401
    assert [m.id for m in looping.client(api_key=KEY).models.list()] == ["tiny"]


def test_stop_token_ids(looping, models):
    """vLLM's ``stop_token_ids``: the looping model's reply ends at <|im_start|>, a control
    token with no text that no stop string can see."""
    start = specdec.Model(str(models["looping"])).tokenize("<|im_start|>", add_special=False,
                                                           parse_special=True)
    c = looping.client(api_key=KEY)
    r = c.chat.completions.create(model="tiny", messages=HELLO, temperature=0, max_tokens=40,
                                  extra_body={"stop_token_ids": start})
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (REPLY, "stop")
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="tiny", prompt="x", extra_body={"stop_token_ids": [10**6]})


def _metrics(server):
    from prometheus_client.parser import text_string_to_metric_families

    status, text = server.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_speculation_in_usage_and_metrics(looping):
    c = looping.client(api_key=KEY)
    before = _metrics(looping)
    r = c.completions.create(model="tiny", prompt="Hi_thEre!Hi_thEre!Hi_thEre!", max_tokens=64,
                             temperature=0)
    text = r.choices[0].text     # each cycle is 9 characters and a control token with no text
    assert text == (REPLY * 8)[:len(text)] and len(text) > 50
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 64
    spec = r.usage.model_extra["speculation"]
    assert spec["drafted"] > 0 and spec["accepted"] > 0 and spec["accepted_per_position"][0] > 0
    after = _metrics(looping)
    assert after[("specdec_generated_tokens_total", ())] - \
        before.get(("specdec_generated_tokens_total", ()), 0) == 64
    assert after[("specdec_accepted_tokens_total", ())] - \
        before.get(("specdec_accepted_tokens_total", ()), 0) == spec["accepted"]
    rate = after[("specdec_acceptance_rate_by_position", (("position", "1"),))]
    assert 0 < rate <= 1
    assert after[("specdec_requests_total", (("endpoint", "completions"), ("status", "200")))] >= 1
    assert after[("specdec_tokens_per_second", ())] > 0
    assert after[("specdec_queue_depth", ())] == 0 and after[("specdec_slots", ())] == 4


def _generated(server):
    return _metrics(server)[("specdec_generated_tokens_total", ())]


def test_disconnect_frees_the_slot(looping):
    c = looping.client(api_key=KEY)
    before = _generated(looping)
    with c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=100000,
                                   stream=True) as s:
        for i, _ in enumerate(s):
            if i == 3:
                break
    deadline = time.monotonic() + 30
    while looping.get("/health")[1]["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert looping.get("/health")[1] == IDLE
    assert _generated(looping) - before < 3000     # cut short, not run to the 4096-token context
    r = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=5, temperature=0)
    assert r.choices[0].message.content == REPLY[:5]


def test_disconnect_without_stream_frees_the_slot(looping):
    """A client that gives up on a non-streaming request frees its slot too."""
    import http.client

    before = _generated(looping)
    conn = http.client.HTTPConnection("127.0.0.1", looping.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 100000}),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    deadline = time.monotonic() + 30
    while looping.get("/health")[1]["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert looping.get("/health")[1]["running"] == 1
    conn.close()
    while looping.get("/health")[1] != IDLE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert looping.get("/health")[1] == IDLE
    assert _generated(looping) - before < 3000


def test_load_with_random_disconnects(looping):
    """16 streaming clients for SOAK_S seconds (each at least until it has finished one
    stream and left one mid-stream), a third of the later requests leaving mid-stream."""
    failures, done, cut = [], [0], [0]
    stop_at = time.monotonic() + SOAK_S
    lock = threading.Lock()

    def client(seed):
        # each client goes on past SOAK_S until it has finished one stream and cut one (a
        # loaded machine then takes longer, but the counts below do not depend on its speed)
        rng = random.Random(seed)
        c = looping.client(api_key=KEY, timeout=120)
        mine = {"done": 0, "cut": 0}
        while time.monotonic() < stop_at or not (mine["done"] and mine["cut"]):
            try:
                leave = (rng.random() < 0.33 if mine["done"] and mine["cut"]
                         else not mine["cut"])
                n = rng.randint(8, 96)
                chat = rng.random() < 0.5
                kw = dict(model="tiny", max_tokens=n, temperature=rng.choice([0, 0.7]),
                          stream=True)
                s = (c.chat.completions.create(messages=HELLO, **kw) if chat
                     else c.completions.create(prompt="Hi_thEre!", **kw))
                with s:
                    text, last = "", None
                    for i, ch in enumerate(s):
                        if leave and i == rng.randint(1, 4):
                            break
                        if ch.choices:
                            text += (ch.choices[0].delta.content or "") if chat else ch.choices[0].text
                            last = ch.choices[0].finish_reason or last
                with lock:
                    if leave:
                        cut[0] += 1
                        mine["cut"] += 1
                    else:
                        assert last == "length" and text, (text, last)
                        done[0] += 1
                        mine["done"] += 1
            except Exception as e:   # any failed request fails the test
                with lock:
                    failures.append(repr(e))
                return

    warm = looping.client(api_key=KEY)
    for _ in range(3):
        warm.completions.create(model="tiny", prompt="Hi_thEre!", max_tokens=32, stream=False)
    rss0 = looping.rss_kb()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    busiest = 0
    while any(t.is_alive() for t in threads):
        h = looping.get("/health")[1]
        busiest = max(busiest, h["running"])
        assert h["running"] <= 4
        time.sleep(0.2)
    for t in threads:
        t.join(timeout=SOAK_S + 300)
    assert not failures, failures[:5]
    assert busiest > 1      # requests ran together
    assert done[0] >= 16 and cut[0] >= 1, (done, cut)
    deadline = time.monotonic() + 30
    while looping.get("/health")[1] != IDLE \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert looping.get("/health")[1] == IDLE
    growth_mb = (looping.rss_kb() - rss0) / 1024
    print(f"load: {done[0]} streams finished, {cut[0]} cut, RSS growth {growth_mb:.1f} MB")
    assert growth_mb < 20, growth_mb
    assert looping.proc.poll() is None


def test_logprobs(ending):
    c = ending.client()
    r = c.chat.completions.create(model="tiny", messages=HELLO, temperature=0, logprobs=True,
                                  top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == REPLY == r.choices[0].message.content
    for t in content:
        assert -1e-3 < t.logprob <= 0 and len(t.top_logprobs) == 2
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[1].logprob < -20
        assert bytes(t.bytes).decode() == t.token
    r = c.completions.create(model="tiny", prompt="abc", max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == REPLY[:5] and len(lp.token_logprobs) == 5
    assert [len(d) for d in lp.top_logprobs] == [3] * 5 and lp.text_offset == [0, 1, 2, 3, 4]
    chunks = list(c.chat.completions.create(model="tiny", messages=HELLO, temperature=0,
                                            logprobs=True, stream=True))
    streamed = [t.token for ch in chunks if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.content]
    assert "".join(streamed) == REPLY
    r = c.chat.completions.create(model="tiny", messages=HELLO, temperature=0)
    assert r.choices[0].logprobs is None


def test_per_request_drafter(looping):
    c = looping.client(api_key=KEY)
    prompt = "Hi_thEre!Hi_thEre!Hi_thEre!"

    def spec(**ext):
        r = c.completions.create(model="tiny", prompt=prompt, max_tokens=40, temperature=0,
                                 extra_body={"specdec": ext} if ext else None)
        return r.choices[0].text, r.usage.model_extra["speculation"]
    text, default = spec()
    assert default["drafted"] > 0
    plain_text, plain = spec(drafter="plain")
    assert plain_text == text and plain["drafted"] == 0
    short = spec(drafter="ngram", n_max=1)[1]
    assert short["drafted"] > 0 and len(short["drafted_per_position"]) == 1
    for bad_ext in ({"drafter": "nope"}, {"n_max": 99}, {"n_max": -1}, {"bogus": 1}):
        with pytest.raises(openai.BadRequestError):
            c.completions.create(model="tiny", prompt=prompt, max_tokens=4,
                                 extra_body={"specdec": bad_ext})


def test_benchmark_client(ending):
    """The serve benchmark's load client, on this server."""
    from specdec.benchmark.serve_load import run_load

    res = run_load("127.0.0.1", ending.port, ["abc", "xyz"], concurrency=2, n_gen=5,
                   extra={"model": "tiny"})
    s = res.summary()
    assert (s["requests"], s["errors"], s["tokens"]) == (4, 0, 20), res.errors
    assert s["ttft_ms"]["p50"] > 0 and s["itl_ms"]["p50"] >= 0 and s["tokens_per_s"] > 0
    both = res.merge(res).summary()     # two passes: twice the tokens in twice the time
    assert (both["requests"], both["tokens"]) == (8, 40)
    assert both["tokens_per_s"] == pytest.approx(s["tokens_per_s"])
