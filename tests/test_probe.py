"""The child-process probe (specdec.check_model, Model(check="isolated"))."""
from __future__ import annotations

import os
import sys
import time

import pytest

import specdec
from specdec import GGUFError, Model, check_model, probe
from specdec.testing.gguf_fuzz import dump, load


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))


def _f16_conv(src, dst):
    """A file whose ssm_conv weights are f16: ggml asserts on it inside its compute threads."""
    m = load(open(src, "rb").read())
    for t in m.tensors:
        if t.name.endswith("ssm_conv1d.weight"):
            t.type, t.data = 1, t.data[: len(t.data) // 2]
    dst.write_bytes(dump(m))
    return dst


@pytest.fixture
def child_without_prechecks(tmp_path, monkeypatch):
    """The probe's child with the pre-checks off: the file reaches the compute-thread assert,
    which stands for whatever the pre-checks do not foresee."""
    wrapper = tmp_path / "child.py"
    wrapper.write_text(
        "import sys, specdec._core as c\n"
        "c._check_gguf_file = lambda path: None\n"
        "from specdec import probe\n"
        "sys.exit(probe.main(sys.argv[1:]))\n")
    monkeypatch.setattr(probe, "_CHILD_CMD", [sys.executable, str(wrapper)])


def test_good_file_passes_and_is_cached(tiny_qwen35_path, tmp_path):
    t0 = time.perf_counter()
    assert check_model(tiny_qwen35_path) == "qwen35"
    first = time.perf_counter() - t0
    verdicts = list((tmp_path / "cache" / "probe").iterdir())
    assert len(verdicts) == 1 and probe.file_digest(tiny_qwen35_path) in verdicts[0].name
    t0 = time.perf_counter()
    assert check_model(tiny_qwen35_path) == "qwen35"
    assert time.perf_counter() - t0 < first / 4   # no child the second time
    m = Model(tiny_qwen35_path, check="isolated")
    assert m.arch == "qwen35"


#: an F16 conv weight in the probe's child: ggml's assert kills it, or the graph check refuses
DIES_OR_REFUSED = (r"killed by SIGABRT.*GGML_ASSERT\(src1->nb\[0\] == sizeof\(float\)\)"
                   r"|ssm_conv1d.weight' \(f16\) feeds node .*that op takes f32 weights only")


def test_child_death_becomes_gguf_error(tiny_qwen35_path, tmp_path, child_without_prechecks):
    bad = _f16_conv(tiny_qwen35_path, tmp_path / "f16-conv.gguf")
    # the child dies on ggml's assert, unless the context's graph check (which knows the op
    # takes f32 weights only) refuses the file first, as it now does: either way a GGUFError
    with pytest.raises(GGUFError, match=DIES_OR_REFUSED):
        check_model(bad)
    # the verdict is cached: the second call answers without a child
    probe._CHILD_CMD = [sys.executable, "-c", "raise SystemExit(3)"]
    with pytest.raises(GGUFError, match=DIES_OR_REFUSED):
        check_model(bad)
    assert len(list((tmp_path / "cache" / "probe").iterdir())) == 1
    # the verdict is by content: a copy elsewhere is known; the same path edited is not
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(bad.read_bytes())
    with pytest.raises(GGUFError, match=DIES_OR_REFUSED):
        check_model(copy)


def test_model_isolated_raises_before_loading(tiny_qwen35_path, tmp_path, child_without_prechecks):
    bad = _f16_conv(tiny_qwen35_path, tmp_path / "f16-conv.gguf")
    # the in-process pre-check rejects it first anyway; with it off, the probe is what stops it
    import specdec._core as core
    orig = core._check_gguf_file
    core._check_gguf_file = lambda path: None
    try:
        with pytest.raises(GGUFError, match=DIES_OR_REFUSED):
            Model(bad, check="isolated")
    finally:
        core._check_gguf_file = orig


def test_rejection_in_child_is_a_verdict(tiny_dense_path, tmp_path):
    m = load(open(tiny_dense_path, "rb").read())
    m.find("llama.block_count").value = 0
    p = tmp_path / "zero-layers.gguf"
    p.write_bytes(dump(m))
    with pytest.raises(GGUFError, match="rejected in the probe: GGUFError.*block_count"):
        check_model(p)


def test_timeout_is_not_cached(tiny_dense_path, tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "_CHILD_CMD", [sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(GGUFError, match="did not finish"):
        check_model(tiny_dense_path, timeout=1)
    assert not (tmp_path / "cache" / "probe").exists()


def test_check_argument_validated(tiny_dense_path):
    with pytest.raises(ValueError, match="check must be"):
        Model(tiny_dense_path, check="paranoid")
    with pytest.raises(FileNotFoundError):
        check_model(os.path.join(os.path.dirname(tiny_dense_path), "missing.gguf"))


def test_check_model_of_a_directory_says_so(tmp_path):
    # found by the adversarial sweep: a directory was "model file not found"
    with pytest.raises(IsADirectoryError, match="model path is a directory, not a GGUF file"):
        check_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="model file not found"):
        check_model(tmp_path / "missing.gguf")
