"""An AsyncStream read from an event loop other than the one that called ``Engine.stream``.

The worker hands a stream's pieces to the loop that made it (``call_soon_threadsafe``); a
reader in another loop waited on a queue nobody woke and hung for ever, whether the first
loop was closed (``asyncio.run`` made the stream, another ``asyncio.run`` read it) or still
ran in another thread. Now it is a RuntimeError, and the stream and the engine stay usable.
"""
import asyncio
import threading

import pytest

import specdec


@pytest.fixture(scope="module")
def engine(tiny_dense_path):
    with specdec.Engine(tiny_dense_path, n_slots=2, n_ctx=128) as eng:
        yield eng


async def _read(stream):
    return [p.text async for p in stream]


def _in_time(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_stream_made_in_a_closed_loop_is_an_error_elsewhere(engine):
    async def make():
        return engine.stream("hello", max_tokens=6)
    stream = asyncio.run(make())
    with pytest.raises(RuntimeError, match="event loop that called Engine.stream"):
        _in_time(_read(stream))

    async def again():
        return await _read(engine.stream("hello", max_tokens=6))
    assert len(_in_time(again())) >= 1


def test_a_stream_read_from_a_second_running_loop_is_an_error_there_and_reads_in_its_own(
        engine):
    home = asyncio.new_event_loop()
    t = threading.Thread(target=home.run_forever, daemon=True)
    t.start()
    try:
        async def make():
            return engine.stream("hello", max_tokens=6)
        stream = asyncio.run_coroutine_threadsafe(make(), home).result(30)
        with pytest.raises(RuntimeError, match="event loop that called Engine.stream"):
            _in_time(_read(stream))
        # its own loop still reads it to the end
        pieces = asyncio.run_coroutine_threadsafe(_read(stream), home).result(30)
        assert "".join(pieces) == stream.result.text and len(stream.result.tokens) == 6
    finally:
        home.call_soon_threadsafe(home.stop)
        t.join()
        home.close()
