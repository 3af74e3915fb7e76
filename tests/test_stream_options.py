"""``stream_options`` belongs to a stream: without ``stream: true`` it is a 400, as OpenAI and
vLLM answer it, rather than an option silently ignored."""
import pytest

from specdec.serve.protocol import APIError, chat_spec, completion_spec

MODELS = ["m"]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
COMPLETION = {"model": "m", "prompt": "Hi", "max_tokens": 4}


@pytest.mark.parametrize("make, body", [(chat_spec, CHAT), (completion_spec, COMPLETION)])
@pytest.mark.parametrize("stream", [False, None])
def test_stream_options_without_a_stream_is_refused(make, body, stream):
    body = dict(body, stream_options={"include_usage": True})
    if stream is not None:
        body["stream"] = stream
    with pytest.raises(APIError) as e:
        make(body, MODELS)
    assert e.value.status == 400 and e.value.param == "stream_options"
    assert "stream" in e.value.message


@pytest.mark.parametrize("make, body", [(chat_spec, CHAT), (completion_spec, COMPLETION)])
def test_stream_options_with_a_stream_or_null_is_taken(make, body):
    spec = make(dict(body, stream=True, stream_options={"include_usage": True}), MODELS)
    assert spec.stream and spec.include_usage
    spec = make(dict(body, stream_options=None), MODELS)
    assert not spec.stream and not spec.include_usage
