"""Malformed GGUF files: a Python exception with a clear message, never a crashed process.

The fuzz test runs mutated files in child processes (``specdec.testing.gguf_fuzz``), so
a crash is counted instead of killing pytest. CI runs a short campaign; set
``SPECDEC_FUZZ_FILES`` for a long one (``SPECDEC_FUZZ_FILES=2000 pytest
tests/test_fuzz_gguf.py``). The regression tests below are the crashes the fuzzer found
before ``specdec._gguf_check`` existed, one per cause, checked without llama.cpp.
"""
import os
import re
import time

import pytest

import specdec
from specdec._gguf_check import check_gguf, check_layout
from specdec._gguf_layout import GGUFError, parse_gguf
from specdec.testing import gguf_fuzz
from specdec.testing.gguf_fuzz import dump, load

N_FILES = int(os.environ.get("SPECDEC_FUZZ_FILES", "150"))
#: mutated files of the newer targets and of every drafter family (the test below)
N_FAMILY_FILES = int(os.environ.get("SPECDEC_FUZZ_FAMILY_FILES", "60"))
SEED = int(os.environ.get("SPECDEC_FUZZ_SEED", "7"))


@pytest.fixture(scope="module")
def bigram_moe_path(model_file):
    from specdec.testing import write_bigram_mtp_model
    return model_file("bigram-tiny-moe.gguf", lambda p: write_bigram_mtp_model(p, arch="qwen35moe"))


def _assert_no_death_nor_hang(rep, n_files):
    print("\n" + rep.summary())
    assert not rep.crashes, "a process died or hung:\n" + "\n".join(
        f"case {c['case']} ({c['exit']}): {c['mutation']} | {c['stderr']}" for c in rep.crashes)
    assert not rep.unclear, rep.unclear
    assert rep.cases == n_files


@pytest.mark.parametrize("n_files", [N_FILES], ids=lambda n: f"{n}-files")
def test_mutated_gguf_files_never_crash(n_files, tiny_dense_path, tiny_qwen35_path, bigram_moe_path):
    """Mutated synthetic files, and files generated with random hyperparameters."""
    rep = gguf_fuzz.run([tiny_dense_path, tiny_qwen35_path, bigram_moe_path, *gguf_fuzz.GENERATED],
                        n_files, seed=SEED, batch=max(50, n_files // 4), case_timeout=120)
    _assert_no_death_nor_hang(rep, n_files)
    # both outcomes occur: the mutations are neither all fatal nor all harmless
    assert rep.loaded > 0 and sum(rep.errors.values()) > n_files // 2
    assert set(rep.errors) <= {"GGUFError", "ValueError", "LlamaAbortError"}, rep.errors


@pytest.fixture(scope="module")
def family_bases(model_file, tiny_mamba2_path, tiny_qwen3next_path, tiny_dense_path):
    """Bases of the recurrent and hybrid targets and of every drafter family; a drafter's
    mutated file is loaded as that drafter of its unmutated target (``ROLE:DRAFT@TARGET``)."""
    from specdec.testing import (write_bigram_mtp_model, write_dflash_draft, write_eagle3_draft,
                                 write_tiny_dense, write_tiny_rwkv7)
    rwkv7 = model_file("tiny-rwkv7.gguf", write_tiny_rwkv7)
    bigram = model_file("bigram-qwen35-n0.0.gguf", lambda p: write_bigram_mtp_model(p))
    periodic = model_file("bigram-qwen35-period16.gguf",
                          lambda p: write_bigram_mtp_model(p, period=16))
    eagle3 = model_file("eagle3-1.0.gguf", lambda p: write_eagle3_draft(p, bigram))
    dflash = model_file("dflash-1.0.gguf", lambda p: write_dflash_draft(p, periodic))
    draft = model_file("tiny-dense-draft.gguf", lambda p: write_tiny_dense(p, seed=5))
    return [tiny_mamba2_path, tiny_qwen3next_path, rwkv7, f"eagle3:{eagle3}@{bigram}",
            f"dflash:{dflash}@{periodic}", f"draft:{draft}@{tiny_dense_path}"]


@pytest.mark.parametrize("n_files", [N_FAMILY_FILES], ids=lambda n: f"{n}-files")
def test_mutated_families_never_crash_or_hang(n_files, family_bases):
    """mamba2, qwen3next and rwkv7 targets, EAGLE-3, DFlash and draft-model drafters: each
    mutated file in a child process, loaded and generated with; a death or a case past its
    time limit fails. ``SPECDEC_FUZZ_FAMILY_FILES=2000`` for the long campaign."""
    rep = gguf_fuzz.run(family_bases, n_files, seed=SEED, batch=max(30, n_files // 8),
                        case_timeout=60)
    _assert_no_death_nor_hang(rep, n_files)
    assert rep.loaded > 0 and sum(rep.errors.values()) > n_files // 4


def test_mutated_gemma_header_never_crashes(gemma_path, tmp_path):
    """Gemma's real header (262k-token SPM vocabulary, its hyperparameters and tensor infos)
    mutated, over zero weights (a sparse file: each case costs a header, not 250 MB)."""
    base = tmp_path / "gemma-zeros.gguf"
    with open(base, "wb") as f:
        gguf_fuzz.header_base(gemma_path).write(f)
    assert specdec.Model(base).arch == "gemma3"   # the unmutated base loads
    n = max(12, N_FILES // 10)
    rep = gguf_fuzz.run([f"header:{gemma_path}"], n, seed=SEED, batch=n, case_timeout=300)
    print("\n" + rep.summary())
    assert not rep.crashes, rep.crashes
    assert rep.cases == n


def test_mutation_roundtrip_and_determinism(tiny_qwen35_path):
    data = open(tiny_qwen35_path, "rb").read()
    assert dump(load(data)) == data
    assert gguf_fuzz.mutate(data, 3, 11) == gguf_fuzz.mutate(data, 3, 11)


# --- one regression test per crash the fuzzer found (llama.cpp aborted on each) -------


def _edited(path, edit):
    m = load(open(path, "rb").read())
    edit(m)
    return parse_gguf(dump(m), strings=False)


def _set(key, value, type_=None):
    def edit(m):
        e = m.find(key)
        e.value = value
        if type_ is not None:
            e.type = type_
    return edit


def _rename_arch(new):
    def edit(m):
        old = m.arch
        for e in m.kv:
            if e.key.startswith(old + "."):
                e.key = new + e.key[len(old):]
        m.find("general.architecture").value = new
    return edit


def _retype_tensor(name, t):
    def edit(m):
        x = next(x for x in m.tensors if x.name == name)
        x.type = t
        x.data = x.data[: len(x.data) // 2]   # f16: half the bytes
    return edit


CRASHES = {
    # cause: (base, edit, what llama.cpp did without the check, expected message)
    "empty vocabulary": ("dense", _set("tokenizer.ggml.tokens", []), "SIGFPE", "empty"),
    "duplicate token strings": ("dense", lambda m: m.find("tokenizer.ggml.tokens").value.__setitem__(
        5, m.find("tokenizer.ggml.tokens").value[6]),
        "GGML_ASSERT(id_to_token.size() == token_to_id.size())", "duplicate"),
    "f16 norm weight": ("qwen35", _retype_tensor("blk.0.post_attention_norm.weight", 1),
                        "binary_op: unsupported types", "must be f32"),
    "odd rope dims": ("qwen35", _set("qwen35.rope.dimension_count", 7),
                      "GGML_ASSERT(n_dims % 2 == 0)", "odd"),
    "rope dims above head size": ("qwen35", _set("qwen35.rope.dimension_count", 64),
                                  "GGML_ASSERT(n_dims <= ne0)", "exceeds the head size"),
    "negative rope section": ("qwen35", lambda m: m.find("qwen35.rope.dimension_sections").value.__setitem__(0, -2),
                              "SIGFPE", "dimension_sections"),
    "gated delta net width": ("qwen35", _set("qwen35.ssm.inner_size", 129),
                              "GGML_ASSERT(a->ne[d] == b->ne[d])", "inner_size"),
    "zero attention interval": ("qwen35", _set("qwen35.full_attention_interval", 0), "SIGFPE",
                                "full_attention_interval"),
    "jamba with the wrong ssm width": ("qwen35", _rename_arch("jamba"),
                                       "GGML_ASSERT(2 * n_embd == d_inner)", "2 * embedding_length"),
    "granitehybrid with the wrong ssm width": ("qwen35", _rename_arch("granitehybrid"),
                                               "GGML_ASSERT(2 * n_embd == d_inner)", "2 * embedding_length"),
    "moe without experts": ("qwen35", _rename_arch("qwen35moe"), "SIGFPE", "mixture of experts"),
    "too many layers": ("qwen35", _set("qwen35.block_count", 5120),
                        "GGML_ASSERT(hparams.n_layer_all > 0 && <= LLAMA_MAX_LAYERS)", "block_count"),
    "zero layers": ("dense", _set("llama.block_count", 0), "GGML_ASSERT(n_layer_all > 0)", "block_count"),
}


@pytest.mark.parametrize("cause", list(CRASHES))
def test_found_crash_is_rejected(cause, tiny_dense_path, tiny_qwen35_path):
    base, edit, _, match = CRASHES[cause]
    lay = _edited(tiny_dense_path if base == "dense" else tiny_qwen35_path, edit)
    with pytest.raises(GGUFError, match=re.escape(match)):
        check_layout(lay)


def test_model_reports_check_failure(tmp_path, tiny_dense_path):
    m = load(open(tiny_dense_path, "rb").read())
    m.find("llama.block_count").value = 0
    p = tmp_path / "zero-layers.gguf"
    p.write_bytes(dump(m))
    with pytest.raises(GGUFError, match=r"failed to load model .*block_count"):
        specdec.Model(p)
    assert issubclass(GGUFError, ValueError)


def test_valid_models_pass(tiny_dense_path, tiny_qwen35_path, bigram_moe_path, bigram_tiny_path):
    assert check_gguf(tiny_dense_path) == "llama"
    assert check_gguf(tiny_qwen35_path) == "qwen35"
    assert check_gguf(bigram_tiny_path) == "qwen35"
    assert check_gguf(bigram_moe_path) == "qwen35moe"


def test_check_cost_on_gemma(gemma_path):
    """The check memory-maps the file and walks only the metadata: small next to a load."""
    t0 = time.perf_counter()
    assert check_gguf(gemma_path) == "gemma3"
    t_check = time.perf_counter() - t0
    t0 = time.perf_counter()
    specdec.Model(gemma_path)
    t_load = time.perf_counter() - t0
    print(f"\ncheck {t_check * 1e3:.0f} ms, load (check included) {t_load * 1e3:.0f} ms")
    assert t_check < 1.0


def test_header_only_base_is_a_loadable_sparse_file(tiny_qwen35_path, tmp_path):
    raw = open(tiny_qwen35_path, "rb").read()
    head = gguf_fuzz.header_base(tiny_qwen35_path)
    out = dump(load(head))
    assert isinstance(out, gguf_fuzz.Sparse) and out.size == len(raw)
    assert bytes(out) == raw[:len(out)]
    p = tmp_path / "zeros.gguf"
    with open(p, "wb") as f:
        out.write(f)
    assert os.path.getsize(p) == len(raw)
    r = specdec.Decoder(str(p), n_ctx=64).generate([1, 2, 3], max_tokens=3)
    assert r.tokens and set(r.tokens) == {0}   # zero weights: every logit 0, argmax token 0


def test_generated_files_are_deterministic_and_varied():
    import random
    a = [gguf_fuzz.generate("gen:qwen35", random.Random(i))[0] for i in range(2)]
    assert a[0] == gguf_fuzz.generate("gen:qwen35", random.Random(0))[0]
    assert a[0] != a[1]
