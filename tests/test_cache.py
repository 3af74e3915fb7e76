"""The specdec cache: one rule for its place, content keys, listing, removal, the size cap."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from specdec import cache
from specdec.drafters.layerskip import derive_layerskip_gguf
from specdec.drafters.mtp_head import derive_mtp_head_gguf


@pytest.fixture
def cdir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(d))
    monkeypatch.delenv("SPECDEC_CACHE_MAX_SIZE", raising=False)
    return d


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True,
                          timeout=300, cwd=tempfile.gettempdir(), env={**os.environ, **(env or {})})


def test_every_user_reads_one_rule(cdir, monkeypatch):
    from specdec.benchmark import lcp_build, llama_tools, synthetic
    monkeypatch.delenv("SPECDEC_LLAMA_TOOLS_DIR", raising=False)
    monkeypatch.delenv("SPECDEC_PEERS_DIR", raising=False)
    assert cache.cache_dir() == cdir
    assert llama_tools.tools_dir().parent == cdir / "llama-tools"
    assert lcp_build.peer_dir().parent == cdir / "peers"
    assert synthetic.bench_dir("tiny") == cdir / "bench-mtp" / "tiny"
    # the build script loads the facts module by path, and takes the sdist from the same dir:
    # a corrupt copy there is found, refused and deleted
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_fetch", Path(__file__).parent.parent / "tools" / "fetch_llama_cpp.py")
    if spec is None or not Path(spec.origin).exists():
        pytest.skip("no tools/ next to the tests")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.delenv("SPECDEC_LLAMA_SDIST", raising=False)
    bad = cdir / "sdist" / mod.facts.SDIST_NAME
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not the sdist")
    with pytest.raises(SystemExit, match="sha256 mismatch"):
        mod.ensure(cdir / "llama.cpp")
    assert not bad.exists() and not (cdir / "llama.cpp").exists()


def test_xdg_fallback(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDEC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "specdec"


def test_layerskip_keyed_by_content_not_path(cdir, tiny_dense_path, tmp_path):
    a = derive_layerskip_gguf(tiny_dense_path, 1)
    assert a.parent == cdir / "layerskip"
    side = json.loads(a.with_name(a.name + ".json").read_text())
    assert side["source"] == str(Path(tiny_dense_path).resolve()) and side["n_layers"] == 1
    # a copy elsewhere with a new mtime is the same content: the same cached file
    moved = tmp_path / "elsewhere.gguf"
    shutil.copy(tiny_dense_path, moved)
    os.utime(moved, (1, 1))
    b = derive_layerskip_gguf(moved, 1)
    assert b.parent == a.parent and b.name.split("-")[-1] == a.name.split("-")[-1]
    assert len(list((cdir / "layerskip").glob("*.gguf"))) == 1
    # other parameters, another key
    assert cache.content_key(tiny_dense_path, "layerskip", 2) != cache.content_key(
        tiny_dense_path, "layerskip", 1)


def test_content_key_sees_tensor_infos(tiny_dense_path, tiny_qwen35_path):
    assert cache.content_key(tiny_dense_path) != cache.content_key(tiny_qwen35_path)
    assert cache.content_key(tiny_dense_path) == cache.content_key(tiny_dense_path)


def test_list_rm_clear_via_cli(cdir, tiny_dense_path, tiny_qwen35_path):
    ls = derive_layerskip_gguf(tiny_dense_path, 1)
    head = derive_mtp_head_gguf(tiny_qwen35_path, "q8_0")
    (cdir / "llama-tools" / "pin-x").mkdir(parents=True)
    (cdir / "llama-tools" / "pin-x" / "llama-cli").write_bytes(b"x" * 5000)
    env = {"SPECDEC_CACHE_DIR": str(cdir)}
    p = _cli("cache", env=env)
    assert p.returncode == 0, p.stderr
    assert f"layerskip/{ls.name}" in p.stdout and f"mtp-head/{head.name}" in p.stdout
    assert str(Path(tiny_dense_path).resolve()) in p.stdout       # what it was derived from
    assert "llama-tools/pin-x" in p.stdout and "4.9K" in p.stdout
    js = json.loads(_cli("cache", "list", "--json", env=env).stdout)
    assert {e["name"] for e in js} == {f"layerskip/{ls.name}", f"mtp-head/{head.name}", "llama-tools/pin-x"}
    assert all(e["size"] > 0 for e in js)
    p = _cli("cache", "rm", f"layerskip/{ls.name}", env=env)
    assert p.returncode == 0 and "freed" in p.stdout
    assert not ls.exists() and not ls.with_name(ls.name + ".json").exists() and head.exists()
    p = _cli("cache", "rm", "no/such", env=env)
    assert p.returncode == 1 and "nothing named 'no/such'" in p.stderr
    p = _cli("cache", "clear", env=env)
    assert p.returncode == 0 and cache.entries() == []
    assert _cli("cache", "dir", env=env).stdout.strip() == str(cdir)


def test_size_cap_evicts_least_recently_used(cdir, tiny_qwen35_path, monkeypatch):
    first = derive_mtp_head_gguf(tiny_qwen35_path, "q8_0")
    second = derive_mtp_head_gguf(tiny_qwen35_path, "q5_0")
    cap = sum(e.size for e in cache.entries()) - 1     # room for two, and q4_0 < q8_0
    os.utime(first.with_name(first.name + ".json"), (1, 1))      # used long ago
    assert derive_mtp_head_gguf(tiny_qwen35_path, "q5_0") == second   # a hit records the use
    monkeypatch.setenv("SPECDEC_CACHE_MAX_SIZE", str(cap))
    third = derive_mtp_head_gguf(tiny_qwen35_path, "q4_0")
    assert third.exists() and second.exists() and not first.exists()
    assert sum(e.size for e in cache.entries()) <= cap
    # a cap below one file keeps the file just written
    monkeypatch.setenv("SPECDEC_CACHE_MAX_SIZE", "1")
    again = derive_mtp_head_gguf(tiny_qwen35_path, "q8_0")
    assert again.exists() and [e.path for e in cache.entries()] == [again]


@pytest.mark.parametrize("text,n", [("2G", 2 << 30), ("500M", 500 << 20), ("1.5k", 1536),
                                    ("123", 123), ("4GiB", 4 << 30), ("2 GB", 2 << 30)])
def test_parse_size(text, n):
    assert cache.parse_size(text) == n


def test_parse_size_rejects_garbage():
    with pytest.raises(ValueError, match="not a size"):
        cache.parse_size("lots")
