"""Benchmarks: run with ``pytest bench --import-mode=importlib`` (against the installed specdec).

Peers are built or measured in the same run, and results are ratios measured side
by side, because these machines drift by +-20% within an hour.
"""
import pytest


@pytest.fixture(scope="session")
def gemma_path():
    from specdec.models import default_model_path
    return str(default_model_path())


def pytest_configure(config):
    config.addinivalue_line("markers", "peer: needs llama.cpp's reference tools (built on demand)")
