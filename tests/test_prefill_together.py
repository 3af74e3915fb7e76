"""Requests that arrive together start together: the Engine puts every short deferred
prompt in between the same two rounds (up to one chunk of ``n_batch`` tokens), with one
decode, so their first round is shared; a long prompt still goes in a chunk at a time
between rounds."""
import random

from specdec import Engine


def _prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(2, 250) for _ in range(n)]


def _record_rounds(eng):
    """The number of decoding (not prefilling) sequences at each of the core's rounds."""
    core = eng._core
    seen = []
    inner = core.round

    def round_():
        n = len(core.running) - len(core._prefilling)
        if n:
            seen.append(n)
        inner()
    core.round = round_
    return seen


def _alone(path, prompts, **kw):
    """Each prompt's tokens run one at a time, on an Engine of its own (a finished slot
    keeps its KV, so the same Engine would not decode those prompts again)."""
    with Engine(path, n_slots=4, n_ctx=256, prompt_cache_mib=0) as eng:
        return [eng.submit(p, **kw).result(120).tokens for p in prompts]


def _submit_together(eng, prompts, **kw):
    with eng._cv:                # the worker takes the queue only once all are in
        handles = [eng.submit(p, **kw) for p in prompts]
    return [h.result(120) for h in handles]


def test_short_prompts_that_arrive_together_share_their_first_round(tiny_dense_path):
    prompts = [_prompt(s, 12) for s in range(4)]
    with Engine(tiny_dense_path, n_slots=4, n_ctx=256, n_batch=64, prompt_cache_mib=0) as eng:
        seen = _record_rounds(eng)
        n0 = eng.ctx.n_decodes
        res = _submit_together(eng, prompts, max_tokens=6)
        decodes = eng.ctx.n_decodes - n0
    assert [r.tokens for r in res] == _alone(tiny_dense_path, prompts, max_tokens=6)
    assert seen[0] == 4 and set(seen) == {4}        # every round decoded all four
    # the four prompts went in with one decode (a decode's fixed cost is several rows')
    assert decodes == 1 + len(seen)


def test_a_long_prompt_still_goes_in_a_chunk_at_a_time(tiny_dense_path):
    """A 40-token prompt with ``n_batch`` 16 takes three chunks, each between two rounds of
    the requests already decoding; the short prompts before it are in at the first."""
    prompts = [_prompt(s, 6) for s in range(3)] + [_prompt(9, 40)]
    with Engine(tiny_dense_path, n_slots=4, n_ctx=256, n_batch=16, prompt_cache_mib=0) as eng:
        seen = _record_rounds(eng)
        n0 = eng.ctx.n_decodes
        res = _submit_together(eng, prompts, max_tokens=8)
        decodes = eng.ctx.n_decodes - n0
    assert [r.tokens for r in res] == _alone(tiny_dense_path, prompts, max_tokens=8)
    # the short prompts' 18 tokens: 16 in the first chunk (the third's last 2 wait), then
    # those 2 and 14 of the long prompt's 40, then 16, then 10
    assert seen[:4] == [2, 3, 3, 4] and set(seen[4:]) <= {4, 3, 2, 1}
    # a decode per chunk, whatever the prompts in it (one per prompt: 3 + 2 + 1 + 1)
    assert decodes == 4 + len(seen)


def test_requests_on_their_way_start_with_the_first(tiny_dense_path, monkeypatch):
    """Four requests announced together (a server reading their bodies), the first submitted
    a while before the others: the idle engine waits for those on their way, and every
    round decodes all four. Unannounced, the first ran a round alone and the others
    joined a round behind."""
    import time
    import specdec.engine as engine_mod
    monkeypatch.setattr(engine_mod, "ARRIVAL_WAIT_S", 30.0)   # longer than this test's waits
    prompts = [_prompt(s, 12) for s in range(4)]
    with Engine(tiny_dense_path, n_slots=4, n_ctx=256, n_batch=64, prompt_cache_mib=0) as eng:
        seen = _record_rounds(eng)
        arrivals = [eng.arriving() for _ in prompts]
        handles = []
        for i, (p, arrival) in enumerate(zip(prompts, arrivals)):
            with arrival:
                handles.append(eng.submit(p, max_tokens=6))
            if i == 0:
                time.sleep(0.3)         # the engine had the first to itself meanwhile
        res = [h.result(120) for h in handles]
        # an announcement that ends without a request does not hold the next one back
        late = eng.arriving()
        t0 = time.monotonic()
        alone = eng.submit(prompts[0], max_tokens=2)
        late.done()
        alone.result(120)
        waited = time.monotonic() - t0
    assert [r.tokens for r in res] == _alone(tiny_dense_path, prompts, max_tokens=6)
    assert seen[:5] == [4] * 5
    assert waited < 20.0
