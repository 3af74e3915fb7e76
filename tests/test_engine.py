"""The engine: concurrent requests, each as if it ran alone; cancellation, timeouts, asyncio."""
import asyncio
import gc
import time

import numpy as np
import pytest

import specdec
from specdec import Engine, Sampling

# prompts of the tiny model's vocabulary that its n-gram drafters find runs in
PROMPTS = [
    [1, 11, 52, 97, 140],
    [5, 6, 7, 8] * 6,
    list(range(50, 90)),
    [7, 8, 9] * 10,
    [200, 13, 200, 13, 200, 13, 5],
    [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5],
    list(range(120, 100, -1)) * 2,
    [42] * 12,
]
DRAFTERS = ["ngram", "suffix", "plain", "ngram-map", "ngram", "suffix", "plain", "ngram-map"]
MAX_TOKENS = [40, 25, 60, 33, 48, 20, 55, 37]


def _requests(stops):
    return [dict(prompt=p, max_tokens=m, drafter=d, stop=s)
            for p, m, d, s in zip(PROMPTS, MAX_TOKENS, DRAFTERS, stops)]


def _stops_from(texts):
    """A stop string inside every other request's text, so that some stop early."""
    return [[t[len(t) // 2: len(t) // 2 + 3]] if i % 2 and len(t) > 8 else [] for i, t in enumerate(texts)]


@pytest.fixture(scope="module")
def exact_engine(tiny_dense_path):
    with Engine(tiny_dense_path, drafters=["ngram", "suffix", "ngram-map"], n_slots=8,
                n_ctx=4096, n_max=4, exact=True) as eng:
        yield eng


def _idle(eng):
    deadline = time.monotonic() + 30
    while (eng.n_running or eng.n_queued) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert eng.n_running == 0 and eng.n_queued == 0


def _alone(eng, reqs, **kw):
    return [eng.submit(**r, **kw).result() for r in reqs]


def _together(eng, reqs, timeout=120):
    return [h.result(timeout) for h in [eng.submit(**r) for r in reqs]]


def _assert_equal_bit_for_bit(reqs, alone, together):
    """Each request's tokens and logprobs together equal its run alone."""
    for r, a, t in zip(reqs, alone, together):
        assert t.tokens == a.tokens, r
        assert [x.logprob for x in t.logprobs] == [x.logprob for x in a.logprobs], r


def test_exact_concurrent_requests_equal_their_runs_alone(exact_engine, tiny_dense_path):
    eng = exact_engine
    first = _alone(eng, _requests([[]] * 8))
    reqs = _requests(_stops_from([r.text for r in first]))
    alone = _alone(eng, reqs, logprobs=0)
    assert sum(r.finish_reason == "stop" for r in alone) >= 2
    rounds0 = eng.stats()["rounds"]
    handles = [eng.submit(**r, logprobs=0) for r in reqs]
    together = [h.result(timeout=120) for h in handles]
    rounds = eng.stats()["rounds"] - rounds0
    for r, a, t in zip(reqs, alone, together):
        assert t.tokens == a.tokens, r
        assert t.text == a.text and t.finish_reason == a.finish_reason
        # the logits themselves, bit for bit: no row depends on what else was batched
        assert [x.logprob for x in t.logprobs] == [x.logprob for x in a.logprobs], r
    # they really ran together: far fewer rounds than the requests' own rounds added up
    assert rounds < 0.6 * sum(t.stats.rounds for t in together)
    assert sum(t.stats.drafted for t in together) > 0
    # and speculation changed nothing: exact plain decoding gives the same tokens
    plain = specdec.Decoder(tiny_dense_path, exact=True, n_ctx=512)
    for r, t in zip(reqs, together):
        assert plain.generate(r["prompt"], max_tokens=r["max_tokens"], stop=r["stop"]).tokens == t.tokens


def test_requests_join_while_others_run(exact_engine):
    eng = exact_engine
    reqs = _requests([[]] * 8)
    alone = _alone(eng, reqs)
    handles = []
    for r in reqs:                      # each joins a few rounds after the one before
        handles.append(eng.submit(**r))
        next(iter(handles[-1]))
    for h, a in zip(handles, alone):
        assert h.result(timeout=120).tokens == a.tokens


def test_seeded_sampled_request_does_not_depend_on_the_others(exact_engine):
    eng = exact_engine
    s = Sampling(temperature=0.9, top_k=20, seed=1234)
    mine = dict(prompt=PROMPTS[1], max_tokens=50, drafter="ngram", sampling=s)
    alone = eng.submit(**mine).result()
    others = [eng.submit(prompt=p, max_tokens=60, drafter=d,
                         sampling=Sampling(temperature=1.0, seed=i))
              for i, (p, d) in enumerate(zip(PROMPTS[2:7], DRAFTERS[2:7]))]
    together = eng.submit(**mine).result()
    for h in others:
        h.result(timeout=120)
    assert together.tokens == alone.tokens
    assert together.stats.drafted > 0


def test_streaming_pieces_carry_token_ids(exact_engine):
    h = exact_engine.submit(PROMPTS[3], max_tokens=30, drafter="ngram", logprobs=2)
    pieces = list(h)
    res = h.result()
    assert [t for p in pieces for t in p.tokens] == res.tokens
    assert "".join(p.text for p in pieces) == res.text
    assert len(pieces) < len(res.tokens)        # several tokens per round: drafts accepted
    lps = [lp for p in pieces for lp in p.logprobs]
    assert lps == res.logprobs and len(lps) == len(res.tokens)


def test_cancel_frees_the_slot_and_its_kv(exact_engine):
    eng = exact_engine
    h = eng.submit(PROMPTS[2], max_tokens=5000, drafter="plain")
    it = iter(h)
    next(it)
    h.cancel()
    res = h.result(timeout=30)
    assert res.finish_reason == "cancelled" and 0 < len(res.tokens) < 4000
    assert eng._core.ctl.held(h.slot) == [] and not eng._core.ctl.is_active(h.slot)
    assert eng.n_running == 0


def test_timeout_ends_the_request(exact_engine):
    t0 = time.monotonic()
    res = exact_engine.submit(PROMPTS[2], max_tokens=5000, drafter="plain", timeout=0.3).result(30)
    assert res.finish_reason == "timeout" and len(res.tokens) > 0
    assert time.monotonic() - t0 < 10
    h = exact_engine.submit(PROMPTS[2], max_tokens=5000, timeout=5)
    with pytest.raises(TimeoutError):
        h.result(timeout=0.05)
    h.cancel()
    assert h.result(30).finish_reason == "cancelled"


def test_abandoned_request_is_cancelled(exact_engine):
    eng = exact_engine
    _idle(eng)
    before = eng.stats()["cancelled"]
    h = eng.submit(PROMPTS[2], max_tokens=5000, drafter="plain")
    del h
    gc.collect()
    deadline = time.monotonic() + 30
    while eng.stats()["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert eng.stats()["cancelled"] == before + 1 and eng.n_running == 0


def test_bad_requests_raise_at_submit(exact_engine):
    eng = exact_engine
    with pytest.raises(ValueError, match="unknown drafter"):
        eng.submit([1, 2], drafter="nope")
    with pytest.raises(ValueError, match="n_max"):
        eng.submit([1, 2], n_max=9)
    with pytest.raises(ValueError, match="max_tokens"):
        eng.submit([1, 2], max_tokens=0)
    with pytest.raises(ValueError, match="out of range"):
        eng.submit([1, 10**6])
    with pytest.raises(specdec.ContextFullError):
        eng.submit([1] * 5000)
    with pytest.raises(ValueError, match="logprobs"):
        eng.submit([1, 2], logprobs=99)
    with pytest.raises(ValueError, match="stop string"):
        eng.submit([1, 2], stop=["ok", "\ud800"])     # a lone surrogate: no UTF-8 to match
    with pytest.raises(ValueError, match="stop token id"):
        eng.submit([1, 2], stop_token_ids=[3, 10**6])
    with pytest.raises(TypeError, match="stop_token_ids"):
        eng.submit([1, 2], stop_token_ids="3")
    assert eng.submit([1, 2], max_tokens=3).result(30).finish_reason in ("length", "eos")


@pytest.mark.parametrize("drafter", ["plain", "ngram"])
def test_stop_token_ids_end_a_request(exact_engine, drafter):
    """A stop token ends the request where it is first sampled (left out, "stop"), whether
    it comes as the round's target token or inside an accepted draft."""
    eng = exact_engine
    ref = eng.submit(PROMPTS[3], max_tokens=40, drafter=drafter).result(60)
    tok = ref.tokens[6]
    first = ref.tokens.index(tok)
    res = eng.submit(PROMPTS[3], max_tokens=40, drafter=drafter,
                     stop_token_ids=[tok]).result(60)
    assert res.tokens == ref.tokens[:first] and res.finish_reason == "stop"


def test_asyncio_generate_and_stream(exact_engine):
    eng = exact_engine

    async def main():
        res = await asyncio.gather(*(eng.generate(p, max_tokens=20, drafter="ngram")
                                     for p in PROMPTS[:4]))
        st = eng.stream(PROMPTS[1], max_tokens=30)
        text = "".join([p.text async for p in st])
        # a cancelled task cancels its request
        task = asyncio.ensure_future(eng.generate(PROMPTS[2], max_tokens=5000, drafter="plain"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # leaving a stream early cancels it too
        st2 = eng.stream(PROMPTS[2], max_tokens=5000, drafter="plain")
        async for _ in st2:
            break
        await st2.aclose()
        return res, text, st.result

    res, text, full = asyncio.run(main())
    alone = _alone(eng, [dict(prompt=p, max_tokens=20, drafter="ngram") for p in PROMPTS[:4]])
    assert [r.tokens for r in res] == [a.tokens for a in alone]
    assert text == full.text
    _idle(eng)


def test_close_ends_waiting_requests(tiny_dense_path):
    eng = Engine(tiny_dense_path, n_slots=1, n_ctx=256)
    h1 = eng.submit(PROMPTS[0], max_tokens=5000)
    next(iter(h1))                      # running
    h2 = eng.submit(PROMPTS[1], max_tokens=10)     # waiting for the only slot
    eng.close()
    assert h1.result(5).finish_reason == "cancelled"
    with pytest.raises(specdec.EngineClosed):
        h2.result(5)
    with pytest.raises(specdec.EngineClosed):
        eng.submit(PROMPTS[0])
    eng.close()


@pytest.mark.slow
def test_gemma_concurrent_requests_equal_their_runs_alone(gemma_path):
    prompts = ["def fibonacci(n):", "The capital of France is", "Once upon a time, there was",
               "import numpy as np\n\ndef softmax(x):", "1, 2, 3, 4, 5,",
               "The quick brown fox", "Q: What is 2 + 2?\nA:", "<html>\n<body>\n"]
    drafters = ["ngram", "suffix", "plain", "ngram", "suffix", "plain", "ngram", "suffix"]
    with Engine(gemma_path, drafters=["ngram", "suffix"], n_slots=8, n_ctx=256, n_max=4,
                exact=True) as eng:
        first = _alone(eng, [dict(prompt=p, max_tokens=m, drafter=d)
                             for p, m, d in zip(prompts, MAX_TOKENS, drafters)])
        reqs = [dict(prompt=p, max_tokens=m, drafter=d, stop=s) for p, m, d, s in
                zip(prompts, MAX_TOKENS, drafters, _stops_from([r.text for r in first]))]
        alone = _alone(eng, reqs)
        together = _together(eng, reqs, 300)
    for r, a, t in zip(reqs, alone, together):
        assert (t.tokens, t.text) == (a.tokens, a.text), r
    assert sum(a.finish_reason == "stop" for a in alone) >= 2


def test_mtp_and_draft_model_drafters_per_slot(bigram_tiny_path, tiny_dense_path):
    """Drafters with a model of their own keep a sequence per slot: MTP (its context mirrors
    the target's per-slot layout) and a draft model."""
    from specdec.testing import bigram_successor
    succ = bigram_successor(bigram_tiny_path)
    walks = []
    for start in (3, 40, 77):
        w = [start]
        for _ in range(30):
            w.append(int(succ[w[-1]]))
        walks.append(w)
    with Engine(bigram_tiny_path, drafters=["mtp", "ngram"], n_slots=3, n_ctx=512, n_max=3) as eng:
        alone = _alone(eng, [dict(prompt=w, max_tokens=40, drafter="mtp") for w in walks])
        together = [h.result(60) for h in [eng.submit(w, max_tokens=40, drafter="mtp") for w in walks]]
    assert [t.tokens for t in together] == [a.tokens for a in alone]
    assert all(t.stats.accepted > 0 for t in together)
    with Engine(tiny_dense_path, drafters={"draft": f"draft:{tiny_dense_path}"}, n_slots=4,
                n_ctx=512, n_max=3, exact=True) as eng:
        alone = _alone(eng, [dict(prompt=p, max_tokens=30) for p in PROMPTS[:4]])
        together = [h.result(60) for h in [eng.submit(p, max_tokens=30) for p in PROMPTS[:4]]]
    assert [t.tokens for t in together] == [a.tokens for a in alone]
    assert all(t.stats.accepted > 0 for t in together)


@pytest.mark.parametrize("path", ["tiny_qwen35_nomtp_path", "tiny_mamba2_path",
                                  "tiny_qwen3next_path"])
def test_exact_recurrent_target_rows_do_not_depend_on_the_batch(request, path):
    """Exact mode on recurrent and hybrid targets: llama.cpp splits recurrent batches into
    ubatches of equal rows per sequence, so every sequence of a verify decode gets the same
    rows (padding, on qwen35 rolled back by snapshots; one decode per row count, on mamba2
    and qwen3next rolled back by checkpoints), and concurrent requests' logits equal their
    runs alone, bit for bit."""
    reqs = [dict(prompt=p, max_tokens=m, drafter=d, n_max=n, logprobs=0) for p, m, d, n in
            zip(PROMPTS[:6], MAX_TOKENS, DRAFTERS, [4, 2, 0, 3, 1, 4])]
    with Engine(request.getfixturevalue(path), drafters=["ngram", "suffix", "ngram-map"],
                n_slots=4, n_ctx=512, n_max=4, exact=True) as eng:
        alone = _alone(eng, reqs)
        together = _together(eng, reqs)
    _assert_equal_bit_for_bit(reqs, alone, together)
    assert sum(t.stats.drafted for t in together) > 0


class _Guess(specdec.Drafter):
    """Guesses from the last token alone (its repeats, or a hashed run of varying length), so
    a request drafts the same whatever runs beside it, and some guesses are right."""

    def __init__(self):
        super().__init__("guess")

    def propose(self, seq, last_token, n_max):
        if last_token % 3 == 0:
            return [last_token] * n_max
        return [(last_token * 7 + 3 * i) % 200 + 3 for i in range(n_max - last_token % 2)]


@pytest.mark.parametrize("seed", [4, 5])
@pytest.mark.parametrize("arch", ["mamba2", "qwen3next", "rwkv7", "gemma3"])
def test_exact_random_loads_equal_their_runs_alone(model_file, arch, seed):
    """Random loads in exact mode (slots, prompts, lengths, drafters, n_max, greedy and seeded
    sampling, logprobs): every request's tokens and logprobs equal its run alone. Before the
    equal-rows decodes, recurrent targets rolled back by checkpoints changed tokens here."""
    import random

    from specdec import testing

    writers = {"mamba2": lambda p: testing.write_tiny_mamba2(p, seed=1),
               "qwen3next": lambda p: testing.write_tiny_qwen3next(p, seed=2),
               "rwkv7": lambda p: testing.write_tiny_rwkv7(p, seed=1),
               "gemma3": testing.write_tiny_gemma3}
    path = model_file(f"tiny-{arch}-load.gguf", writers[arch])
    rnd = random.Random(seed)
    reqs = []
    for _ in range(rnd.randint(5, 9)):
        n = rnd.randint(1, 60)
        base = [rnd.randrange(3, 200) for _ in range(rnd.randint(1, 6))]
        prompt = ((base * n)[:n] if rnd.random() < 0.5
                  else [rnd.randrange(3, 250) for _ in range(n)])
        sampling = (None if rnd.random() < 0.6 else
                    Sampling(temperature=rnd.choice([0.5, 1.0]), seed=rnd.randrange(1000)))
        reqs.append(dict(prompt=prompt, max_tokens=rnd.randint(1, 50), sampling=sampling,
                         drafter=rnd.choice(["ngram", "plain", "ngram-map", "guess", "guess"]),
                         n_max=rnd.randint(0, 6), logprobs=rnd.choice([0, 2])))
    with Engine(path, drafters={"ngram": "ngram", "ngram-map": "ngram-map", "guess": _Guess()},
                n_slots=rnd.choice([2, 3, 4]), n_ctx=256, n_max=6, exact=True) as eng:
        alone = _alone(eng, reqs)
        together = _together(eng, reqs)
    _assert_equal_bit_for_bit(reqs, alone, together)
    assert sum(t.stats.drafted for t in together) > 0


@pytest.mark.parametrize("path", ["tiny_mamba2_path", "tiny_qwen3next_path"])
def test_recurrent_targets(request, path):
    """Rollback by n_rollback snapshots (mamba2) and by checkpoints (qwen3next), per slot."""
    path = request.getfixturevalue(path)
    with Engine(path, drafters=["ngram"], n_slots=4, n_ctx=512, n_max=3) as eng:
        alone = _alone(eng, [dict(prompt=p, max_tokens=30) for p in PROMPTS[:4]])
        together = [h.result(60) for h in [eng.submit(p, max_tokens=30) for p in PROMPTS[:4]]]
    assert [t.tokens for t in together] == [a.tokens for a in alone]


def test_many_threads_submit_cancel_and_abandon(tiny_dense_path):
    """16 threads, each submitting requests with random options, some cancelled, some
    abandoned mid-stream, some timed out: every request ends, no slot or KV stays taken."""
    import random
    import threading

    errors = []

    def client(eng, seed):
        rnd = random.Random(seed)
        try:
            for _ in range(6):
                p = rnd.choice(PROMPTS)
                h = eng.submit(p, max_tokens=rnd.randint(1, 80), drafter=rnd.choice(DRAFTERS),
                               n_max=rnd.randint(0, 4), logprobs=rnd.choice([None, 0, 2]),
                               sampling=rnd.choice([None, Sampling(temperature=0.7, seed=seed)]),
                               stop=rnd.choice([[], ["a"], ["1f", "00"]]),
                               timeout=rnd.choice([None, None, 0.01]))
                what = rnd.random()
                if what < 0.25:
                    h.cancel()
                    assert h.result(60).finish_reason in ("cancelled", "length", "stop", "eos",
                                                          "timeout")
                elif what < 0.5:
                    for _ in h:         # abandoned after one piece
                        break
                    del h
                else:
                    res = h.result(60)
                    assert len(res.tokens) <= 80
        except Exception as e:          # reported by the main thread
            errors.append(e)

    with Engine(tiny_dense_path, drafters=["ngram", "suffix", "ngram-map"], n_slots=5,
                n_ctx=512, n_max=4) as eng:
        threads = [threading.Thread(target=client, args=(eng, i)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        gc.collect()
        _idle(eng)
        assert not errors, errors
        st = eng.stats()
        assert st["requests"] == 16 * 6 and st["failed"] == 0
        for slot in range(eng.n_slots):
            assert not eng._core.ctl.is_active(slot)
        # the engine still answers, as a fresh one would
        ref = eng.submit(PROMPTS[0], max_tokens=20, drafter="plain").result(30).tokens
    with Engine(tiny_dense_path, n_slots=1, n_ctx=512) as fresh:
        assert fresh.submit(PROMPTS[0], max_tokens=20).result(30).tokens == ref


def test_a_failing_drafter_fails_only_its_request(tiny_dense_path):
    class Boom(specdec.Drafter):
        def propose(self, seq, last_token, n_max):
            if len(self.history(seq)) > 12:
                raise RuntimeError("boom")
            return [last_token]

    with Engine(tiny_dense_path, drafters={"boom": Boom("boom"), "ngram": "ngram"},
                default_drafter="ngram", n_slots=3, n_ctx=512) as eng:
        bad = eng.submit(PROMPTS[0], max_tokens=50, drafter="boom")
        good = [eng.submit(p, max_tokens=50) for p in PROMPTS[1:3]]
        with pytest.raises(specdec.DrafterError, match="boom"):
            bad.result(30)
        with pytest.raises(specdec.DrafterError):
            list(bad)
        assert [h.result(30).finish_reason for h in good] == ["length", "length"]
        assert eng.stats()["failed"] == 1
        alone = [eng.submit(p, max_tokens=50).result(30).tokens for p in PROMPTS[1:3]]
        assert [h.result().tokens for h in good] == alone


def test_finishing_a_request_whose_reader_cancelled_its_future():
    """An asyncio reader that goes away cancels the request's future from its own thread; the
    worker finishing the request at that moment must not fail (it stopped the engine)."""
    from specdec.handles import _State

    class _Past(_State):
        def __init__(self) -> None:
            super().__init__(None)   # type: ignore[arg-type]

        @property
        def future(self):            # cancelled between finish()'s check and its set_result
            return self._f

        @future.setter
        def future(self, f):
            self._f = f

    s = _Past()
    real_done = s._f.done
    calls = []

    def done_then_cancel():
        calls.append(1)
        was = real_done()
        s._f.cancel()
        return was

    s._f.done = done_then_cancel
    s.finish(None)
    s.finish(exc=RuntimeError("late"))
    assert s._f.cancelled() and calls


def test_deferred_prefill_goes_in_by_chunks_between_rounds(tiny_dense_path):
    """A prompt joined with ``defer`` is decoded a chunk at a time while another sequence's
    rounds go on; both outputs equal their runs alone (exact mode)."""
    from specdec import Decoder
    from specdec._checks import DrivenController
    dec = Decoder(tiny_dense_path, drafter="ngram", n_max=4, exact=True, n_seq_max=2,
                  n_ctx=2048, n_batch=16)
    ctl = DrivenController(dec.ctx, dec.drafters, exact=True)
    a, b = PROMPTS[1], list(range(10, 110))
    ctl.join(0, a, max_tokens=60, drafters=dec.drafters, n_max=4)
    ctl.step()
    assert ctl.join(1, b, max_tokens=30, drafters=dec.drafters, n_max=4, defer=True) == len(b)
    grown = []
    while ctl.is_prefilling(1):
        n0 = len(ctl.tokens(0))
        ctl.prefill(1, 7)
        ctl.step()
        grown.append(len(ctl.tokens(0)) > n0)
    assert len(grown) == -(-len(b) // 7) and all(grown)
    ctl.run()
    alone = Decoder(tiny_dense_path, drafter="ngram", n_max=4, exact=True, n_ctx=2048)
    assert ctl.tokens(0) == alone.generate(a, max_tokens=60).tokens
    assert ctl.tokens(1) == alone.generate(b, max_tokens=30).tokens


def test_a_long_prompt_joining_does_not_stall_running_streams(tiny_dense_path):
    import threading
    with Engine(tiny_dense_path, n_slots=2, n_ctx=2048, n_batch=16) as eng:
        running = eng.submit(PROMPTS[0], max_tokens=1500, drafter="plain")
        times = []
        reader = threading.Thread(target=lambda: times.extend(time.monotonic() for _ in running))
        reader.start()
        while not times:
            time.sleep(0.01)
        t_join = time.monotonic()
        joining = eng.submit(list(range(1, 201)) * 4, max_tokens=5)     # 50 chunks of 16
        next(iter(joining))
        t_first = time.monotonic()
        running.cancel()
        reader.join()
    assert sum(t_join < t < t_first for t in times) >= 20
