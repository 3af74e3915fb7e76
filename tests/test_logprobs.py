"""Per-token logprobs: log_softmax of the target's own logits at each emitted token."""
import numpy as np
import pytest

import specdec
from specdec import Batch, Context, Decoder, Sampling
from specdec._logprobs import logprobs as row_logprobs

PROMPT = [5, 6, 7, 8] * 6


def _log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def _reference_rows(model, prompt, tokens):
    """log_softmax of the plain decode's logits before each generated token: one batch-invariant
    decode of the whole sequence (in exact mode a row's logits do not depend on its batch)."""
    seq = list(prompt) + list(tokens[:-1])
    ctx = Context(model, n_ctx=1024, n_batch=len(seq), batch_invariant=True)
    b = Batch(len(seq))
    for i, t in enumerate(seq):
        b.add(t, i, 0, i >= len(prompt) - 1)
    ctx.decode(b)
    rows = [_log_softmax(ctx.logits(i)) for i in range(len(prompt) - 1, len(seq))]
    ctx.close()
    return rows


def _check(model, res, prompt, n_top):
    assert res.logprobs is not None and len(res.logprobs) == len(res.tokens)
    ref = _reference_rows(model, prompt, res.tokens)
    for tok, lp, row in zip(res.tokens, res.logprobs, ref):
        assert lp.logprob == pytest.approx(row[tok], abs=2e-4)
        best = np.argsort(-row, kind="stable")[:n_top]
        assert [i for i, _ in lp.top] == best.tolist()
        assert [v for _, v in lp.top] == pytest.approx(row[best].tolist(), abs=2e-4)


@pytest.fixture(scope="module")
def unpacked(tiny_dense_path):
    return specdec.Model(tiny_dense_path, use_extra_bufts=False)


@pytest.mark.parametrize("drafter", [None, "ngram"])
@pytest.mark.parametrize("sampled", [False, True])
def test_chosen_token_logprob_is_log_softmax_of_plain_logits(unpacked, drafter, sampled):
    dec = Decoder(unpacked, drafter=drafter, n_max=4, exact=True, n_ctx=512)
    accepted = 0
    # sampled: a few seeds, so that some drafts are accepted whatever the sampler's stream
    for seed in ((3, 4, 5, 6) if sampled else (None,)):
        sampling = Sampling(temperature=0.9, top_k=40, seed=seed) if sampled else None
        res = dec.generate(PROMPT, max_tokens=40, sampling=sampling, logprobs=3)
        accepted += res.stats.accepted
        _check(unpacked, res, PROMPT, 3)
        if not sampled:        # greedy: the chosen token is the best one
            assert all(lp.top[0][0] == t for t, lp in zip(res.tokens, res.logprobs))
    if drafter:
        assert accepted > 0


def test_logprobs_only_when_asked(unpacked):
    dec = Decoder(unpacked, drafter="ngram", exact=True, n_ctx=512)
    assert dec.generate(PROMPT, max_tokens=10).logprobs is None
    res = dec.generate(PROMPT, max_tokens=10, logprobs=True)
    assert all(lp.top == [] for lp in res.logprobs)
    with pytest.raises(ValueError, match="logprobs"):
        dec.generate(PROMPT, max_tokens=10, logprobs=-2)


def test_logprobs_survive_a_stop_string(unpacked):
    dec = Decoder(unpacked, exact=True, n_ctx=512)
    text = dec.generate(PROMPT, max_tokens=30).text
    res = dec.generate(PROMPT, max_tokens=30, stop=text[10:13], logprobs=1)
    assert res.finish_reason == "stop"
    assert len(res.logprobs) == len(res.tokens)
    pieces = list(dec.stream(PROMPT, max_tokens=30, stop=text[10:13], logprobs=1).pieces())
    assert [lp for p in pieces for lp in p.logprobs] == res.logprobs


def test_row_logprobs_function():
    x = np.array([0.5, 2.0, -1.0, 2.0, 0.0], dtype=np.float32)
    lp, top = row_logprobs(x, 2, 3)
    ref = _log_softmax(x)
    assert lp == pytest.approx(ref[2], abs=1e-6)
    assert [i for i, _ in top] == [1, 3, 0]      # ties: the lower id first
    with pytest.raises(ValueError):
        row_logprobs(x, 9)


@pytest.mark.slow
def test_gemma_logprobs_with_and_without_drafter(gemma_path):
    model = specdec.Model(gemma_path, use_extra_bufts=False)
    prompt = model.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n")
    for drafter in (None, "ngram"):
        res = Decoder(model, drafter=drafter, exact=True, n_ctx=1024).generate(
            prompt, max_tokens=24, logprobs=2)
        _check(model, res, prompt, 2)
