"""Synthetic models of odd shapes load and decode, or refuse with a clear error: vocabularies
of 2 to 7 tokens (as short as the block count), no BOS or EOS token, recurrent and hybrid
archs, a training context of 8 tokens.

The layer-skip draft of a model whose vocabulary is as long as its block count had its
token list cut to the kept layers (a per-layer array, by its length), and loading it failed
in llama.cpp's tensor checks.
"""
import pytest

import specdec
from specdec import testing as T
from specdec.drafters.layerskip import derive_layerskip_gguf
from specdec.testing import tiny

ODD = {
    "dense-vocab2": lambda p: T.write_tiny_dense(p, n_vocab=2),
    "gemma3-vocab3": lambda p: T.write_tiny_gemma3(p, dims=tiny.Gemma3Dims(n_vocab=3)),
    "mamba2-vocab5": lambda p: T.write_tiny_mamba2(p, n_vocab=5),
    "qwen35-vocab7": lambda p: T.write_tiny_qwen35(p, n_vocab=7),
    "dense-ctx8": lambda p: T.write_tiny_dense(p, dims=tiny.LlamaDims(n_ctx_train=8)),
}


@pytest.mark.parametrize("name", ODD)
def test_odd_model_decodes_plain_speculative_and_batched(model_file, name):
    path = model_file(f"odd-{name}.gguf", ODD[name])
    model = specdec.Model(path)
    assert model.bos == -1 and model.eos == -1
    prompt = [i % model.n_vocab for i in (1, 0, 1, 0, 1, 1)]
    with specdec.Decoder(model, n_ctx=32) as plain:
        ref = plain.generate(prompt, max_tokens=12)
    assert ref.finish_reason == "length" and all(0 <= t < model.n_vocab for t in ref.tokens)
    with specdec.Decoder(model, drafter="ngram:1", n_max=3, n_ctx=32) as dec:
        assert dec.generate(prompt, max_tokens=12).tokens == ref.tokens
        # the context fills up with drafts in flight
        assert dec.generate(prompt, max_tokens=100).finish_reason == "context"
    with specdec.Engine(model, drafters=["ngram:1"], n_slots=3, n_ctx=12) as engine:
        hs = [engine.submit(prompt[: 2 + i], max_tokens=20,
                            sampling=None if i % 2 else dict(temperature=1.0, seed=i))
              for i in range(4)]
        assert {h.result(timeout=120).finish_reason for h in hs} == {"context"}
    with pytest.raises(ValueError, match="end-of-generation token"):
        specdec.Decoder(model, n_ctx=32).generate(prompt, max_tokens=4, regex="a")


@pytest.mark.parametrize("name, n_layers", [("dense-vocab2", 1), ("gemma3-vocab3", 2)])
def test_layerskip_keeps_a_vocabulary_as_long_as_the_block_count(model_file, tmp_path, name,
                                                                 n_layers):
    path = model_file(f"odd-{name}.gguf", ODD[name])
    out = derive_layerskip_gguf(path, n_layers, tmp_path / "draft.gguf")
    draft = specdec.Model(out)
    target = specdec.Model(path)
    assert draft.n_vocab == target.n_vocab and draft.n_layer == n_layers
    with specdec.Decoder(target, drafter=f"draft:{out}", n_max=2, n_ctx=32) as dec:
        res = dec.generate([1, 0, 1], max_tokens=8)
    assert res.stats.drafted > 0 and len(res.tokens) == 8


def test_layerskip_of_a_one_layer_target_says_it_needs_two(tmp_path):
    from specdec.testing.tiny import LlamaDims, write_tiny_dense
    path = write_tiny_dense(tmp_path / "one-layer.gguf", dims=LlamaDims(n_layer=1))
    with pytest.raises(ValueError, match="has 1 layer; .* needs 2 or more"):
        derive_layerskip_gguf(path, 1, tmp_path / "draft.gguf")
