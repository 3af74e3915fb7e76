"""`specdec serve` under hostile bodies: nested and oversized JSON, thousands of messages, a
template that runs long, template variables that collide with the renderer's own; /health
stays quick while they are in flight, and streaming clients next to them see no failure.

A fuzzer of request bodies (``SPECDEC_FUZZ_BODIES``, default 150) checks the class: every
answer is a 2xx or a 4xx in OpenAI's error shape, never a 500 or a dropped connection.
"""
import http.client
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from specdec.benchmark.serve import ServerProcess, free_port   # noqa: E402
from specdec.serve.limits import MAX_JSON_DEPTH, MAX_MESSAGES   # noqa: E402
from specdec.testing.chat import write_tiny_chat   # noqa: E402

QWEN = Path(__file__).parent / "data" / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
HELLO = [{"role": "user", "content": "Hello"}]
N_BODIES = int(os.environ.get("SPECDEC_FUZZ_BODIES", "150"))
# a template that loops 10**10 times on a conversation of more than 100 messages (a hostile
# request's), into the server's --chat-template-timeout; chatml otherwise
SLOW = ("{% if messages|length > 100 %}{% for i in range(100000) %}{% for j in range(100000) %}"
        "{% endfor %}{% endfor %}{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _nested(depth):
    v = []
    for _ in range(depth):
        v = [v]
    return v


class Server(ServerProcess):
    def __init__(self, model, *args):
        self.port = free_port()
        log = Path(tempfile.mkdtemp()) / "server.log"
        super().__init__([sys.executable, "-m", "specdec", "serve", "-m", str(model), "--port",
                          str(self.port), "--served-model-name", "tiny", *args], self.port, log,
                         timeout=120)

    def request(self, method, path, raw=None, timeout=120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=raw, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            text = r.read().decode()
            return r.status, (json.loads(text) if text.startswith("{") else text)
        finally:
            conn.close()

    def post(self, path, body):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.request("POST", path, raw)

    def health(self):
        t0 = time.perf_counter()
        status, out = self.request("GET", "/health", timeout=10)
        return time.perf_counter() - t0, status, out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    model = write_tiny_chat(d / "looping.gguf", "chatml", chat_template=QWEN.read_text(),
                            reply="Hi_thEre!", end_token="<|im_start|>")
    tmpl = d / "slow.jinja"
    tmpl.write_text(SLOW)
    s = Server(model, "--n-ctx", "4096", "--slots", "4", "--chat-template", f"@{tmpl}",
               "--chat-template-timeout", "2")
    yield s
    s.stop()


def _is_error(out, status):
    return (isinstance(out, dict) and isinstance(out.get("error"), dict)
            and isinstance(out["error"].get("message"), str) and out["error"]["message"]
            and 400 <= status < 500)


HOSTILE = [
    ("nested arrays", b"[" * 100000 + b"]" * 100000, 400),
    ("nested objects", b'{"a":' * 10000 + b"1" + b"}" * 10000, 400),
    ("too many members", json.dumps({"messages": HELLO, "x": [{"a": 1}] * 20000}).encode(), 413),
    ("nested kwargs", json.dumps({"messages": HELLO, "chat_template_kwargs": {
        "x": _nested(100)}}).encode(), 400),
    ("too many messages", json.dumps({"messages": [{"role": "user"}] * (MAX_MESSAGES + 1)}).encode(),
     400),
    ("messages kwarg", json.dumps({"messages": HELLO, "chat_template_kwargs": {
        "messages": [{"role": "user", "content": "x"}]}}).encode(), 400),
    ("add_generation_prompt kwarg", json.dumps({"messages": HELLO, "chat_template_kwargs": {
        "add_generation_prompt": False}}).encode(), 400),
    ("slow template", json.dumps({"messages": HELLO * 4000}).encode(), 400),
]


# ids: the bodies themselves would make pytest's test id (an environment variable of the
# server's process) too long to start it
@pytest.mark.parametrize("name, body, status", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_body_is_a_client_error(server, name, body, status):
    got, out = server.post("/v1/chat/completions", body)
    assert got == status and _is_error(out, got), (got, out)
    msg = out["error"]["message"]
    assert "Traceback" not in msg and "got multiple values" not in msg, msg
    if name.endswith(" kwarg"):
        assert "chat_template_kwargs" in msg, msg
    if name == "slow template":
        assert "took longer than the 2 s limit" in msg, msg
    if name.startswith("nested"):
        assert f"at most {MAX_JSON_DEPTH} levels" in msg
    assert server.health()[1] == 200


def test_health_answers_while_hostile_requests_run(server):
    """Requests that cost seconds of template time run off the event loop: /health is
    answered within 100 ms meanwhile."""
    bodies = [json.dumps({"messages": HELLO * 4000}).encode(),
              json.dumps({"messages": [{"role": "user", "content": "x"}] * 20000}).encode(),
              b"[" * 100000 + b"]" * 100000]
    out = []

    def hostile(raw):
        out.append(server.post("/v1/chat/completions", raw)[0])

    idle = sorted(server.health()[0] for _ in range(20))   # the same machine, nothing in flight
    threads = [threading.Thread(target=hostile, args=(b,)) for b in bodies for _ in range(2)]
    for t in threads:
        t.start()
    lat = []
    while any(t.is_alive() for t in threads):
        dt, status, _ = server.health()
        assert status == 200
        lat.append(dt)
        time.sleep(0.02)
    for t in threads:
        t.join()
    lat.sort()
    print(f"\n/health during hostile requests: {len(lat)} answers, median "
          f"{1e3 * lat[len(lat) // 2]:.1f} ms, max {1e3 * lat[-1]:.1f} ms (idle: median "
          f"{1e3 * idle[10]:.1f} ms, max {1e3 * idle[-1]:.1f} ms)")
    assert out and all(s in (400, 413) for s in out), out
    assert len(lat) >= 10
    assert lat[len(lat) // 2] < 0.1
    assert lat[-1] < 0.5   # a shared 2-core machine; the median holds the 100 ms bound


def test_streams_with_disconnects_beside_hostile_requests(server):
    """16 streaming clients, a third leaving mid-stream, while hostile bodies arrive: no
    failed request, every slot free at the end."""
    failures, done, cut = [], [0], [0]
    stop_at = time.monotonic() + 6
    lock = threading.Lock()

    def client(seed):
        rng = random.Random(seed)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none",
                          max_retries=0, timeout=120)
        mine = 0
        while time.monotonic() < stop_at or mine == 0:   # every client finishes one at least
            mine += 1
            try:
                leave = rng.random() < 0.33
                with c.chat.completions.create(model="tiny", messages=HELLO, stream=True,
                                               max_tokens=rng.randint(8, 64)) as s:
                    last = None
                    for i, ch in enumerate(s):
                        if leave and i == rng.randint(1, 4):
                            break
                        if ch.choices:
                            last = ch.choices[0].finish_reason or last
                with lock:
                    if leave:
                        cut[0] += 1
                    else:
                        assert last == "length", last
                        done[0] += 1
            except Exception as e:
                with lock:
                    failures.append(repr(e))

    def hostile():
        rng = random.Random(99)
        while time.monotonic() < stop_at:
            raw = rng.choice([b"[" * 50000, json.dumps({"messages": HELLO * 3000}).encode(),
                              json.dumps({"messages": HELLO, "chat_template_kwargs":
                                          {"messages": 1}}).encode()])
            status, _ = server.post("/v1/chat/completions", raw)
            if status != 400:
                with lock:
                    failures.append(f"hostile body answered {status}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    threads.append(threading.Thread(target=hostile))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, failures[:5]
    assert done[0] + cut[0] >= 16 and done[0] >= 1 and cut[0] >= 1, (done, cut)
    deadline = time.monotonic() + 30
    while server.health()[2]["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    h = server.health()[2]
    assert h["running"] == 0 and h["queued"] == 0, h
    assert server.proc.poll() is None


# --- the body fuzzer ----------------------------------------------------------------------

def _random_value(rng, depth=0):
    r = rng.random()
    if depth > 4 or r < 0.4:
        return rng.choice([None, True, 0, -1, 1.5, 1e308, 2**70, "", "x" * rng.randint(0, 300),
                           "\ud800", "<|im_end|>", "{{ 7*7 }}"])
    if r < 0.7:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["role", "content", "type", "text", "messages", "name", "x"]):
            _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


FIELDS = ["model", "messages", "prompt", "max_tokens", "temperature", "top_p", "stop", "seed",
          "stream", "logprobs", "top_logprobs", "chat_template_kwargs", "specdec", "n",
          "stop_token_ids", "stream_options", "max_completion_tokens"]


def _random_body(rng):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    for _ in range(rng.randint(1, 4)):
        body[rng.choice(FIELDS)] = _random_value(rng)
    if rng.random() < 0.3:
        body["messages"] = [_random_value(rng) for _ in range(rng.randint(0, 6))]
    if body.get("max_tokens") is None:   # generations stay short
        body["max_tokens"] = 4
    raw = json.dumps(body).encode()
    if rng.random() < 0.15:   # broken JSON
        cut = rng.randrange(len(raw))
        raw = raw[:cut] + rng.choice([b"", b"[" * 2000, b"\xff", b"}"]) + raw[cut + 1:]
    return raw


def test_fuzzed_bodies_get_2xx_or_4xx(server):
    rng = random.Random(int(os.environ.get("SPECDEC_FUZZ_SEED", "7")))
    seen = {}
    for i in range(N_BODIES):
        raw = _random_body(rng)
        path = rng.choice(["/v1/chat/completions", "/v1/completions"])
        status, out = server.post(path, raw)
        seen[status] = seen.get(status, 0) + 1
        assert status < 500, (i, raw[:300], out)
        if status >= 400:
            assert _is_error(out, status), (i, raw[:300], out)
    print(f"\n{N_BODIES} fuzzed bodies: {seen}")
    assert server.proc.poll() is None
