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


@pytest.mark.parametrize("make, body", [(chat_spec, CHAT), (completion_spec, COMPLETION)])
@pytest.mark.parametrize("value", ["yes", 1, 0, [], {}])
def test_include_usage_must_be_a_boolean(make, body, value):
    # "yes" or 1 once read as true: a typo'd client got usage it did not quite ask for
    with pytest.raises(APIError) as e:
        make(dict(body, stream=True, stream_options={"include_usage": value}), MODELS)
    assert e.value.status == 400 and e.value.param == "stream_options"
    assert "include_usage" in e.value.message


@pytest.mark.parametrize("make, body", [(chat_spec, CHAT), (completion_spec, COMPLETION)])
def test_continuous_usage_stats_is_refused_not_ignored(make, body):
    """vLLM's usage in every chunk: not sent, so refused (its no-op value is taken)."""
    so = {"include_usage": True, "continuous_usage_stats": True}
    with pytest.raises(APIError) as e:
        make(dict(body, stream=True, stream_options=so), MODELS)
    assert e.value.status == 400 and e.value.param == "stream_options"
    assert e.value.code == "unsupported_parameter" and "continuous_usage_stats" in e.value.message
    for value in (False, None):
        spec = make(dict(body, stream=True, stream_options=dict(so, continuous_usage_stats=value)),
                     MODELS)
        assert spec.include_usage
    spec = make(dict(body, stream=True, stream_options={"include_usage": None}), MODELS)
    assert not spec.include_usage
