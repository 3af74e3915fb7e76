"""A Decoder's stream read by another thread than the one that opened it.

The decoder closed a stream left unfinished by the thread that opened it at that thread's
next call (an abandoned stream, or one cut by Ctrl-C). A stream handed to a reader thread was
then closed under its reader by the opener's next call: cut short ("cancelled") between two
pieces, or in the middle of a round, where the round failed with a KeyError (or, a context
used by two threads at once, a ContextBusyError from llama.cpp's side). Now the stream
belongs to the thread that last read it, a piece is read by one thread at a time, and a
stream closed while a piece is being read ends after that round.
"""
import threading

import pytest

import specdec
from specdec import ContextBusyError
from specdec.drafters import Drafter

PROMPT = [1, 2, 3, 4]


class Gate(Drafter):
    """Waits for ``go`` in every propose once ``armed`` (the round stops in the drafter)."""

    def __init__(self):
        super().__init__("gate")
        self.armed = False
        self.inside = threading.Event()
        self.go = threading.Event()

    def propose(self, seq, last_token, n_max):
        if self.armed:
            self.inside.set()
            assert self.go.wait(60)
        return []


@pytest.fixture(scope="module")
def ref(tiny_dense):
    with specdec.Decoder(tiny_dense, n_ctx=128) as dec:
        return dec.generate(PROMPT, max_tokens=24).tokens


def test_a_stream_read_by_another_thread_is_not_closed_by_its_opener(tiny_dense, ref):
    with specdec.Decoder(tiny_dense, drafter="ngram:1", n_ctx=128) as dec:
        stream = dec.stream(PROMPT, max_tokens=24)
        first, rest = threading.Event(), threading.Event()
        tokens = []

        def read():
            pieces = stream.pieces()
            tokens.extend(next(pieces).tokens)
            first.set()
            rest.wait(60)
            for p in pieces:
                tokens.extend(p.tokens)
        reader = threading.Thread(target=read)
        reader.start()
        assert first.wait(60)
        with pytest.raises(ContextBusyError):
            dec.generate([5, 6], max_tokens=4)
        rest.set()
        reader.join(60)
        assert tokens == ref and stream.result.finish_reason == "length"
        assert dec.generate(PROMPT, max_tokens=24).tokens == ref


def test_one_stream_read_by_two_threads_at_once(tiny_dense, ref):
    gate = Gate()
    with specdec.Decoder(tiny_dense, drafter=gate, n_ctx=128) as dec:
        stream = dec.stream(PROMPT, max_tokens=24)
        gate.armed = True
        out = []
        reader = threading.Thread(target=lambda: out.append(list(stream.pieces())))
        reader.start()
        assert gate.inside.wait(60)           # the reader's round waits in the drafter
        with pytest.raises(ContextBusyError, match="being read by another thread"):
            stream.next_piece()
        with pytest.raises(ContextBusyError):
            dec.generate([5, 6], max_tokens=4)
        stream.close()                        # ends after the round in progress
        gate.go.set()
        reader.join(60)
        assert not reader.is_alive()
        assert stream.result.finish_reason == "cancelled"
        got = [t for p in out[0] for t in p.tokens]
        assert got == ref[:len(got)] == stream.result.tokens
        gate.armed = False
        assert dec.generate(PROMPT, max_tokens=24).tokens == ref
