"""The prompt cache: a prompt whose slot was taken since comes back without its prefill."""
import random

import pytest

from specdec import Decoder, Engine
from specdec.prompt_cache import MIN_TOKENS, PromptCache


def _prompt(seed, n=48):
    rng = random.Random(seed)
    return [rng.randrange(2, 250) for _ in range(n)]


A, B, C = _prompt(1), _prompt(2), _prompt(3)


def _fresh(path, prompt, max_tokens=16, **kw):
    with Decoder(path, n_ctx=512, prefix_reuse=False, **kw) as dec:
        return dec.generate(prompt, max_tokens=max_tokens)


def test_engine_one_slot_restores_a_prompt_that_comes_back(tiny_dense_path):
    with Engine(tiny_dense_path, drafters=["ngram"], n_slots=1, n_ctx=512, exact=True) as eng:
        first = {}
        for p in (A, B, C):
            h = eng.submit(p, max_tokens=16)
            first[tuple(p)] = h.result(60)
            assert h.n_prompt_decoded == len(p)
        st = eng.stats()["prompt_cache"]
        assert st["entries"] == 2 and st["hits"] == 0 and st["bytes"] > 0
        for p in (A, B):
            h = eng.submit(p, max_tokens=16)
            res = h.result(60)
            assert h.n_prompt_decoded == 1       # its last token, for the logits
            assert res.tokens == first[tuple(p)].tokens == _fresh(tiny_dense_path, p,
                                                                  exact=True).tokens
        assert eng.stats()["prompt_cache"]["hits"] == 2
        # a longer prompt that starts with a saved one (the next turn of a chat)
        longer = A + first[tuple(A)].tokens + [7, 8, 9]
        h = eng.submit(longer, max_tokens=16)
        assert h.result(60).tokens == _fresh(tiny_dense_path, longer, exact=True).tokens
        assert h.n_prompt_decoded == 4


def test_without_a_cache_the_prompt_is_decoded_again(tiny_dense_path):
    with Engine(tiny_dense_path, n_slots=1, n_ctx=512, prompt_cache_mib=0) as eng:
        for p in (A, B):
            eng.submit(p, max_tokens=4).result(60)
        h = eng.submit(A, max_tokens=4)
        h.result(60)
        assert h.n_prompt_decoded == len(A)
        assert eng.stats()["prompt_cache"]["entries"] == 0


def test_decoder_with_a_cache(tiny_dense_path):
    with Decoder(tiny_dense_path, drafter="suffix", n_ctx=512, exact=True,
                 prompt_cache_mib=64) as dec:
        ra = dec.generate(A, max_tokens=16)
        dec.generate(B, max_tokens=16)
        again = dec.generate(A, max_tokens=16)
        assert again.stats.n_prompt_decoded == 1 and again.tokens == ra.tokens
    with Decoder(tiny_dense_path, n_ctx=512) as dec:     # off by default
        dec.generate(A, max_tokens=4)
        dec.generate(B, max_tokens=4)
        assert dec.generate(A, max_tokens=4).stats.n_prompt_decoded == len(A)


def test_recurrent_target_restores_only_where_the_state_ends(tiny_mamba2_path):
    kw = dict(drafter="ngram", n_max=3)
    with Decoder(tiny_mamba2_path, n_ctx=512, prompt_cache_mib=64, **kw) as dec:
        ra = dec.generate(A, max_tokens=12)
        dec.generate(B, max_tokens=12)
        # the state saved ends after A and its answer: a prompt extending all of it uses it
        turn = A + ra.tokens + [5, 6, 7]
        r = dec.generate(turn, max_tokens=12)
        assert r.stats.n_prompt_decoded == 4
        assert r.tokens == _fresh(tiny_mamba2_path, turn, 12, **kw).tokens
        dec.generate(C, max_tokens=12)
        # one that leaves it inside cannot: the whole prompt
        inside = A[:40] + [3, 3, 3]
        r = dec.generate(inside, max_tokens=12)
        assert r.stats.n_prompt_decoded == len(inside)
        assert r.tokens == _fresh(tiny_mamba2_path, inside, 12, **kw).tokens


def test_the_cache_keeps_to_its_size(tiny_dense_path):
    with Engine(tiny_dense_path, n_slots=1, n_ctx=512, exact=True) as eng:
        eng.submit(A, max_tokens=4).result(60)
        eng.submit(B, max_tokens=4).result(60)
        one = eng.stats()["prompt_cache"]["bytes"]
    cap_mib = 1.5 * one / (1 << 20)
    with Engine(tiny_dense_path, n_slots=1, n_ctx=512, exact=True,
                prompt_cache_mib=cap_mib) as eng:
        for p in (A, B, C, _prompt(4)):
            eng.submit(p, max_tokens=4).result(60)
        st = eng.stats()["prompt_cache"]
        assert st["entries"] == 1 and 0 < st["bytes"] <= cap_mib * (1 << 20)
        h = eng.submit(C, max_tokens=4)       # the most recent one saved is kept
        h.result(60)
        assert h.n_prompt_decoded == 1
        h = eng.submit(A, max_tokens=4)       # the oldest was dropped
        h.result(60)
        assert h.n_prompt_decoded == len(A)


def test_short_prompts_are_not_saved(tiny_dense_path):
    with Engine(tiny_dense_path, n_slots=1, n_ctx=512) as eng:
        for p in (A[:MIN_TOKENS // 2], B):
            eng.submit(p, max_tokens=2).result(60)
        assert eng.stats()["prompt_cache"]["entries"] == 0


@pytest.mark.parametrize("bad", [-1, "1G", True, float("nan")])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="prompt cache size"):
        PromptCache(bad, recurrent=False)
