"""Request options of the wrong type get an error that names the option, on the Engine, the
Decoder and the server's protocol; numpy integers count as integers.

Found by the adversarial sweep: ``Engine.submit(drafter=5)`` said "'int' object is not
iterable" (the server's ``"specdec": {"drafter": 5}`` answered it as its 400),
``submit(timeout="1")`` "'>' not supported between instances of 'str' and 'int'";
``max_tokens=np.int64(8)`` was refused while ``logprobs=np.int64(3)`` was taken; the server
took ``"logit_bias": ""`` / ``0`` / ``false`` as no bias, and keys of other scripts' digits
(``"٣"``, read as 3) as token ids.
"""
import numpy as np
import pytest

import specdec
from specdec.config import bias_pairs


@pytest.fixture(scope="module")
def engine(tiny_dense):
    with specdec.Engine(tiny_dense, drafters=["ngram"], n_slots=2, n_ctx=64) as e:
        yield e


def _usable(engine):
    assert engine.submit([1, 2, 3], max_tokens=4).result(timeout=60).finish_reason == "length"


@pytest.mark.parametrize("drafter", [5, 1.5, {"ngram": 1}, b"ngram"])
def test_engine_drafter_of_a_wrong_type(engine, drafter):
    with pytest.raises(TypeError, match="drafter must be the name of one of this engine's"):
        engine.submit([1, 2, 3], max_tokens=4, drafter=drafter)
    _usable(engine)


def test_engine_drafter_lists_still_name_drafters(engine):
    assert engine.submit([1, 2, 3], max_tokens=4, drafter=["ngram"]).result(timeout=60).tokens
    with pytest.raises(ValueError, match="unknown drafter 5"):
        engine.submit([1, 2, 3], max_tokens=4, drafter=[5])


@pytest.mark.parametrize("timeout", ["1", True, [1], float("nan"), 0, -1])
def test_engine_timeout_of_a_wrong_type_or_value(engine, timeout):
    with pytest.raises(ValueError, match="timeout must be None or > 0 seconds"):
        engine.submit([1, 2, 3], max_tokens=4, timeout=timeout)
    _usable(engine)


def test_numpy_integers_are_integers(engine, tiny_dense):
    r = engine.submit(np.array([1, 2, 3]), max_tokens=np.int64(5), logprobs=np.int32(2),
                      stop_token_ids=[np.int64(300 % tiny_dense.n_vocab)]).result(timeout=60)
    assert len(r.tokens) <= 5 and all(len(lp.top) == 2 for lp in r.logprobs)
    with pytest.raises(ValueError, match="max_tokens must be an int"):
        engine.submit([1, 2, 3], max_tokens=np.bool_(True))
    with pytest.raises(ValueError, match="max_tokens must be an int"):
        engine.submit([1, 2, 3], max_tokens=np.float64(5))


@pytest.mark.parametrize("key", ["٣", "²", "1e2", "0x1", "", "1.0"])
def test_logit_bias_keys_are_ascii_token_ids(key):
    with pytest.raises(ValueError, match="logit_bias keys must be token ids"):
        bias_pairs({key: 1})


def test_logit_bias_text_keys():
    assert bias_pairs({"12": 1, "-3": 2, " 7 ": -1.5}) == ((-3, 2.0), (7, -1.5), (12, 1.0))


@pytest.mark.parametrize("bias", ["", 0, False, "x", 5])
def test_server_logit_bias_must_be_an_object(tiny_dense, bias):
    with specdec.Decoder(tiny_dense, n_ctx=64) as dec:
        with pytest.raises(ValueError, match="logit_bias must map token ids to numbers"):
            dec.create_completion([1, 2], max_tokens=2, logit_bias=bias)
        assert dec.create_completion([1, 2], max_tokens=2, logit_bias=None)["choices"]


@pytest.mark.parametrize("prompts, match", [("abc", "got str"), (b"ab", "got bytes"),
                                            ([1, 2, 3], "pass \\[ids\\]"), (5, "got int")])
def test_generate_batch_takes_a_list_of_prompts(tiny_dense, prompts, match):
    with specdec.Decoder(tiny_dense, n_ctx=64, n_seq_max=3) as dec:
        with pytest.raises(TypeError, match=match):
            dec.generate_batch(prompts, max_tokens=2)
        assert [len(r.tokens) for r in dec.generate_batch(["abc", [1, 2]], max_tokens=2)] == [2, 2]


def test_engine_context_too_small_is_said_per_slot(tiny_dense):
    # it said "n_ctx=12 is too small" for n_ctx=3 and 4 slots: the whole context's size
    with pytest.raises(ValueError, match=r"n_ctx=3 \(tokens per slot\) is too small for drafts "
                                         r"of n_max=4.*n_ctx >= 6"):
        specdec.Engine(tiny_dense, drafters=["ngram"], n_slots=4, n_ctx=3)
    with specdec.Engine(tiny_dense, drafters=["ngram"], n_slots=4, n_ctx=6) as engine:
        assert engine.submit([1], max_tokens=20).result(timeout=60).finish_reason == "context"
