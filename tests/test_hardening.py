"""Threads, interrupts, context limits, long sessions and faulty plugin drafters.

Each test prints its measured figure (run with ``-s`` to see them).
"""
import _thread
import signal
import threading
import time
import warnings

import pytest

import specdec
from specdec import ContextBusyError, Decoder, DrafterError
from specdec.drafters import Drafter
from specdec.drafters.guard import DrafterFaultWarning, GuardedDrafter

PROMPTS = ["Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
           "The days of the week are Monday, Tuesday, Wednesday,"]


@pytest.fixture
def sigint():
    """Python's Ctrl-C handler, whatever this process inherited: a job started in the
    background by a non-interactive shell (as CI may be) ignores SIGINT, and then
    ``_thread.interrupt_main`` does nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture(scope="module")
def refs(gemma):
    plain = Decoder(gemma, n_ctx=512, n_threads=1)
    return {p: plain.generate(p, max_tokens=40).tokens for p in PROMPTS}


# --- threads ---------------------------------------------------------------------------


def test_two_decoders_in_two_threads_equal_sequential(gemma_path):
    """Exact mode, so outputs compare token for token whatever each round's draft."""
    model = specdec.Model(gemma_path, use_extra_bufts=False)
    decs = [Decoder(model, drafter=d, n_max=4, n_ctx=512, n_threads=1, exact=True)
            for d in ("ngram", "suffix")]
    plain = Decoder(model, n_ctx=512, n_threads=1, exact=True)
    ref = [plain.generate(p, max_tokens=40).tokens for p in PROMPTS]
    t0 = time.perf_counter()
    seq = [d.generate(p, max_tokens=40).tokens for d, p in zip(decs, PROMPTS)]
    t_seq = time.perf_counter() - t0
    assert seq == ref
    out = [None, None]
    barrier = threading.Barrier(2)

    def work(i):
        barrier.wait()
        out[i] = decs[i].generate(PROMPTS[i], max_tokens=40).tokens

    rounds, t_par = 3, 0.0
    for _ in range(rounds):
        ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        t_par += time.perf_counter() - t0
        assert out == seq
    print(f"\n2 decoders x {rounds} rounds: outputs equal sequential; sequential {t_seq:.2f}s, "
          f"concurrent {t_par / rounds:.2f}s per round ({t_seq / (t_par / rounds):.2f}x)")


class Gate(Drafter):
    """Signals when drafting starts and slows each round, so a second thread can collide."""

    def __init__(self):
        super().__init__("gate")
        self.started = threading.Event()

    def propose(self, seq, last_token, n_max):
        self.started.set()
        time.sleep(0.002)
        return []


def test_one_decoder_from_two_threads_raises(gemma, refs):
    gate = Gate()
    dec = Decoder(gemma, drafter=gate, n_ctx=512, n_threads=1)
    res, errors = {}, []

    def first():
        res["tokens"] = dec.generate(PROMPTS[0], max_tokens=40).tokens

    t = threading.Thread(target=first)
    t.start()
    assert gate.started.wait(30)
    for call in (lambda: dec.generate(PROMPTS[1], max_tokens=5),
                 lambda: dec.stream(PROMPTS[1], max_tokens=5),
                 lambda: dec.generate_batch([PROMPTS[1]], max_tokens=5)):
        with pytest.raises(ContextBusyError, match="another thread") as e:
            call()
        errors.append(e.value)
    t.join()
    assert res["tokens"] == refs[PROMPTS[0]]       # the first caller was not disturbed
    assert dec.generate(PROMPTS[1], max_tokens=40).tokens == refs[PROMPTS[1]]
    print(f"\nsecond thread: {len(errors)} calls refused with ContextBusyError; first thread's "
          "output equals the reference")


def _rate(fn, seconds):
    """Loops per second of a spinning Python thread while ``fn`` runs in this thread."""
    count, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    t0 = time.perf_counter()
    if fn is None:
        time.sleep(seconds)
    else:
        fn()
    dt = time.perf_counter() - t0
    stop.set()
    t.join()
    return count[0] / dt


def test_gil_released_in_decode_and_drafting(gemma):
    """A spinning Python thread keeps running while a decoder generates (model drafter:
    the draft model's decodes run in C without the GIL too)."""
    solo = _rate(None, 0.3)
    results = {}
    for name, spec in (("plain", None), ("layerskip:6", "layerskip:6")):
        dec = Decoder(gemma, drafter=spec, n_max=3, n_ctx=512, n_threads=1)
        dec.generate(PROMPTS[0], max_tokens=4)
        rate = _rate(lambda: dec.generate(PROMPTS[0], max_tokens=32), 0)
        results[name] = rate / solo
    print(f"\nspinning thread's speed while generating, relative to alone: "
          + ", ".join(f"{k} {v:.0%}" for k, v in results.items()))
    # holding the GIL through llama_decode would starve the spinner (a few % at most)
    assert min(results.values()) > 0.25, results


# --- interrupts and limits ---------------------------------------------------------------


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.8])
def test_keyboard_interrupt_in_stream(gemma, refs, delay, sigint):
    dec = Decoder(gemma, drafter="ngram", n_max=4, n_ctx=512, n_threads=1)
    timer = threading.Timer(delay, _thread.interrupt_main)
    pieces = []
    s = dec.stream(PROMPTS[0], max_tokens=200)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            for p in s:
                pieces.append(p)
            time.sleep(5)      # finished before the timer: wait for it here
    finally:
        timer.cancel()
    # the stream object is still referenced: a new call from this thread ends it and goes on
    assert dec.generate(PROMPTS[1], max_tokens=40).tokens == refs[PROMPTS[1]]
    assert "".join(dec.stream(PROMPTS[0], max_tokens=40)) == gemma.detokenize(refs[PROMPTS[0]])
    print(f"\ninterrupted after {delay}s ({len(pieces)} pieces); the next calls equal a fresh "
          "decoder's output")


def test_keyboard_interrupt_in_generate(gemma, refs, sigint):
    """Ctrl-C reaches a long generate between rounds, not only when it ends."""
    dec = Decoder(gemma, drafter="ngram", n_max=4, n_ctx=1024, n_threads=1)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    t0 = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            dec.generate(PROMPTS[1], max_tokens=900)
            time.sleep(5)
    finally:
        timer.cancel()
    dt = time.perf_counter() - t0
    assert dt < 3, f"the interrupt took {dt:.1f}s to land"
    assert dec.generate(PROMPTS[1], max_tokens=40).tokens == refs[PROMPTS[1]]
    print(f"\nCtrl-C after 0.5s stopped generate at {dt:.2f}s; the next call equals the reference")


def test_interrupt_during_decode(gemma, refs):
    """Context.interrupt() from another thread stops a long prompt decode (llama.cpp's abort
    callback): KeyboardInterrupt, and the decoder is usable after."""
    dec = Decoder(gemma, n_ctx=1024, n_threads=1)
    long_prompt = "lorem ipsum dolor sit amet " * 80
    stop = threading.Event()

    def fire():
        while not stop.is_set():
            dec.ctx.interrupt()
            time.sleep(0.01)

    t = threading.Thread(target=fire)
    t0 = time.perf_counter()
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            dec.generate(long_prompt, max_tokens=50)
    finally:
        stop.set()
        t.join()
    dt = time.perf_counter() - t0
    assert dec.generate(PROMPTS[0], max_tokens=40).tokens == refs[PROMPTS[0]]
    print(f"\ninterrupted a {len(gemma.tokenize(long_prompt))}-token prompt decode after {dt:.2f}s")


@pytest.mark.parametrize("drafter", [None, "ngram", "suffix", "ngram-map", "draft"])
@pytest.mark.parametrize("sampled", [False, True])
def test_context_limit_ends_with_length(tiny_dense_path, drafter, sampled):
    model = specdec.Model(tiny_dense_path)
    spec = f"draft:{tiny_dense_path}" if drafter == "draft" else drafter
    dec = Decoder(model, drafter=spec, n_max=4, n_ctx=48)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    sampling = {"temperature": 0.9, "seed": 3} if sampled else None
    for _ in range(3):   # and again: the decoder is reusable after hitting n_ctx
        r = dec.generate(prompt, max_tokens=500, sampling=sampling)
        assert r.finish_reason == "context"
        assert len(prompt) + len(r.tokens) == dec.ctx.n_ctx_seq + 1
    if not sampled:
        plain = Decoder(model, n_ctx=48).generate(prompt, max_tokens=500)
        assert r.tokens == plain.tokens


@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_exact_mode_fills_the_context_like_plain(tiny_dense_path, drafter):
    """Found by the Engine fuzz: an exact-mode Decoder padded its last round past the context
    (ContextFullError) instead of ending with "context". It now keeps the Engine's room for
    padding rows and ends where plain decoding ends, with the same tokens."""
    model = specdec.Model(tiny_dense_path, use_extra_bufts=False)
    plain = Decoder(model, n_ctx=48).generate([1, 2, 3], max_tokens=500)
    assert plain.finish_reason == "context"
    dec = Decoder(model, drafter=drafter, n_ctx=48, exact=True)
    for _ in range(2):
        r = dec.generate([1, 2, 3], max_tokens=500)
        assert (r.tokens, r.finish_reason) == (plain.tokens, "context")


@pytest.mark.slow
def test_long_session_keeps_greedy_equality(tiny_dense_path):
    """20k tokens over many calls: a conversation that grows and restarts when it nears n_ctx;
    speculative (exact mode, a drafter chain) equals plain on every call."""
    model = specdec.Model(tiny_dense_path, use_extra_bufts=False)
    spec = Decoder(model, drafter=["suffix", "ngram", "ngram-map"], n_max=4, n_ctx=1024, exact=True)
    plain = Decoder(model, n_ctx=1024, exact=True)
    history, total, calls, t0 = [1, 2, 3], 0, 0, time.perf_counter()
    while total < 20_000:
        a = spec.generate(history, max_tokens=200)
        b = plain.generate(history, max_tokens=200)
        assert a.tokens == b.tokens, f"call {calls}: speculative output differs from plain"
        total += len(a.tokens)
        calls += 1
        history = history + a.tokens + [calls % 200]
        if len(history) > 700:
            history = history[-64:]
    print(f"\n{total} tokens in {calls} calls equal plain greedy ({time.perf_counter() - t0:.0f}s)")


# --- faulty plugin drafters ----------------------------------------------------------------


class Faulty(Drafter):
    """Proposes the reference continuation; misbehaves in ``hook`` from call ``after`` on."""

    def __init__(self, hook, fault, after=2):
        super().__init__("faulty")
        self.hook, self.fault, self.after, self.calls = hook, fault, after, 0
        self.release = threading.Event()

    def _maybe(self, hook):
        if hook != self.hook:
            return None
        self.calls += 1
        if self.calls < self.after:
            return None
        if self.fault == "raise":
            raise ZeroDivisionError("plugin bug")
        if self.fault == "hang":
            self.release.wait(30)
        if self.fault == "garbage":
            return [10**9, -1]
        return None

    def propose(self, seq, last_token, n_max):
        out = self._maybe("propose")
        if out is not None:
            return out
        h = self.history(seq)
        return h[-n_max:] if n_max else []

    def observe(self, seq, tokens):
        self._maybe("observe")

    def accept(self, seq, n_accepted):
        self._maybe("accept")


FAULTS = [(h, "raise") for h in ("propose", "observe", "accept")] + [("propose", "garbage")]


@pytest.mark.parametrize("hook,fault", FAULTS)
def test_faulty_drafter_raises_by_default(gemma, refs, hook, fault):
    d = Faulty(hook, fault)
    dec = Decoder(gemma, drafter=d, n_max=3, n_ctx=512, n_threads=1)
    with pytest.raises(DrafterError):
        dec.generate(PROMPTS[0], max_tokens=40)
    d.hook = None       # healed: no half-rolled-back state is left behind
    assert dec.generate(PROMPTS[0], max_tokens=40).tokens == refs[PROMPTS[0]]


@pytest.mark.parametrize("hook,fault", FAULTS + [(h, "hang") for h in ("propose", "observe", "accept")])
def test_faulty_drafter_isolated(gemma, refs, hook, fault):
    d = Faulty(hook, fault)
    dec = Decoder(gemma, drafter=d, n_max=3, n_ctx=512, n_threads=1, drafter_timeout=0.5,
                  on_drafter_error="disable")
    g = dec.drafters[0]
    assert isinstance(g, GuardedDrafter)
    t0 = time.perf_counter()
    with pytest.warns(DrafterFaultWarning, match="off for the rest of this request"):
        r = dec.generate(PROMPTS[0], max_tokens=40)
    dt = time.perf_counter() - t0
    assert r.tokens == refs[PROMPTS[0]] and g.disabled and len(g.faults) == 1
    if fault == "hang":
        assert dt < 10
        # the hung call is still running: the next request leaves the drafter off
        r2 = dec.generate(PROMPTS[0], max_tokens=40)
        assert r2.tokens == refs[PROMPTS[0]] and r2.stats.drafted == 0
        d.release.set()
        time.sleep(0.2)
    d.hook = None
    with warnings.catch_warnings():
        warnings.simplefilter("error", DrafterFaultWarning)
        r3 = dec.generate(PROMPTS[0], max_tokens=40)
    assert r3.tokens == refs[PROMPTS[0]] and not g.disabled and r3.stats.drafted > 0
    print(f"\n{hook} {fault}: isolated in {dt:.2f}s, output equals plain; drafter back next request")


def test_guard_options_validated(gemma):
    with pytest.raises(ValueError, match="drafter_timeout"):
        Decoder(gemma, drafter=Faulty(None, None), drafter_timeout=0)
    with pytest.raises(ValueError, match="on_drafter_error"):
        Decoder(gemma, drafter=Faulty(None, None), on_drafter_error="ignore")
    # built-in drafters draft in C and are never wrapped
    assert not isinstance(Decoder(gemma, drafter="ngram", drafter_timeout=1.0).drafters[0],
                          GuardedDrafter)
