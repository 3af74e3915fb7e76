"""Prefix reuse: a prompt that extends what a slot still holds decodes only the new tokens."""
import pytest

import specdec
from specdec import Decoder, Engine

TURNS = [[1, 11, 52, 97, 140, 9, 9], [30, 31, 32, 33], [200, 13, 200, 13, 7]]


def _conversation(dec_or_engine, generate, fresh):
    """Three turns; each prompt is the last prompt, its answer and the new user tokens."""
    prompt, out = [], []
    for user in TURNS:
        prompt = prompt + out + user
        res, n_decoded = generate(prompt)
        # the answer's last token was sampled, never decoded: it is decoded with the new turn
        held = 0 if not out else len(prompt) - len(user) - 1
        assert n_decoded == len(prompt) - held
        assert res.tokens == fresh(prompt).tokens
        out = res.tokens
    return out


@pytest.mark.parametrize("drafter", [None, "ngram", "suffix"])
def test_decoder_three_turns_decode_only_new_tokens(tiny_dense_path, drafter):
    dec = Decoder(tiny_dense_path, drafter=drafter, exact=True, n_ctx=512)
    fresh = Decoder(tiny_dense_path, exact=True, n_ctx=512, prefix_reuse=False)

    def gen(p):
        r = dec.generate(p, max_tokens=20)
        return r, r.stats.n_prompt_decoded

    _conversation(dec, gen, lambda p: fresh.generate(p, max_tokens=20))
    # no reuse: the whole prompt every time
    r = fresh.generate(TURNS[0], max_tokens=5)
    assert r.stats.n_prompt_decoded == len(TURNS[0])


def test_a_prompt_that_diverges_reuses_the_common_prefix(tiny_dense_path):
    dec = Decoder(tiny_dense_path, exact=True, n_ctx=512)
    a = dec.generate(TURNS[0] + [5, 6, 7], max_tokens=5)
    b = dec.generate(TURNS[0] + [8, 9], max_tokens=5)
    assert b.stats.n_prompt_decoded == 2
    # the same prompt again: its last token is decoded again (for its logits)
    c = dec.generate(TURNS[0] + [8, 9], max_tokens=5)
    assert c.stats.n_prompt_decoded == 1 and c.tokens == b.tokens
    assert a.tokens == Decoder(tiny_dense_path, exact=True, n_ctx=512).generate(
        TURNS[0] + [5, 6, 7], max_tokens=5).tokens


def test_recurrent_target_reuses_only_where_its_state_ends(tiny_mamba2_path):
    dec = Decoder(tiny_mamba2_path, drafter="ngram", n_max=3, n_ctx=512)
    fresh = Decoder(tiny_mamba2_path, drafter="ngram", n_max=3, n_ctx=512, prefix_reuse=False)
    r1 = dec.generate(TURNS[0], max_tokens=12)
    p2 = TURNS[0] + r1.tokens + TURNS[1]
    r2 = dec.generate(p2, max_tokens=12)
    assert r2.stats.n_prompt_decoded == len(TURNS[1]) + 1
    assert r2.tokens == fresh.generate(p2, max_tokens=12).tokens
    # a prompt that leaves the held sequence before its end cannot use the state: all of it
    p3 = TURNS[0] + [3, 3, 3]
    r3 = dec.generate(p3, max_tokens=12)
    assert r3.stats.n_prompt_decoded == len(p3)
    assert r3.tokens == fresh.generate(p3, max_tokens=12).tokens


def test_engine_three_turns_decode_only_new_tokens(tiny_dense_path):
    with Engine(tiny_dense_path, drafters=["ngram"], n_slots=3, n_ctx=512, exact=True) as eng:
        # other conversations hold the other slots: the engine finds the right one
        others = [eng.submit([9, 8, 7, 6, 5, 4 + i], max_tokens=8) for i in range(2)]
        for h in others:
            h.result(60)
        fresh = Decoder(tiny_dense_path, exact=True, n_ctx=512, prefix_reuse=False)

        def gen(p):
            h = eng.submit(p, max_tokens=20)
            return h.result(60), h.n_prompt_decoded

        _conversation(eng, gen, lambda p: fresh.generate(p, max_tokens=20))
