"""``"plain"`` means no drafter wherever a drafter spec is taken (the Decoder, ``generate``,
the Engine's ``drafters=`` and a request's ``drafter=``).

Found by the adversarial sweep: the Engine took ``drafter="plain"`` per request while
``Decoder(drafter="plain")`` (so ``specdec generate --drafter plain``) was refused as an
unknown drafter.
"""
import pytest

import specdec


@pytest.mark.parametrize("spec", ["plain", ["plain"], ("plain",)])
def test_decoder_plain_is_no_drafter(tiny_dense, spec):
    with specdec.Decoder(tiny_dense, drafter=spec, n_ctx=64) as dec, \
            specdec.Decoder(tiny_dense, n_ctx=64) as ref:
        assert dec.drafters == []
        got = dec.generate([1, 2, 3], max_tokens=8)
        assert got.tokens == ref.generate([1, 2, 3], max_tokens=8).tokens


def test_engine_drafters_plain_is_none(tiny_dense):
    with specdec.Engine(tiny_dense, drafters="plain", n_slots=1, n_ctx=64) as eng:
        assert eng.drafters == {}
        assert eng.submit([1, 2, 3], max_tokens=4).result(timeout=60).tokens


def test_plain_cannot_be_chained(tiny_dense):
    with pytest.raises(ValueError, match="'plain' means no drafter: it cannot be chained"):
        specdec.Decoder(tiny_dense, drafter=["ngram", "plain"], n_ctx=64)


def test_a_request_may_name_plain_in_a_list(tiny_dense_path):
    """A request's ``drafter=["plain"]`` is plain decoding, as ``"plain"`` is (one rule,
    ``_setup.as_list``); chained with a drafter it is refused."""
    import pytest as _pytest
    from specdec import Engine
    with Engine(tiny_dense_path, drafters=["ngram"], n_slots=1, n_ctx=128) as eng:
        r = eng.submit([5, 6, 7, 8] * 4, max_tokens=6, drafter=["plain"]).result(60)
        assert r.stats.drafted == 0
        with _pytest.raises(ValueError, match="plain"):
            eng.submit([5, 6], max_tokens=2, drafter=["plain", "ngram"])
