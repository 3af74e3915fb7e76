"""A `specdec serve` child for the serve tests, and the tiny chat models it serves.

Shared by the test files that talk to a real server through the real ``openai`` client
(``test_serve.py``, ``test_serve_refusals.py``, ``test_serve_structured.py``): ``Server`` starts
``python -m specdec serve`` on a free port; the ``models`` fixture writes the two chat models
(specdec.testing.chat), ``ending`` serves the one that replies REPLY then <|im_end|>. A test
module imports the fixtures it uses. Needs ``openai``: import it after ``importorskip``.
"""
import json
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from specdec.benchmark.serve import ServerProcess, free_port
from specdec.testing.chat import write_tiny_chat

QWEN = (Path(__file__).parent / "data" / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja")
REPLY = "Hi_thEre!"
HELLO = [{"role": "user", "content": "Hello"}]


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

