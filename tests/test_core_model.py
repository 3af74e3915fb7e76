"""Model loading, metadata, tokenizer, and load errors that must not kill the process."""
import os

import pytest

import specdec


def test_gemma_metadata(gemma):
    assert gemma.arch == "gemma3"
    assert gemma.n_vocab == 262144
    assert gemma.n_layer == 18 and gemma.n_mtp_layers == 0
    assert gemma.n_embd == 640
    assert gemma.n_swa > 0
    assert gemma.add_bos and gemma.bos >= 0 and gemma.eos >= 0
    assert gemma.eos in gemma.eog_tokens
    assert not gemma.supports_mtp and not gemma.has_mtp_graph
    assert gemma.supports_partial_rollback
    assert "gemma3" in gemma.description
    assert gemma.chat_template is None or isinstance(gemma.chat_template, str)


def test_tokenizer_roundtrip(gemma):
    text = "Hello, world! Ünïcödé — 你好"
    toks = gemma.tokenize(text)
    assert toks[0] == gemma.bos
    assert gemma.detokenize(toks[1:]) == text
    assert b"".join(gemma.token_to_piece(t) for t in toks[1:]).decode() == text
    assert gemma.tokenize(text, add_special=False) == toks[1:]
    assert gemma.tokenize("") == [gemma.bos]
    assert gemma.tokenize(text.encode()) == toks


def test_special_tokens(gemma):
    # parse_special turns control text into the control token
    assert gemma.tokenize("<eos>", add_special=False, parse_special=True) == [gemma.eos]
    assert gemma.tokenize("<eos>", add_special=False) != [gemma.eos]
    assert gemma.is_control(gemma.bos) and gemma.is_eog(gemma.eos)
    assert gemma.token_text(gemma.eos) == "<eos>"


@pytest.mark.parametrize("bad", [-1, 262144, 10**12])
def test_tokenizer_rejects_bad_ids(gemma, bad):
    with pytest.raises(ValueError, match="out of range"):
        gemma.token_to_piece(bad)
    with pytest.raises(ValueError, match="out of range"):
        gemma.detokenize([1, bad])
    with pytest.raises(TypeError):
        gemma.detokenize(["a"])
    assert gemma.detokenize([818]) != ""  # still usable


def test_vocab_compatible(gemma, tiny_dense, tiny_qwen35):
    assert gemma.vocab_compatible(gemma)
    assert not gemma.vocab_compatible(tiny_dense)
    assert tiny_dense.vocab_compatible(tiny_qwen35)  # same synthetic test vocab


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        specdec.Model(tmp_path / "nope.gguf")


def test_directory(tmp_path):
    with pytest.raises(IsADirectoryError):
        specdec.Model(tmp_path)


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"this is not a model at all" * 10)
    with pytest.raises(ValueError, match="not a GGUF"):
        specdec.Model(p)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(ValueError, match="not a GGUF"):
        specdec.Model(p)


@pytest.mark.parametrize("frac", [0.0005, 0.3, 0.9])
def test_truncated_gguf(tmp_path, tiny_dense_path, frac):
    data = open(tiny_dense_path, "rb").read()
    p = tmp_path / "trunc.gguf"
    p.write_bytes(data[: max(24, int(len(data) * frac))])
    with pytest.raises(ValueError):
        specdec.Model(p)


def test_corrupt_header_counts(tmp_path, tiny_dense_path):
    data = bytearray(open(tiny_dense_path, "rb").read())
    data[8:16] = (2**62).to_bytes(8, "little")  # absurd tensor count
    p = tmp_path / "bad.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt GGUF header"):
        specdec.Model(p)


def test_failed_load_says_why(tmp_path, tiny_dense_path):
    data = open(tiny_dense_path, "rb").read()
    p = tmp_path / "trunc.gguf"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="failed to load model"):
        specdec.Model(p)


def test_mtp_flags(tiny_qwen35_path, tiny_qwen35_nomtp_path):
    with_mtp = specdec.Model(tiny_qwen35_path, load_mtp=True)
    assert with_mtp.arch == "qwen35" and with_mtp.n_mtp_layers == 1
    assert with_mtp.supports_mtp and with_mtp.has_mtp_graph and with_mtp.is_hybrid
    assert with_mtp.supports_partial_rollback
    not_loaded = specdec.Model(tiny_qwen35_path, load_mtp=False)
    assert not_loaded.has_mtp_graph and not not_loaded.supports_mtp
    no_layers = specdec.Model(tiny_qwen35_nomtp_path, load_mtp=True)
    assert no_layers.n_mtp_layers == 0 and not no_layers.supports_mtp


#: ggml's CPU feature names and the /proc/cpuinfo flag each needs (x86)
_X86_FLAGS = {"SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX2": "avx2", "F16C": "f16c",
              "FMA": "fma", "BMI2": "bmi2", "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi",
              "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16", "AVX_VNNI": "avx_vnni",
              "AMX_INT8": "amx_int8"}


def test_system_info_reports_cpu_features_the_cpu_has():
    """The CPU backend lists what it was built with; each feature must be one this CPU runs
    (an instruction it lacks would fault at the first matmul). Checked where /proc/cpuinfo
    names the x86 flags; elsewhere only the listing's shape."""
    import platform
    import re

    info = specdec.system_info()
    cpu_line = next((ln for ln in info.splitlines() if ln.startswith("CPU :")), None)
    assert cpu_line is not None, info
    features = set(re.findall(r"(\w+) = 1", cpu_line))
    assert features, cpu_line
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    if m is None or platform.machine() not in ("x86_64", "AMD64"):
        return
    have = set(m.group(1).split())
    lacking = sorted(f for f in features if f in _X86_FLAGS and _X86_FLAGS[f] not in have)
    assert not lacking, (lacking, cpu_line)
    assert features & set(_X86_FLAGS), cpu_line    # an x86 build uses some SIMD
