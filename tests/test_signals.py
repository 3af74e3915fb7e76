"""Ctrl-C and resources while the main thread is inside llama.cpp: a model load and a long
prefill stop within 0.5 s of SIGINT and the objects stay usable; a guarded drafter's worker
thread ends with its Decoder.

Each case runs in a fresh interpreter with Python's own SIGINT handler (a job started in the
background by a non-interactive shell inherits SIGINT ignored) and real signals (os.kill).
"""
import os
import subprocess
import tempfile
import sys
import textwrap

import pytest

HEADER = textwrap.dedent("""
    import logging, os, signal, sys, threading, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import specdec
    from specdec import Decoder

    def kill_later(delay):
        stamp = {}
        def fire():
            stamp["t"] = time.perf_counter()
            os.kill(os.getpid(), signal.SIGINT)
        t = threading.Timer(delay, fire)
        t.start()
        return t, stamp
""")


def _run(body: str, *args: str, timeout: float = 300) -> list:
    p = subprocess.run([sys.executable, "-c", HEADER + textwrap.dedent(body), *args],
                       capture_output=True, text=True, timeout=timeout, cwd=tempfile.gettempdir(),
                       env=dict(os.environ, MALLOC_ARENA_MAX="1"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p.stdout.split()


@pytest.mark.parametrize("where", ["log_handler", "other_thread"])
def test_sigint_during_model_load(tiny_qwen35_path, where):
    """A SIGINT that lands while llama.cpp loads (here: from the first log line, in the
    handler itself or from another thread) stops the load with KeyboardInterrupt; it was
    swallowed by the log callback before. The next load works."""
    out = _run("""
        path, where = sys.argv[1], sys.argv[2]
        class Kill(logging.Handler):
            fired = False
            def emit(self, record):
                if Kill.fired:
                    return
                Kill.fired = True
                if where == "log_handler":
                    os.kill(os.getpid(), signal.SIGINT)
                else:
                    t = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT))
                    t.start()
                    t.join()
        log = logging.getLogger("specdec.llama")
        log.setLevel(logging.DEBUG)
        log.addHandler(Kill())
        try:
            specdec.Model(path, load_mtp=True)
            print("loaded")
        except KeyboardInterrupt:
            print("interrupted")
        log.handlers.clear()
        m = specdec.Model(path)
        print("reloaded", Decoder(m, n_ctx=256).generate([1, 2, 3], max_tokens=3).finish_reason)
    """, tiny_qwen35_path, where)
    assert out == ["interrupted", "reloaded", "length"], out


PREFILL = """
    path, how = sys.argv[1], sys.argv[2]
    m = specdec.Model(path)
    short = [2, 100, 200, 300, 400]
    ref = Decoder(m, n_ctx=4096).generate(short, max_tokens=8).tokens
    dec = Decoder(m, drafter="ngram", n_ctx=4096, n_batch=2048, n_ubatch=512)
    long_prompt = [2] + [100 + (i * 37) % 5000 for i in range(3899)]
    t0 = time.perf_counter()
    dec.generate(long_prompt[:200], max_tokens=1)    # how long a prefill takes here
    per_token = (time.perf_counter() - t0) / 200
    timer, stamp = kill_later(0.3)
    t0 = time.perf_counter()
    try:
        if how == "decoder":
            dec.generate(long_prompt, max_tokens=4)
        else:
            dec.ctx.clear()
            b = specdec.Batch(2048)
            for i in range(2048):
                b.add(long_prompt[i], i, 0, i == 2047)
            dec.ctx.decode(b)
        print("finished")
    except KeyboardInterrupt:
        t1 = time.perf_counter()
        print("interrupted", f"{t1 - stamp['t']:.3f}", f"{per_token * 3900:.3f}")
    timer.join()
    print("usable", dec.generate(short, max_tokens=8).tokens == ref)
"""


@pytest.mark.parametrize("how", ["decoder", "context"])
def test_sigint_during_long_prefill(gemma_path, how):
    """A 3,900-token prompt (or one 2,048-token decode) stops within 0.5 s of SIGINT, between
    ubatches or graph nodes (llama.cpp's abort callback), not when the prefill ends; the
    decoder then generates what a fresh one does."""
    out = _run(PREFILL, gemma_path, how, timeout=900)
    assert out[0] == "interrupted", out
    latency, full = float(out[1]), float(out[2])
    print(f"\nSIGINT 0.3 s into a prefill of ~{full:.1f} s: KeyboardInterrupt after {latency:.3f} s")
    assert latency < 0.5
    assert out[3:] == ["usable", "True"], out


def test_guard_threads_end_with_their_decoders(tiny_dense_path):
    """200 Decoders with drafter_timeout (each starts a worker thread): the thread count stays
    flat and RSS grows less than 20 MB once they are gone."""
    out = _run("""
        import gc
        from specdec.drafters import Drafter
        class Echo(Drafter):
            def propose(self, seq, last, n_max):
                return self.history(seq)[-n_max:]
        def rss():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
        m = specdec.Model(sys.argv[1])
        def one():
            d = Decoder(m, drafter=Echo("echo"), n_ctx=256, drafter_timeout=5.0)
            d.generate([1, 2, 3, 1, 2, 3], max_tokens=4)
        for _ in range(20):
            one()
        gc.collect()
        time.sleep(0.2)
        n0, r0 = threading.active_count(), rss()
        for _ in range(200):
            one()
        gc.collect()
        for _ in range(100):
            if threading.active_count() <= n0:
                break
            time.sleep(0.02)
        print(threading.active_count() - n0, rss() - r0)
    """, tiny_dense_path, timeout=1200)
    threads, growth = int(out[0]), int(out[1])
    print(f"\n200 Decoders with drafter_timeout: {threads} threads left, "
          f"RSS {growth / 2**20:+.1f} MB")
    assert threads <= 0
    assert growth < 20 * 2**20
