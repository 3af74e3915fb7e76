"""Users' own names: sampling keywords on every call, and llama-cpp-python's OpenAI-shaped calls
(``create_completion`` / ``create_chat_completion``) on the Decoder and the Engine, answering as
``specdec serve`` does. Tiny chat models from specdec.testing.chat (see tests/test_serve.py)."""
import asyncio
from pathlib import Path

import pytest

import specdec
from specdec import Decoder, Engine, Sampling
from specdec.config import SAMPLING_OPTIONS
from specdec.refused import REFUSED
from specdec.testing.chat import write_tiny_chat

QWEN = (Path(__file__).parent / "data" / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja")
REPLY = "Hi_thEre!"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("face")
    tmpl = QWEN.read_text()
    return {"ending": str(write_tiny_chat(d / "ending.gguf", "chatml", chat_template=tmpl,
                                          reply=REPLY, end_token="<|im_end|>")),
            "looping": str(write_tiny_chat(d / "looping.gguf", "chatml", chat_template=tmpl,
                                           reply=REPLY, end_token="<|im_start|>"))}


@pytest.fixture(scope="module")
def dec(models):
    with Decoder(models["looping"], drafter="ngram", n_max=4, n_ctx=1024) as d:
        yield d


@pytest.fixture(scope="module")
def engine(models):
    with Engine(models["looping"], drafters=["ngram"], n_slots=2, n_ctx=1024) as e:
        yield e


SAMPLED = dict(temperature=0.9, top_k=5, top_p=0.9, min_p=0.01, seed=7, repetition_penalty=1.1,
               presence_penalty=0.2, frequency_penalty=0.1, logit_bias={"66": 1.0})


def test_sampling_keywords_are_the_sampling_fields():
    assert set(SAMPLING_OPTIONS) == set(SAMPLED)
    assert Sampling.resolve(**SAMPLED) == Sampling(**SAMPLED)
    assert Sampling.resolve(temperature=None, seed=None) == Sampling()   # None: not given
    with pytest.raises(ValueError, match="not both"):
        Sampling.resolve(Sampling(), temperature=0.5)
    with pytest.raises(TypeError, match="tempreature"):
        Sampling.resolve(tempreature=0.5)
    with pytest.raises(TypeError, match="'mirostat' .* not supported"):
        Sampling.resolve(mirostat=2)


def test_decoder_sampling_keywords(dec):
    base = dec.generate("ab", max_tokens=12, sampling=Sampling(**SAMPLED))
    assert dec.generate("ab", max_tokens=12, **SAMPLED).tokens == base.tokens
    assert "".join(dec.stream("ab", max_tokens=12, **SAMPLED)) == base.text
    assert [r.tokens for r in dec.generate_batch(["ab"], max_tokens=12, **SAMPLED)] == [base.tokens]
    assert dec.chat(HELLO, max_tokens=12, **SAMPLED).tokens == \
        dec.chat(HELLO, max_tokens=12, sampling=SAMPLED).tokens
    assert "".join(dec.stream_chat(HELLO, max_tokens=12, **SAMPLED)) == \
        dec.chat(HELLO, max_tokens=12, **SAMPLED).text
    one = specdec.generate(dec.model, "ab", max_tokens=12, n_ctx=256, **SAMPLED)
    assert one.tokens == specdec.generate(dec.model, "ab", max_tokens=12, n_ctx=256,
                                          sampling=SAMPLED).tokens
    with pytest.raises(ValueError, match="not both"):
        dec.generate("ab", sampling="greedy", temperature=0.5)
    with pytest.raises(ValueError, match="temperature"):
        dec.generate("ab", temperature=-1)
    with pytest.raises(TypeError, match="repeat_penalty"):
        dec.generate("ab", repeat_penalty=1.2)      # llama.cpp's (last 64 tokens): refused
    assert dec.generate("ab", max_tokens=3).tokens     # still usable


def test_chat_refuses_generation_options_for_the_template(dec):
    for name in ("guided_regex", "response_format", "tool_choice", "mirostat", "guided_json"):
        with pytest.raises(ValueError, match=f"'{name}'"):
            dec.chat(HELLO, max_tokens=4, **{name: {"x": 1}})
    # template variables still reach the template, sampling keywords the sampler
    res = dec.chat(HELLO, max_tokens=4, temperature=0, add_generation_prompt=True, foo="bar")
    assert res.text == REPLY[:4]


def test_engine_sampling_keywords(engine):
    base = engine.submit("ab", max_tokens=12, sampling=SAMPLED).result()
    assert engine.submit("ab", max_tokens=12, **SAMPLED).result().tokens == base.tokens

    async def main():
        whole = await engine.generate("ab", max_tokens=12, **SAMPLED)
        text = "".join([p.text async for p in engine.stream("ab", max_tokens=12, **SAMPLED)])
        return whole.tokens, text
    tokens, text = asyncio.run(main())
    assert tokens == base.tokens and text == base.text
    with pytest.raises(ValueError, match="not both"):
        engine.submit("ab", sampling=Sampling(), seed=3)
    with pytest.raises(TypeError, match="mirostat_mode"):
        engine.submit("ab", mirostat_mode=2)


def test_stream_closed_early_is_cancelled(dec):
    st = dec.stream("ab", max_tokens=50)
    next(st)
    st.close()
    assert st.result.finish_reason == "cancelled"
    assert dec.generate("ab", max_tokens=4).finish_reason == "length"


def _check_completion(r, text, finish, n):
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-")
    assert r["choices"][0]["text"] == text and r["choices"][0]["finish_reason"] == finish
    assert r["usage"]["completion_tokens"] == n
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + n


def test_decoder_create_completion(dec):
    want = dec.generate("ab", max_tokens=20)
    r = dec.create_completion("ab", max_tokens=20, temperature=0)
    _check_completion(r, want.text, "length", 20)
    assert r["model"] == Path(dec.model.path).stem
    spec = r["usage"]["speculation"]
    assert spec["drafted"] > 0 and spec["acceptance_rate"] == spec["accepted"] / spec["drafted"]
    chunks = list(dec.create_completion("ab", max_tokens=20, temperature=0, stream=True,
                                        stream_options={"include_usage": True}))
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == want.text
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20
    assert len({c["id"] for c in chunks}) == 1
    # OpenAI's defaults: 16 tokens; logprobs in its completions shape
    r = dec.create_completion("ab", temperature=0, logprobs=2)
    assert r["usage"]["completion_tokens"] == 16
    lp = r["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == r["choices"][0]["text"] and len(lp["top_logprobs"][0]) == 2


def test_decoder_create_chat_completion(models):
    with Decoder(models["ending"]) as d:
        r = d.create_chat_completion(HELLO, temperature=0)
        msg = r["choices"][0]
        assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
        assert msg["message"] == {"role": "assistant", "content": REPLY}
        assert msg["finish_reason"] == "stop"
        assert r["usage"]["speculation"]["acceptance_rate"] is None     # nothing drafted
        chunks = list(d.create_chat_completion(HELLO, temperature=0, stream=True))
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == REPLY
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        # a stream abandoned half-way frees the Decoder
        it = d.create_chat_completion(HELLO, temperature=0, stream=True)
        next(it)
        it.close()
        assert d.create_chat_completion(HELLO, temperature=0, max_tokens=2)[
            "choices"][0]["message"]["content"] == REPLY[:2]


def test_face_errors_name_the_field(dec):
    for name in ("guided_decoding_backend", "repeat_penalty", "best_of", "response_format"):
        value = {"best_of": 2, "repeat_penalty": 1.3,
                 "response_format": {"type": "xml"}}.get(name, "x")
        with pytest.raises(ValueError, match=f"'{name}'"):
            dec.create_completion("ab", **{name: value})
    with pytest.raises(ValueError, match="'top_p'"):
        dec.create_completion("ab", top_p=2)
    with pytest.raises(ValueError, match="need an Engine"):
        dec.create_completion("ab", specdec={"drafter": "plain"})
    with pytest.raises(specdec.ContextFullError):
        dec.create_completion("a" * 2000)
    assert set(REFUSED) >= {"guided_decoding_backend", "repeat_penalty", "mirostat_mode"}
    assert dec.create_completion("ab", max_tokens=2, temperature=0)["choices"][0]["text"]


def test_engine_create_completion_sync_and_async(engine):
    want = engine.submit("ab", max_tokens=20).result()
    r = engine.create_completion("ab", max_tokens=20, temperature=0)
    _check_completion(r, want.text, "length", 20)
    plain = engine.create_completion("ab", max_tokens=20, temperature=0,
                                     specdec={"drafter": "plain"})
    assert plain["choices"][0]["text"] == want.text
    assert plain["usage"]["speculation"]["acceptance_rate"] is None
    chunks = list(engine.create_chat_completion(HELLO, max_tokens=9, temperature=0,
                                                stream=True))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == REPLY and chunks[-1]["choices"][0]["finish_reason"] == "length"

    async def main():
        whole = await engine.acreate_chat_completion(HELLO, max_tokens=9, temperature=0)
        stream = await engine.acreate_completion("ab", max_tokens=20, temperature=0,
                                                 stream=True)
        parts = [c["choices"][0]["text"] async for c in stream]
        return whole, "".join(parts)
    whole, streamed = asyncio.run(main())
    assert whole["choices"][0]["message"]["content"] == REPLY and streamed == want.text
    with pytest.raises(ValueError, match="'typical_p'"):
        engine.create_chat_completion(HELLO, typical_p=0.5)
    assert engine.n_running == 0


def test_n_choices_each_with_its_seed(tiny_dense_path):
    """``n`` > 1: n requests, choice i drawn with ``seed + i`` (vLLM's rule), usage summed."""
    hot = dict(temperature=1.0, top_k=4, max_tokens=10)
    prompt = [11, 52, 97, 140]
    dec = Decoder(tiny_dense_path, drafter="ngram", n_ctx=256)
    engine = Engine(tiny_dense_path, drafters=["ngram"], n_slots=2, n_ctx=256)
    want = [dec.generate(prompt, seed=40 + i, **hot).text for i in range(3)]
    assert len(set(want)) > 1
    r = dec.create_completion(prompt, n=3, seed=40, **hot)
    assert [c["text"] for c in r["choices"]] == want
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert r["usage"]["completion_tokens"] == 30 and r["usage"]["prompt_tokens"] == 4
    chunks = list(dec.create_completion(prompt, n=3, seed=40, stream=True,
                                        stream_options={"include_usage": True}, **hot))
    for i in range(3):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert "".join(c["text"] for c in mine) == want[i] and mine[-1]["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == 30
    # the Engine runs the choices together: the same texts
    r = engine.create_completion(prompt, n=3, seed=40, **hot)
    assert [c["text"] for c in r["choices"]] == want
    chunks = list(engine.create_completion(prompt, n=2, seed=40, stream=True, **hot))
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1}

    async def main():
        whole = await engine.acreate_completion(prompt, n=3, seed=40, **hot)
        stream = await engine.acreate_completion(prompt, n=3, seed=40, stream=True, **hot)
        parts = ["", "", ""]
        async for c in stream:
            parts[c["choices"][0]["index"]] += c["choices"][0]["text"]
        return [c["text"] for c in whole["choices"]], parts
    whole, parts = asyncio.run(main())
    assert whole == want and parts == want
    with pytest.raises(ValueError, match="'n'"):
        dec.create_completion(prompt, n=0)
    engine.close()
    dec.close()


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"]}}}


@pytest.mark.parametrize("face", ["dec", "engine"])
def test_chat_completion_returns_tool_calls(face, request):
    """``create_chat_completion`` with ``tools`` answers as the server does: OpenAI's
    ``tool_calls`` (finish reason ``tool_calls``), and streamed, deltas that add up to
    the same call."""
    pytest.importorskip("llguidance")
    import json
    obj = request.getfixturevalue(face)
    kw = dict(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
              max_tokens=120, temperature=0)
    whole = obj.create_chat_completion(HELLO, **kw)["choices"][0]
    assert whole["finish_reason"] == "tool_calls"
    (call,) = whole["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    chunks = list(obj.create_chat_completion(HELLO, stream=True, **kw))
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(d["function"]["arguments"] for d in deltas[1:]) == \
        call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
