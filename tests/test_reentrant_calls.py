"""A Python drafter that calls back into the Decoder or Engine it drafts for, from inside a
round: generating or closing is refused or deferred, never done under the round's feet.

``Engine.close()`` from a drafter (the worker's own thread) freed the context while the
round that called the drafter still held it: the round then failed on a closed context and
the worker stopped with a traceback in the log. Now the worker frees the context when that
round is over; the request ends ``"cancelled"`` and the engine is closed.
"""
import pytest

import specdec
from specdec import DrafterError, EngineClosed
from specdec.drafters import Drafter


class CallsBack(Drafter):
    """Runs ``action(owner)`` in its first propose, then proposes nothing."""

    def __init__(self, action):
        super().__init__("calls-back")
        self.action = action
        self.owner = None
        self.done = False

    def propose(self, seq, last_token, n_max):
        if not self.done:
            self.done = True
            self.action(self.owner)
        return []


def test_engine_closed_by_its_drafter_frees_after_the_round(tiny_dense, caplog):
    d = CallsBack(lambda engine: engine.close())
    engine = specdec.Engine(tiny_dense, drafters={"x": d}, n_slots=2, n_ctx=64)
    d.owner = engine
    res = engine.submit([1, 2, 3], max_tokens=8).result(timeout=60)
    assert res.finish_reason == "cancelled"
    engine._worker.join(timeout=60)
    assert not engine._worker.is_alive()
    assert "engine worker stopped" not in caplog.text
    with pytest.raises(EngineClosed):
        engine.submit([1], max_tokens=2)
    engine.close()      # from another thread now: harmless


@pytest.mark.parametrize("action", [lambda dec: dec.generate([1], max_tokens=2),
                                    lambda dec: dec.close()], ids=["generate", "close"])
def test_decoder_called_from_its_drafter_is_busy(tiny_dense, action):
    d = CallsBack(action)
    with specdec.Decoder(tiny_dense, drafter=d, n_ctx=64) as dec:
        d.owner = dec
        with pytest.raises(DrafterError, match="ContextBusyError"):
            dec.generate([1, 2, 3], max_tokens=6)
        assert dec.generate([1, 2, 3], max_tokens=4).finish_reason == "length"


@pytest.mark.parametrize("action", [lambda dec: dec.generate([1], max_tokens=2),
                                    lambda dec: dec.close()], ids=["generate", "close"])
def test_decoder_called_from_its_drafter_in_a_stream_is_busy(tiny_dense, action):
    """The stream's own thread calling the decoder closed the unfinished stream under the
    round: a KeyError from the round (generate), or the context freed (close)."""
    d = CallsBack(action)
    with specdec.Decoder(tiny_dense, drafter=d, n_ctx=64) as dec:
        d.owner = dec
        with pytest.raises(DrafterError, match="ContextBusyError"):
            list(dec.stream([1, 2, 3], max_tokens=6))
        assert dec.generate([1, 2, 3], max_tokens=4).finish_reason == "length"


def test_a_stream_closed_by_its_drafter_ends_after_the_round(tiny_dense):
    d = CallsBack(lambda stream: stream.close())
    with specdec.Decoder(tiny_dense, drafter=d, n_ctx=64) as dec:
        stream = dec.stream([1, 2, 3], max_tokens=20)
        d.owner = stream
        list(stream)
        assert stream.result.finish_reason == "cancelled" and len(stream.result.tokens) < 20
        assert dec.generate([1, 2, 3], max_tokens=4).finish_reason == "length"


def test_engine_request_waited_on_by_its_drafter_times_out(tiny_dense):
    d = CallsBack(lambda engine: engine.submit([1], max_tokens=1).result(timeout=0.2))
    with specdec.Engine(tiny_dense, drafters={"x": d}, n_slots=2, n_ctx=64) as engine:
        d.owner = engine
        with pytest.raises(DrafterError, match="TimeoutError"):
            engine.submit([1, 2, 3], max_tokens=6).result(timeout=60)
        assert engine.submit([1, 2], max_tokens=3, drafter="plain").result(timeout=60).tokens
