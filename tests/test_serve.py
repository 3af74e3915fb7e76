"""`specdec serve` through the real `openai` client: sync, async, streaming, load, usage and
metrics, disconnects (what it refuses: test_serve_refusals.py).

Servers run as `python -m specdec serve` children (serve_server.py) on tiny chat models:
``ending`` replies "Hi_thEre!" then <|im_end|>; ``looping`` never ends its reply (its chain
goes through <|im_start|>, a control token with no text), so its streams run to max_tokens
and an n-gram drafter gets accepted. ``SPECDEC_SERVE_SOAK_S`` lengthens the load test.
"""
import asyncio
import json
import os
import random
import re
import threading
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import specdec   # noqa: E402
from serve_server import HELLO, REPLY, Server, ending, models   # noqa: E402,F401 (fixtures)

KEY = "sk-test-123"
SOAK_S = float(os.environ.get("SPECDEC_SERVE_SOAK_S", "8"))


@pytest.fixture(scope="module")
def looping(models):
    s = Server(models["looping"], "--n-ctx", "4096", "--slots", "4", "--drafter", "ngram",
               "--n-max", "4", "--api-key", KEY)
    yield s
    s.stop()


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
