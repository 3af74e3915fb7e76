"""Sliding-window layers: llama.cpp overwrites a cell of a window cache (``swa_full=False``) as
soon as it falls out of its sequence's window, and a saved sequence state holds only the window
of its last position (whatever ``swa_full``), so rollback and prefix reuse must stay where the
cells they need are still held. The tiny gemma3 has a window of 32 and, with n_batch 32, a
window cache of 256 cells: prompts of a few hundred tokens wrap it several times."""
import numpy as np
import pytest

from specdec import Batch, Context, Decoder, Model
from specdec._checks import DrivenController
from specdec.drafters import create
from specdec.testing.tiny import Gemma3Dims

W = Gemma3Dims().n_swa
N_BATCH = 32
#: logits this close to the maximum count as a tie (a verify batch rounds differently from the
#: reference's one long batch: chosen-token logprobs differ by up to 0.02 on this model)
TIE = 0.05


def _prompt(seed: int, n: int = 320, period: int = 40) -> list:
    """``n`` tokens repeating a random segment: text an n-gram drafter can copy from."""
    seg = np.random.default_rng(seed).integers(0, 256, period).tolist()
    return (seg * (n // period + 1))[:n]


def assert_greedy(model: Model, prompt: list, out: list) -> None:
    """Every token of ``out`` is the greedy choice after ``prompt`` and the tokens before it,
    as a context that keeps every position computes it (near ties aside)."""
    toks = prompt + out[:-1]
    ctx = Context(model, n_ctx=len(toks) + 8, n_batch=len(toks), swa_full=True)
    b = Batch(len(toks))
    for i, t in enumerate(toks):
        b.add(t, i, 0, i >= len(prompt) - 1)
    ctx.decode(b)
    n_exact = 0
    for j, t in enumerate(out):
        row = np.asarray(ctx.logits(len(prompt) - 1 + j))
        assert row[t] >= row.max() - TIE, f"token {j} of the output is not greedy"
        n_exact += int(row.argmax() == t)
    assert n_exact >= len(out) - 2
    ctx.close()


@pytest.fixture(scope="module")
def g3(tiny_gemma3_path):
    return Model(tiny_gemma3_path)


def _window_controller(model, n_seq=1, n_max=6, drafter="ngram"):
    ctx = Context(model, n_ctx=1024 * n_seq, n_batch=N_BATCH, n_seq_max=n_seq, kv_unified=True,
                  swa_full=False)
    ds = [create(drafter)] if drafter else []
    for d in ds:
        d.bind(ctx, n_seq)
    return DrivenController(ctx, ds, n_max=n_max)


@pytest.mark.parametrize("drafter,n_max", [(None, 0), ("ngram", 4), ("ngram", 8)])
def test_rollback_in_a_window_cache_is_greedy(g3, drafter, n_max):
    ctl = _window_controller(g3, n_max=n_max, drafter=drafter)
    prompt = _prompt(1)
    ctl.start([prompt], 120)
    ctl.run()
    out = ctl.tokens(0)
    assert len(out) == 120
    if drafter:     # rounds both kept and rolled back drafts
        assert 0 < ctl.stats()["accepted"] < ctl.stats()["drafted"]
    assert_greedy(g3, prompt, out)


def test_sequences_sharing_a_window_cache_are_greedy(g3):
    ctl = _window_controller(g3, n_seq=4)
    prompts = [_prompt(s, n=200 + 40 * s) for s in range(4)]
    ctl.start(prompts, 60)
    ctl.run()
    for i, p in enumerate(prompts):
        assert_greedy(g3, p, ctl.tokens(i))


def _join(ctl, seq, prompt, n=20):
    n_decoded = ctl.join(seq, prompt, max_tokens=n, reuse=True)
    while ctl.is_active(seq) and ctl.step() > 0:
        pass
    ctl.leave(seq, keep=True)
    return n_decoded, ctl.tokens(seq)


def test_reuse_is_refused_where_the_window_is_gone(g3):
    ctl = _window_controller(g3)
    p = _prompt(2)
    _, a = _join(ctl, 0, p, 40)
    # the window of position 100 was overwritten long ago: all of it is decoded again
    b_prompt = p[:100] + [7, 8, 9]
    assert ctl.reusable(0, b_prompt) == 0
    n, b = _join(ctl, 0, b_prompt)
    assert n == len(b_prompt)
    assert_greedy(g3, b_prompt, b)
    # a prompt that extends what the slot holds decodes only the new tokens
    c_prompt = b_prompt + b + [3, 4]
    n, c = _join(ctl, 0, c_prompt)
    assert n == 3
    assert_greedy(g3, c_prompt, c)
    # a cut back within the window's reach keeps the rest
    held = c_prompt + c[:-1]
    d_prompt = held[:-W // 2] + [11]
    assert ctl.reusable(0, d_prompt) == len(d_prompt) - 1
    n, d = _join(ctl, 0, d_prompt)
    assert n == 1
    assert_greedy(g3, d_prompt, d)


def test_a_saved_state_serves_only_prompts_within_its_window(tiny_gemma3_path):
    """A sequence's saved state holds only its last window, with ``swa_full=True`` too: a
    prompt leaving it further back is decoded, not restored and cut back."""
    dec = Decoder(tiny_gemma3_path, exact=True, n_ctx=1024, n_batch=N_BATCH, prompt_cache_mib=64)
    assert dec.ctx.swa_full
    fresh = Decoder(tiny_gemma3_path, exact=True, n_ctx=1024, n_batch=N_BATCH, prefix_reuse=False)
    p1, p2 = _prompt(4), _prompt(5)
    a = dec.generate(p1, max_tokens=30)
    dec.generate(p2, max_tokens=10)            # the slot's state of p1 goes to the cache
    assert len(dec.prompt_cache) == 1
    c_prompt = p1[:150] + [5, 6]
    c = dec.generate(c_prompt, max_tokens=30)
    assert c.stats.n_prompt_decoded == len(c_prompt)
    assert c.tokens == fresh.generate(c_prompt, max_tokens=30).tokens
    # one that extends it is restored
    d_prompt = p1 + a.tokens + [9, 9]
    d = dec.generate(d_prompt, max_tokens=30)
    assert d.stats.n_prompt_decoded == 3
    assert d.tokens == fresh.generate(d_prompt, max_tokens=30).tokens


def test_verify_batches_fit_one_ubatch(g3):
    ctx = Context(g3, n_ctx=1024, n_batch=64, n_ubatch=8, swa_full=False)
    with pytest.raises(ValueError, match="n_ubatch 8"):
        DrivenController(ctx, [create("ngram")], n_max=12)
    d = create("ngram")
    d.bind(ctx, 1)
    ctl = DrivenController(ctx, [d], n_max=7)
    assert ctl.max_rows == 8
    prompt = _prompt(6)
    ctl.start([prompt], 100)
    ctl.run()
    assert 0 < ctl.stats()["accepted"] < ctl.stats()["drafted"]
    assert_greedy(g3, prompt, ctl.tokens(0))
    two = Context(g3, n_ctx=1024, n_batch=64, n_seq_max=2, kv_unified=False, swa_full=False)
    with pytest.raises(ValueError, match="one KV stream"):
        DrivenController(two, [create("ngram")], n_max=4)


@pytest.mark.parametrize("swa_full", [False, True])
def test_the_prompt_end_window_serves_the_same_prompt_again(g3, swa_full):
    """A request that outruns the window keeps its prompt's end window (the controller's
    prompt-end checkpoint): the same prompt, or one that leaves it near its end, is not
    decoded again although the window of the slot's end no longer reaches back to it."""
    ctx = Context(g3, n_ctx=1024, n_batch=N_BATCH, swa_full=swa_full)
    d = create("ngram")
    d.bind(ctx, 1)
    ctl = DrivenController(ctx, [d], n_max=6)
    p = _prompt(7)
    n, a = _join(ctl, 0, p, 3 * W)
    assert n == len(p)
    assert ctl.reusable(0, p) == len(p) - 1
    n, again = _join(ctl, 0, p, 3 * W)
    assert n == 1 and again == a
    assert_greedy(g3, p, a)
    # another question after most of the same prompt: only the new tokens are decoded
    q = p[:-W // 2] + [21, 22, 23]
    n, b = _join(ctl, 0, q, 3 * W)
    assert n == 3
    assert_greedy(g3, q, b)
    # that join cut back before p's checkpoint: q's own serves q again, and p where it
    # leaves q within q's prompt-end window
    assert ctl.reusable(0, q) == len(q) - 1
    assert ctl.reusable(0, p) == len(p) - W // 2
    n, c = _join(ctl, 0, p, 3 * W)
    assert n == W // 2 and c == a


def test_a_short_request_keeps_no_checkpoint(g3):
    """Where prompt and answer fit in the window, the window of the end holds the prompt's:
    no checkpoint is saved (and none is needed)."""
    ctx = Context(g3, n_ctx=1024, n_batch=N_BATCH, swa_full=False)
    ctl = DrivenController(ctx, [])
    p = _prompt(8, n=12)
    _join(ctl, 0, p, W - 12)
    assert ctl.save_held(0).win_n == 0
    assert ctl.reusable(0, p) == len(p) - 1
    _join(ctl, 0, p, W)           # 12 + 32 tokens outrun the window: checkpoint
    held = ctl.save_held(0)
    assert held.win_n == len(p) and held.win_state
    assert held.nbytes == len(held.state) + len(held.win_state)


@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_the_prompt_cache_restores_a_prompt_that_comes_back(tiny_gemma3_path, drafter):
    """Prompts taking turns on one slot: each comes back from the prompt cache with its
    prompt-end window, so only its last token is decoded again, and the output is the
    fresh decoder's, bit for bit, in exact mode."""
    kw = dict(exact=True, n_ctx=1024, n_batch=N_BATCH, drafter=drafter, n_max=4)
    dec = Decoder(tiny_gemma3_path, prompt_cache_mib=64, **kw)
    fresh = Decoder(tiny_gemma3_path, prefix_reuse=False, **kw)
    prompts = [_prompt(10 + i, n=100 + 30 * i) for i in range(3)]
    first = [dec.generate(p, max_tokens=2 * W) for p in prompts]
    for p, f in zip(prompts, first):
        r = dec.generate(p, max_tokens=2 * W)
        assert r.stats.n_prompt_decoded == 1
        assert r.tokens == f.tokens == fresh.generate(p, max_tokens=2 * W).tokens
    # the prompt with other tokens after it than its answer decodes only those
    q = prompts[1] + [5, 6]
    r = dec.generate(q, max_tokens=W)
    assert r.stats.n_prompt_decoded == 2
    # a cut further back than the window of the prompt's end is decoded again
    q = prompts[1][:-4] + [5, 6]
    r = dec.generate(q, max_tokens=W)
    assert r.stats.n_prompt_decoded == len(q)
    assert r.tokens == fresh.generate(q, max_tokens=W).tokens
