"""Files that used to kill the process: each now raises a Python exception, in this process.

One test per kind of file an independent fuzz found llama.cpp aborting on (issue 17).
Each is a self-consistent edit of a valid synthetic file (or of Gemma's header), loaded
and used the way a user would: ``Model(path)``, then a Decoder that generates. Some are
stopped by the pre-checks (``_gguf_check``: the asserts that sit in ggml's compute threads,
where no exception can unwind), the rest by the abort-to-exception conversion
(``_abort.h``: asserts on the calling thread, at load, context creation and decode).
"""
from __future__ import annotations

import dataclasses
import math

import pytest

import specdec
from specdec import Decoder, GGUFError, LlamaAbortError, Model
from specdec.testing import write_tiny_dense, write_tiny_qwen35
from specdec.testing.tiny import TINY_QWEN35
from specdec.testing.gguf_fuzz import dump, load

#: what a bad file may raise: anything but a dead process
RAISES = (GGUFError, LlamaAbortError, ValueError)


def _retype(m, name, new_type, nbytes):
    t = next(x for x in m.tensors if x.name == name)
    t.type = new_type
    t.data = (t.data * (nbytes // max(1, len(t.data)) + 1))[:nbytes]


def empty_token_collision(m):
    toks = m.find("tokenizer.ggml.tokens").value
    toks[5] = ""
    toks[6] = "[EMPTY_5]"    # llama.cpp renames an empty token to this, then finds it twice


def rope_scaling(value):
    def edit(m):
        m.put(f"{m.arch}.rope.scaling.type", 8, value)
    return edit


def experts_without_used(m):
    m.put(f"{m.arch}.expert_count", 4, 4)


def expert_groups_on_dense(m):
    m.put(f"{m.arch}.expert_group_count", 4, 1)


def alignment_one(m):
    m.alignment = 1
    m.put("general.alignment", 4, 1)


def t5_tokenizer_with_bos(m):
    m.put("tokenizer.ggml.model", 8, "t5")
    m.put("tokenizer.ggml.add_bos_token", 7, True)
    m.kv = [e for e in m.kv if e.key != "tokenizer.ggml.bos_token_id"]


def bert_tokenizer(m):
    m.put("tokenizer.ggml.model", 8, "bert")


def rwkv_tokenizer(m):
    """RWKV over tokens "tok_0".."tok_255": 't' begins tokens but is none itself."""
    m.put("tokenizer.ggml.model", 8, "rwkv")


def tensor_type(suffix, new_type):
    """Every tensor named ``*suffix`` retyped (data resized to the new type's bytes)."""
    sizes = {1: (1, 2), 30: (1, 2), 15: (256, 292), 9: (32, 36), 26: (1, 4), 28: (1, 8)}

    def edit(m):
        blck, tsize = sizes[new_type]
        hit = False
        for t in m.tensors:
            if t.name.endswith(suffix):
                _retype(m, t.name, new_type, math.prod(t.dims) // blck * tsize)
                hit = True
        assert hit, suffix
    return edit


def last_tensor_type(new_type, tsize, blck):
    def edit(m):
        cands = [t for t in m.tensors if len(t.dims) >= 2 and t.dims[0] % blck == 0]
        t = cands[-1]
        _retype(m, t.name, new_type, math.prod(t.dims) // blck * tsize)
    return edit


def qwen35(**dims):
    """A qwen35 file written with these hyperparameters (tensors shaped to match)."""
    return dataclasses.replace(TINY_QWEN35, checked=False, **dims)


def unchanged(m):
    pass


def odd_swa_rope(m):
    m.put(f"{m.arch}.rope.dimension_count_swa", 4, 7)


KINDS = {
    # id: (base, edit)
    "01-empty-token-collides": ("dense", empty_token_collision),
    "02-rope-scaling-bogus": ("dense", rope_scaling("bogus")),
    "02-rope-scaling-empty": ("qwen35", rope_scaling("")),
    "03-experts-without-used-count": ("dense", experts_without_used),
    "04-expert-groups-dense": ("dense", expert_groups_on_dense),
    "04-expert-groups-qwen35": ("qwen35", expert_groups_on_dense),
    "05-alignment-1": ("dense", alignment_one),
    "06-t5-tokenizer-add-bos": ("dense", t5_tokenizer_with_bos),
    "07-bert-tokenizer-64-tokens": ("dense64", bert_tokenizer),
    "08-ssm-conv-f16": ("qwen35", tensor_type("ssm_conv1d.weight", 1)),
    "08-ssm-conv-bf16": ("qwen35", tensor_type("ssm_conv1d.weight", 30)),
    "09-q8_k-weight": ("qwen35", tensor_type("blk.0.ffn_down.weight", 15)),
    "10-q8_1-last-tensor": ("dense", last_tensor_type(9, 36, 32)),
    "11-value-head-differs": (qwen35(head_dim_v=16), unchanged),
    "12-groups-not-dividing-rank": (qwen35(ssm_groups=3, ssm_v_heads=4), unchanged),
    "13-attention-interval-1": (qwen35(full_attention_interval=1), unchanged),
    "13-attention-interval-5": (qwen35(full_attention_interval=5), unchanged),
    "13-attention-interval-100": (qwen35(full_attention_interval=100), unchanged),
    "13-one-layer": (qwen35(n_layer=1), unchanged),
    # found by the long fuzz: a hang, not a death (the tokenizer restarts from position 0)
    "16-rwkv-tokenizer-never-ends": ("dense", rwkv_tokenizer),
    "15-i32-matrix": ("dense", tensor_type("blk.1.attn_k.weight", 26)),
    "15-f64-embedding": ("dense", tensor_type("token_embd.weight", 28)),
    "15-bf16-conv-moe": ("qwen35moe", tensor_type("ssm_conv1d.weight", 30)),
}


@pytest.fixture(scope="module")
def bases(model_file, tiny_dense_path, tiny_qwen35_path):
    from specdec.testing import write_tiny_qwen35
    return {
        "dense": tiny_dense_path,
        "dense64": model_file("tiny-dense-64.gguf", lambda p: write_tiny_dense(p, n_vocab=64)),
        "qwen35": tiny_qwen35_path,
        "qwen35moe": model_file("tiny-qwen35moe.gguf",
                                lambda p: write_tiny_qwen35(p, arch="qwen35moe")),
    }


def use(path, *, mtp=False):
    """Load and generate as a user would; returns the text."""
    dec = Decoder(path, drafter="mtp" if mtp else "ngram", n_ctx=128)
    return dec.generate("hello", max_tokens=4).text


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bad_file_raises(kind, bases, tmp_path):
    base, edit = KINDS[kind]
    if not isinstance(base, str):
        base_path = tmp_path / "base.gguf"
        write_tiny_qwen35(base_path, dims=base)
        base = str(base_path)
    m = load(open(bases.get(base, base), "rb").read())
    edit(m)
    p = tmp_path / f"{kind}.gguf"
    p.write_bytes(dump(m))
    with pytest.raises(RAISES) as ei:
        Model(p).tokenize("tok_1 tok_2")
        use(p)
        if m.arch in specdec._archs.MTP_ARCHS:
            use(p, mtp=True)
    assert str(ei.value)
    # the process goes on: a good model still loads and generates
    assert isinstance(use(bases["dense"]), str)


def test_odd_swa_rope_on_gemma_header(gemma_path, tmp_path):
    """Kind 14: Gemma 3 with an odd rope.dimension_count_swa (a compute-thread assert)."""
    m = load(open(gemma_path, "rb").read())
    odd_swa_rope(m)
    p = tmp_path / "gemma-odd-swa-rope.gguf"
    p.write_bytes(dump(m))
    with pytest.raises(GGUFError, match="rope.dimension_count_swa"):
        Model(p)
