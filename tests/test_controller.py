"""The controller with every kind of target and drafter: lossless greedy output, chains,
several sequences, rollback of hybrid (recurrent) targets, adaptive draft length."""
import numpy as np
import pytest

import specdec
from specdec import Decoder
from specdec.drafters import Drafter

REPEAT = list(range(3, 40)) * 3


def _plain(model, prompt, n=64, **kw):
    return Decoder(model, n_ctx=1024, **kw).generate(prompt, max_tokens=n)


class Noise(Drafter):
    """Random guesses: almost never accepted."""

    def __init__(self, n_vocab, seed=0):
        super().__init__("noise")
        self.rng = np.random.default_rng(seed)
        self.nv = n_vocab

    def propose(self, seq, last_token, n_max):
        return self.rng.integers(0, self.nv, n_max).tolist()


@pytest.mark.parametrize("drafter", ["ngram", "suffix", ["suffix", "ngram"], ["ngram", "suffix"]])
def test_greedy_lossless_dense(tiny_dense, drafter):
    plain = _plain(tiny_dense, REPEAT)
    spec = Decoder(tiny_dense, drafter=drafter, n_max=5, n_ctx=1024, check=True).generate(
        REPEAT, max_tokens=64)
    assert spec.tokens == plain.tokens
    assert spec.stats.accepted > 0


@pytest.mark.parametrize("n_max", [1, 2, 3, 5])
def test_greedy_lossless_hybrid_target(tiny_qwen35, n_max):
    """qwen35 keeps recurrent state: partial rollback through n_rollback snapshots."""
    prompt = [5, 9, 200, 17, 42] * 6
    plain = _plain(tiny_qwen35, prompt, 48)
    dec = Decoder(tiny_qwen35, drafter=Noise(tiny_qwen35.n_vocab, n_max), n_max=n_max,
                  n_ctx=1024, check=True)
    assert dec.ctx.n_rollback == n_max
    assert dec.generate(prompt, max_tokens=48).tokens == plain.tokens
    oracle = Decoder(tiny_qwen35, drafter=_Oracle(plain.tokens, len(prompt)), n_max=n_max,
                     n_ctx=1024, check=True)
    r = oracle.generate(prompt, max_tokens=48)
    assert r.tokens == plain.tokens
    # every acceptance count 0..n_max occurred: rounds that accepted at least k drafts are
    # the draft rounds for k = 0 and accepted_per_position[k - 1] after
    st = r.stats
    reached = [st.draft_rounds] + list(st.accepted_per_position[:n_max])
    reached += [0] * (n_max + 2 - len(reached))
    exactly = [reached[k] - reached[k + 1] for k in range(n_max + 1)]
    assert all(n > 0 for n in exactly), exactly
    assert sum(k * n for k, n in enumerate(exactly)) == st.accepted


class _Oracle(Drafter):
    def __init__(self, truth, n_prompt):
        super().__init__("oracle")
        self.truth, self.n_prompt, self.calls = truth, n_prompt, 0

    def propose(self, seq, last_token, n_max):
        self.calls += 1
        done = len(self.history(seq)) - self.n_prompt + 1
        out = list(self.truth[done:done + n_max])
        if out:
            cut = self.calls % (n_max + 1)   # accept 0..n_max in turn
            if cut < len(out):
                out[cut] = (out[cut] + 1) % 256
        return out


def test_draft_model_drafter(tiny_dense_path, tiny_dense):
    plain = _plain(tiny_dense, REPEAT)
    dec = Decoder(tiny_dense, drafter=f"draft:{tiny_dense_path}", n_max=4, n_ctx=1024, check=True)
    r = dec.generate(REPEAT, max_tokens=64)
    assert r.tokens == plain.tokens
    assert r.stats.acceptance_rate > 0.95     # the same model drafts for itself
    assert dec.generate(REPEAT[:20], max_tokens=16).tokens == _plain(tiny_dense, REPEAT[:20], 16).tokens


def test_draft_model_vocab_mismatch(tiny_dense, gemma_path):
    with pytest.raises(ValueError, match="incompatible"):
        Decoder(tiny_dense, drafter=f"draft:{gemma_path}", n_max=2)


def test_layerskip_on_gemma(gemma, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    dec = Decoder(gemma, drafter="layerskip:16", n_max=3, n_ctx=1024, check=True)
    r = dec.generate("The quick brown fox jumps over the lazy dog. The quick brown", max_tokens=24)
    assert r.stats.drafted > 0 and r.stats.accepted > 0
    assert list(tmp_path.glob("layerskip/*.gguf"))
    with pytest.raises(ValueError, match="keep 1"):
        Decoder(gemma, drafter="layerskip:18", n_max=3)


def test_multi_sequence_batch(tiny_dense):
    prompts = [REPEAT, list(range(50, 90)) * 2, [7, 8, 9] * 10]
    dec = Decoder(tiny_dense, drafter="ngram", n_max=4, n_ctx=2048, n_seq_max=3, check=True)
    res = dec.generate_batch(prompts, max_tokens=40)
    for p, r in zip(prompts, res):
        assert r.tokens == _plain(tiny_dense, p, 40).tokens


def test_adaptive_switches_off_a_useless_drafter(tiny_dense):
    dec = Decoder(tiny_dense, drafter=Noise(tiny_dense.n_vocab), n_max=6, adaptive=True, n_ctx=1024,
                  check=True)
    r = dec.generate(REPEAT, max_tokens=120)
    assert r.tokens == _plain(tiny_dense, REPEAT, 120).tokens
    assert r.stats.drafted / r.stats.rounds < 2.5, "adaptive kept drafting long useless drafts"


def test_adaptive_keeps_a_good_drafter(bigram_tiny_path):
    """The bigram model walks a 512-token cycle; a prompt holding the whole cycle
    lets the n-gram drafter predict everything."""
    from specdec.testing import bigram_successor
    succ = bigram_successor(bigram_tiny_path)
    walk = [3]
    for _ in range(600):
        walk.append(int(succ[walk[-1]]))
    model = specdec.Model(bigram_tiny_path)
    dec = Decoder(model, drafter="ngram", n_max=6, adaptive=True, n_ctx=2048, check=True)
    r = dec.generate(walk, max_tokens=120)
    assert r.tokens == _plain(model, walk, 120).tokens
    assert r.stats.acceptance_rate > 0.9
    # on a compute-bound tiny model longer drafts cost in proportion, so the policy may pick
    # short ones; it must keep drafting though (the gemma benchmark checks the lengths). Its
    # plain-cost samples are rounds without a draft, and a loaded machine's noisy timings ask
    # for more of them (19 of 24 rounds drafted under a parallel CPU load): a drafter switched
    # off drafts only in its probes
    assert r.stats.draft_rounds >= 0.65 * r.stats.rounds


def test_max_tokens_exact_inside_accepted_run(tiny_dense):
    plain = _plain(tiny_dense, REPEAT, 64)
    for n in (1, 2, 7, 13):
        r = Decoder(tiny_dense, drafter="ngram", n_max=6, n_ctx=1024).generate(REPEAT, max_tokens=n)
        assert r.tokens == plain.tokens[:n] and r.finish_reason == "length"


def test_stop_string_inside_accepted_run(gemma):
    text = "a, b, c, d, e, f, g, h, a, b, c, d, e, f, g, h, a, b, c,"
    plain = Decoder(gemma, n_ctx=512).generate(text, max_tokens=40, stop=" g")
    spec = Decoder(gemma, drafter="ngram", n_max=6, n_ctx=512).generate(text, max_tokens=40, stop=" g")
    assert spec.finish_reason == plain.finish_reason == "stop"
    assert spec.text == plain.text


def test_n_rs_seq_too_small(tiny_qwen35):
    from specdec import Context
    from specdec._controller import Controller
    from specdec.drafters import create
    ctx = Context(tiny_qwen35, n_ctx=256, n_rollback=2)
    with pytest.raises(ValueError, match="n_rollback=2"):
        Controller(ctx, [create("ngram")], n_max=4)
