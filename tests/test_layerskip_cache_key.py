"""The layer-skip draft's cache key holds its format: a draft derived before a fix to what it
holds (d266f9e: a vocabulary as long as the block count was cut) is not reused."""
from specdec import cache
from specdec.drafters.layerskip import derive_layerskip_gguf


def test_draft_derived_before_the_format_is_not_reused(tiny_dense_path):
    before = cache.derived_path("layerskip", "L1",
                                cache.content_key(tiny_dense_path, "layerskip", 1))
    got = derive_layerskip_gguf(tiny_dense_path, 1)
    assert got != before and got.exists()
    assert derive_layerskip_gguf(tiny_dense_path, 1) == got
