"""The scheduler core both front doors drive: the same requests give the same tokens, the
same counters and the same prompt-cache hits on a Decoder (inline) and on an Engine (its
worker thread), and a server request is one checked ``Request`` all the way down."""
import random

import pytest

from specdec import Decoder, Engine
from specdec._request import Request
from specdec.serve.protocol import completion_spec, requests


def _prompt(seed, n=40):
    rng = random.Random(seed)
    return [rng.randrange(2, 250) for _ in range(n)]


#: a repetitive prompt (the n-gram drafter finds drafts) and two that are not
PROMPTS = [[5, 6, 7, 8] * 10, _prompt(1), _prompt(2)]
#: the counters of a request that do not depend on timing
COUNTS = ("n_prompt", "n_prompt_decoded", "n_generated", "rounds", "draft_rounds", "drafted",
          "accepted", "drafted_per_position", "accepted_per_position")


def _counts(res):
    return {k: getattr(res.stats, k) for k in COUNTS}


def test_decoder_and_engine_give_the_same_results_and_stats(tiny_dense_path):
    """One request at a time, exact mode: tokens, finish reasons and every counter of each
    request agree between the doors, and so do the totals the core keeps over them."""
    opts = dict(n_ctx=256, n_max=3, exact=True, prompt_cache_mib=0)
    with Decoder(tiny_dense_path, drafter="ngram", **opts) as dec, \
            Engine(tiny_dense_path, drafters=["ngram"], n_slots=1, **opts) as eng:
        for p in PROMPTS:
            a = dec.generate(p, max_tokens=24)
            b = eng.submit(p, max_tokens=24).result(60)
            assert (a.tokens, a.finish_reason) == (b.tokens, b.finish_reason)
            assert _counts(a) == _counts(b)
            assert a.stats.drafted > 0 or p is not PROMPTS[0]
        keys = ("requests", "n_prompt", "n_prompt_decoded", "n_generated", "drafted",
                "accepted", "drafted_per_position", "accepted_per_position")
        dec_totals, eng_totals = dec._core.stats(), eng.stats()
        assert {k: dec_totals[k] for k in keys} == {k: eng_totals[k] for k in keys}
        assert eng_totals["requests"] == len(PROMPTS) and eng_totals["drafted"] > 0


def test_a_stream_and_a_batch_give_what_generate_gives(tiny_dense_path):
    """The Decoder's stream reads the pieces the core delivers each round; its batch runs
    its requests together: both end where ``generate`` ends, with the same text."""
    with Decoder(tiny_dense_path, drafter="ngram", n_ctx=512, n_seq_max=3, exact=True) as dec:
        alone = [dec.generate(p, max_tokens=20) for p in PROMPTS]
        st = dec.stream(PROMPTS[0], max_tokens=20)
        pieces = list(st.pieces())
        assert [t for p in pieces for t in p.tokens] == alone[0].tokens
        assert "".join(p.text for p in pieces) == st.result.text == alone[0].text
        batch = dec.generate_batch(PROMPTS, max_tokens=20)
        assert [r.tokens for r in batch] == [r.tokens for r in alone]


def test_prompt_cache_hits_on_both_doors(tiny_dense_path):
    """A prompt that comes back after another took its only slot is restored from the
    prompt cache, on the Decoder as on the Engine: the same hit, the same tokens."""
    a, b = _prompt(3, 48), _prompt(4, 48)
    opts = dict(n_ctx=512, exact=True, prompt_cache_mib=64)
    got = {}
    with Decoder(tiny_dense_path, **opts) as dec, \
            Engine(tiny_dense_path, n_slots=1, **opts) as eng:
        for name, run in (("decoder", lambda p: dec.generate(p, max_tokens=8)),
                          ("engine", lambda p: eng.submit(p, max_tokens=8).result(60))):
            first = run(a)
            run(b)
            again = run(a)
            assert again.tokens == first.tokens
            assert again.stats.n_prompt_decoded == 1     # its last token, for the logits
            got[name] = (again.tokens, again.stats.n_prompt_decoded)
        assert dec.prompt_cache.stats()["hits"] == eng.prompt_cache.stats()["hits"] == 1
    assert got["decoder"] == got["engine"]


def test_a_server_request_is_one_checked_request(tiny_dense_path):
    """The server's body becomes ``Request`` records once (a choice each, the ``specdec``
    extension's drafter and draft cap resolved by the core), and the Engine runs them as
    they are: the tokens of the keyword API's request."""
    with Engine(tiny_dense_path, drafters=["ngram"], n_slots=2, n_ctx=256, n_max=4) as eng:
        body = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "n": 2,
                "specdec": {"drafter": "plain"}}
        reqs = requests(completion_spec(body, ["m"]), eng._core, None)
        assert len(reqs) == 2 and all(isinstance(r, Request) for r in reqs)
        assert all(r.drafters == () and r.n_max == 0 for r in reqs)
        assert reqs[0].prompt == PROMPTS[0] and reqs[0].max_tokens == 12
        from specdec.handles import RequestHandle
        via_server = [RequestHandle(eng._enqueue(r)).result(60).tokens for r in reqs]
        direct = eng.submit(PROMPTS[0], max_tokens=12, drafter="plain").result(60).tokens
        assert via_server == [direct, direct]
        capped = requests(completion_spec(dict(body, specdec={"n_max": 2}), ["m"]),
                          eng._core, None)
        assert capped[0].drafters == (eng.drafters["ngram"],) and capped[0].n_max == 2
        with pytest.raises(ValueError, match="unknown drafter 'nope'"):
            requests(completion_spec(dict(body, specdec={"drafter": "nope"}), ["m"]),
                     eng._core, None)
