"""Penalties and logit_bias: the transform against a numpy reference, exact mode under
speculation (each verify row penalised with the history up to it), and the sampled law
(chi-square) of speculative output under penalties."""
import numpy as np
import pytest

import specdec
from specdec import Context, Decoder, Sampling
from specdec._checks import DrivenController
from specdec._controller import new_policy
from specdec._penalty import Penalty
from specdec._sampling import Distribution

from joint_law import chi_square_p
from test_drafters_custom import Oracle   # the plain continuation, corrupted every 3rd call
from test_rejection_sampling import N_SEQ, PROMPT, Proposer, TEMP, TOP_K

PEN = dict(repetition_penalty=1.6, presence_penalty=0.8, frequency_penalty=0.6)


def reference(logits, prompt, out, *, repetition_penalty=1.0, presence_penalty=0.0,
              frequency_penalty=0.0, logit_bias=()):
    """vLLM's order and meanings, in numpy: bias, repetition (prompt and output), presence
    and frequency (output)."""
    x = np.array(logits, dtype=np.float32).copy()
    for t, b in dict(logit_bias).items():
        x[t] += np.float32(b)
    seen = set(prompt) | set(out)
    for t in seen:
        if repetition_penalty != 1.0:
            x[t] = x[t] / np.float32(repetition_penalty) if x[t] > 0 \
                else x[t] * np.float32(repetition_penalty)
    counts = {t: out.count(t) for t in set(out)}
    for t, c in counts.items():
        x[t] -= np.float32(presence_penalty) + np.float32(frequency_penalty) * c
    return x


def test_transform_matches_reference():
    rng = np.random.default_rng(0)
    n = 50
    logits = rng.normal(0, 3, n).astype(np.float32)
    prompt, out, before = [1, 2, 2, 7], [7, 9, 9, 9, 3], [3, 11, 11]
    bias = [(4, 5.0), (9, -1.5)]
    p = Penalty(n, prompt, repetition=1.3, presence=0.4, frequency=0.25, logit_bias=bias)
    for t in out:
        p.push_py(t)
    got = p.transform(logits, before)
    want = reference(logits, prompt, out + before, repetition_penalty=1.3,
                     presence_penalty=0.4, frequency_penalty=0.25, logit_bias=bias)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # the draft tokens counted for that row only; the raw logits are left untouched
    np.testing.assert_allclose(p.transform(logits), reference(
        logits, prompt, out, repetition_penalty=1.3, presence_penalty=0.4,
        frequency_penalty=0.25, logit_bias=bias), rtol=1e-6)
    assert not Penalty(n, prompt).is_active and Penalty(n, logit_bias=[(1, 0.5)]).is_active
    with pytest.raises(ValueError):
        p.transform(logits[:10])


def test_sampling_checks_penalties():
    s = Sampling(logit_bias={"5": 2, 3: -1})
    assert s.logit_bias == ((3, -1.0), (5, 2.0)) and hash(s)
    for bad in (dict(repetition_penalty=0), dict(presence_penalty=3),
                dict(frequency_penalty=float("nan")), dict(logit_bias={"x": 1}),
                dict(logit_bias={1: 500}), dict(logit_bias="1:2")):
        with pytest.raises(ValueError):
            Sampling(**bad)


@pytest.fixture(scope="module")
def exact_tiny(tiny_dense_path):
    return specdec.Model(tiny_dense_path, use_extra_bufts=False)


def test_greedy_penalties_equal_a_reference(exact_tiny):
    """Plain greedy decoding with penalties takes the argmax of the reference transform of
    each step's logits, and the penalties change the output."""
    prompt = [11, 52, 97, 140, 52, 11]
    plain = Decoder(exact_tiny, exact=True, n_ctx=256)
    free = plain.generate(prompt, max_tokens=24).tokens
    # the free run's first token banned, a token pushed up to the top logits (~14): it
    # comes first, then the penalties keep it away
    bias = ((free[0], -20.0), (200, 14.0))
    res = plain.generate(prompt, max_tokens=24, logit_bias=bias, **PEN)
    ctx = Context(exact_tiny, n_ctx=256, n_batch=64, batch_invariant=True)
    out = []
    for _ in range(24):
        lg = np.array(_logits(ctx, prompt + out))
        out.append(int(np.argmax(reference(lg, prompt, out, logit_bias=bias, **PEN))))
    assert res.tokens == out
    assert free != out and out[0] == 200 and free[0] not in out[:1]


def _logits(ctx, prefix):
    from specdec import Batch
    ctx.clear()
    b = Batch(256)
    for i, t in enumerate(prefix):
        b.add(t, i, 0, i == len(prefix) - 1)
    ctx.decode(b)
    return ctx.logits()


@pytest.mark.parametrize("drafter", ["oracle", "ngram"])
def test_exact_mode_equals_plain_with_penalties(exact_tiny, drafter):
    """Greedy speculation with penalties and logit_bias equals plain decoding with them,
    token for token: a row after accepted drafts is penalised for those drafts too."""
    prompts = [[11, 52, 97, 140], [5, 6, 5, 6, 5, 6, 5], [200, 3, 3, 3, 9]]
    bias = {"7": 12.0, "97": -3}
    plain = Decoder(exact_tiny, exact=True, n_ctx=512)
    for p in prompts:
        want = plain.generate(p, max_tokens=48, logit_bias=bias, **PEN)
        d = Oracle(want.tokens, len(p)) if drafter == "oracle" else "ngram"
        spec = Decoder(exact_tiny, drafter=d, n_max=4, exact=True, n_ctx=512, check=True)
        got = spec.generate(p, max_tokens=48, logit_bias=bias, **PEN)
        assert got.tokens == want.tokens, (drafter, p)
        if drafter == "oracle":
            assert got.stats.accepted > 10
        spec.close()


def _penalised_joint(model, prompt, n, pen, bias):
    ctx = Context(model, n_ctx=64, n_batch=64)

    def grow(prefix, p):
        if len(prefix) == n:
            return {tuple(prefix): p}
        lg = np.array(_logits(ctx, list(prompt) + prefix))
        x = reference(lg, list(prompt), prefix, logit_bias=bias, **pen)
        out = {}
        for t, q in Distribution().set_logits(x, temperature=TEMP, top_k=TOP_K).as_dict().items():
            out.update(grow(prefix + [t], p * q))
        return out
    return grow([], 1.0)


@pytest.mark.parametrize("with_probs", [True, False])
def test_sampled_law_holds_under_penalties(tiny_dense, with_probs):
    """Speculative sampling with penalties and bias: the first three tokens follow the exact
    joint law of the penalised target (chi-square), drafts accepted and rejected."""
    # a token pushed up among the best (~14): without the penalties it would come again
    bias = ((200, 16.0), (38, -3.0))
    joint = _penalised_joint(tiny_dense, PROMPT, 3, PEN, bias)
    assert abs(sum(joint.values()) - 1) < 1e-5
    free = _penalised_joint(tiny_dense, PROMPT, 3, {}, bias)
    tv = sum(abs(joint.get(k, 0) - free.get(k, 0)) for k in set(joint) | set(free)) / 2
    assert tv > 0.2, tv             # the penalties change the law a lot
    support = sorted({t for k in joint for t in k})[:6] + [0, 1]
    drafter = Proposer(support, with_probs, seed=7)
    ctx = Context(tiny_dense, n_ctx=64 * N_SEQ, n_batch=64, n_seq_max=N_SEQ)
    drafter.bind(ctx, N_SEQ)
    ctl = DrivenController(ctx, [drafter], n_max=2)
    policy = new_policy(2)
    counts, drafted, accepted = {}, 0, 0
    for r in range(4000 // N_SEQ):
        for i in range(N_SEQ):
            ctl.leave(i)
        ctl.reset_stats()
        for i in range(N_SEQ):
            ctl.join(i, PROMPT, max_tokens=3, seed=1000 * r + i, temperature=TEMP, top_k=TOP_K,
                     n_max=2, policy=policy, logit_bias=bias, **PEN)
        ctl.run()
        for i in range(N_SEQ):
            k = tuple(ctl.tokens(i))
            counts[k] = counts.get(k, 0) + 1
        st = ctl.stats()
        drafted += st["drafted"]
        accepted += st["accepted"]
    assert drafted > 0 and 0 < accepted < drafted
    p = chi_square_p(counts, joint)
    assert p > 1e-3, f"chi-square p={p:.2e}: speculative output under penalties is off"
