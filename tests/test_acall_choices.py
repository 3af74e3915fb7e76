"""``Engine.acreate_completion`` with ``n`` choices: when one fails, the others stop too.

The choices of a non-streamed request run together and are awaited together; the first
failure is the answer. Before, the other choices went on to their ``max_tokens`` in the
engine's slots for a caller that had already been given the error.
"""
import asyncio

import pytest

import specdec
from specdec import DrafterError
from specdec.drafters import Drafter


class FailsOnce(Drafter):
    """Raises in its first propose (one sequence's), then proposes nothing."""

    def __init__(self):
        super().__init__("fails-once")
        self.failed = False

    def propose(self, seq, last_token, n_max):
        if not self.failed:
            self.failed = True
            raise RuntimeError("boom")
        return []


def test_a_failed_choice_stops_the_others(tiny_dense):
    with specdec.Engine(tiny_dense, drafters={"x": FailsOnce()}, n_slots=2, n_ctx=1024) as engine:
        states = []
        enqueue = engine._enqueue

        def spy(req, loop=None):
            states.append(enqueue(req, loop))
            return states[-1]

        engine._enqueue = spy

        async def main():
            with pytest.raises(DrafterError):
                await engine.acreate_completion([1, 2, 3], max_tokens=900, n=2,
                                                temperature=1.0, seed=3)
            # the loop goes on (a server's does): the other choice must not run on for nobody
            return [st.cancelled or st.future.done() for st in states]

        assert asyncio.run(main()) == [True, True]
        assert len(states) == 2
        # the engine is free for the next request
        assert len(engine.submit([1, 2], max_tokens=4).result(timeout=60).tokens) == 4
