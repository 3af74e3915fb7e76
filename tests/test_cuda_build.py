"""The CUDA build's detection (``tools/find_cuda.py``), run against fake toolkit and wheel
layouts: a toolkit with cuBLAS, one without it and NVIDIA's wheels beside it, one with
nothing, and the GPU architecture asked of nvidia-smi. The real CUDA build runs where a
toolkit is (``-Dcuda=true``); these run everywhere."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "find_cuda.py"


@pytest.fixture
def find_cuda(monkeypatch):
    """The detection module, blind to this machine's own toolkit (/usr/local/cuda): only the
    fake layouts of each test are seen."""
    if not TOOL.exists():
        pytest.skip("tools/ is not in this checkout")
    spec = importlib.util.spec_from_file_location("find_cuda", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "DEFAULT_ROOTS", ())
    return mod


def _touch(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"")
    return p


def _toolkit(root: Path, cublas: bool) -> Path:
    nvcc = _touch(root / "bin" / "nvcc")
    _touch(root / "lib64" / "libcudart.so")
    _touch(root / "include" / "cuda_runtime.h")
    if cublas:
        for lib in ("cublas", "cublasLt"):
            _touch(root / "lib64" / f"lib{lib}.so")
        _touch(root / "include" / "cublas_v2.h")
    return nvcc


def _wheel(site: Path, part: str = "cu13") -> Path:
    base = site / "nvidia" / part
    for lib in ("cublas", "cublasLt", "cudart"):
        _touch(base / "lib" / f"lib{lib}.so.13")
    for h in ("cublas_v2.h", "cublas_api.h", "cublas.h", "cublasLt.h", "cuda_runtime.h"):
        _touch(base / "include" / h)
    return base


ENV = {"CUDA_PATH": "", "CUDA_HOME": ""}


def test_a_toolkit_with_cublas_needs_no_wheel(find_cuda, tmp_path):
    nvcc = _toolkit(tmp_path / "cuda", cublas=True)
    got = find_cuda.find(str(nvcc), str(tmp_path / "b"), paths=[], env=ENV, arch="90")
    assert "missing" not in got and "include" not in got
    assert not [k for k in got if k.startswith("cmake:")]
    assert got["archs"] == "90"
    assert str((tmp_path / "cuda" / "lib64").resolve()) in got["rpath"].split(":")


def test_a_toolkit_without_cublas_takes_the_wheels(find_cuda, tmp_path):
    nvcc = _toolkit(tmp_path / "cuda", cublas=False)
    site = tmp_path / "site"
    wheel = _wheel(site)
    got = find_cuda.find(str(nvcc), str(tmp_path / "b"), paths=[str(site)], env=ENV,
                         arch=lambda: None)
    assert "missing" not in got
    assert got["cmake:CUDA_cublas_LIBRARY"] == str(wheel / "lib" / "libcublas.so.13")
    assert got["cmake:CUDA_cublasLt_LIBRARY"] == str(wheel / "lib" / "libcublasLt.so.13")
    assert "cmake:CUDA_cudart_LIBRARY" not in got          # the toolkit has it
    # only cuBLAS's headers are linked in: the wheel's newer cudart headers stay out
    inc = Path(got["include"])
    assert (inc / "cublas_v2.h").resolve() == (wheel / "include" / "cublas_v2.h").resolve()
    assert not (inc / "cuda_runtime.h").exists()
    # the installed extension looks beside itself in site-packages, then in the toolkit
    rpath = got["rpath"].split(":")
    assert rpath[0] == "$ORIGIN/../nvidia/cu13/lib"
    assert str((tmp_path / "cuda" / "lib64").resolve()) in rpath
    assert got["archs"] == find_cuda.DEFAULT_ARCHS        # no GPU here: the portable set


def test_cuda_path_comes_first_and_nothing_found_is_named(find_cuda, tmp_path):
    nvcc = _toolkit(tmp_path / "a", cublas=False)
    other = tmp_path / "b"
    _toolkit(other, cublas=False)
    got = find_cuda.find(str(nvcc), str(tmp_path / "bd"), paths=[],
                         env={"CUDA_PATH": str(other)}, arch="80")
    assert got["roots"].split(":")[:2] == [str(other), str(tmp_path / "a")]
    assert "cublas (nvidia-cublas)" in got["missing"]
    assert "cublas_v2.h" in got["missing"]


def test_gpu_arch_from_nvidia_smi(find_cuda, monkeypatch):
    monkeypatch.setattr(find_cuda.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    def run(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 0, stdout="9.0\n9.0\n", stderr="")
    assert find_cuda.gpu_arch(run=run) == "90"

    def broken(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 9, stdout="NVIDIA-SMI has failed\n", stderr="")
    assert find_cuda.gpu_arch(run=broken) is None
    monkeypatch.setattr(find_cuda.shutil, "which", lambda name: None)
    assert find_cuda.gpu_arch(run=run) is None


def test_the_script_prints_what_meson_reads(find_cuda, tmp_path):
    nvcc = _toolkit(tmp_path / "cuda", cublas=True)
    out = subprocess.run([sys.executable, str(TOOL), str(nvcc), str(tmp_path / "b")],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "CUDA_PATH": "", "CUDA_HOME": ""}).stdout
    keys = dict(line.split("\t", 1) for line in out.strip().splitlines())
    assert {"rpath", "archs", "roots"} <= set(keys)
