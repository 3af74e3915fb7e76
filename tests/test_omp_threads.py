"""A thread done decoding gives back its OpenMP workers (``_omp_pool.h``).

libgomp keeps a worker pool per thread that ran a parallel region, for the thread's life;
while the pools of a process outnumber its CPUs, every decoding team sleep-waits between its
regions (an Engine next to an idle Decoder decoded 35% slower). Counted here as the
process's OS threads: a Decoder's call, an Engine's setup on the caller's thread and an
idle Engine's worker leave no pool behind.
"""
import os
import threading
import time

import pytest

from specdec import Decoder, Engine
from specdec._core import release_threads

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task") or not release_threads(),
    reason="needs Linux's /proc and libgomp's pause (an OpenMP build with GCC)")


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settle(expected: int, timeout: float = 10.0) -> int:
    """The OS thread count once it is at most ``expected`` (or the timeout's last count)."""
    deadline = time.monotonic() + timeout
    while (n := os_threads()) > expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return n


def test_decoder_calls_leave_no_pool(tiny_dense_path):
    dec = Decoder(tiny_dense_path, n_ctx=256, n_threads=2, lazy_logits=False)
    base = os_threads()
    dec.generate("The quick brown fox", max_tokens=8)
    assert os_threads() <= base
    pieces = list(dec.stream("The quick brown fox", max_tokens=8))
    assert pieces and os_threads() <= base
    # a decode after the release makes the workers again and gives the same tokens
    assert dec.generate("The quick brown fox", max_tokens=8).tokens == \
        dec.generate("The quick brown fox", max_tokens=8).tokens
    dec.close()


def test_engine_setup_and_idle_worker_leave_no_pool(tiny_dense_path):
    base = os_threads()
    # lazy_logits "auto" times both LM heads on this (the caller's) thread when no record
    # is cached; whatever setup decoded here, the caller keeps no workers
    eng = Engine(tiny_dense_path, n_slots=2, n_ctx=256, n_threads=2)
    try:
        assert settle(base + 1) == base + 1          # the worker thread alone
        outs = [eng.submit("Once upon a time", max_tokens=12) for _ in range(2)]
        assert all(len(h.result(60).tokens) == 12 for h in outs)
        # idle again: the worker gave its OpenMP threads back
        assert settle(base + 1) == base + 1
    finally:
        eng.close()


def test_a_pool_kept_by_another_thread_is_its_own(tiny_dense_path):
    """Giving back is per thread: a thread's release leaves another thread's decode alone."""
    dec = Decoder(tiny_dense_path, n_ctx=256, n_threads=2, lazy_logits=False)
    want = dec.generate("abc", max_tokens=6).tokens
    got = []
    stop = threading.Event()

    def release_often():
        while not stop.is_set():
            release_threads()

    t = threading.Thread(target=release_often)
    t.start()
    try:
        for _ in range(5):
            got.append(dec.generate("abc", max_tokens=6).tokens)
    finally:
        stop.set()
        t.join()
    assert got == [want] * 5
    dec.close()
