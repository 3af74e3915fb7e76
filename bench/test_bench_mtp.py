"""The MTP benchmark script, end to end on the tiny bigram models (a smoke test: the
timings of a model this small say nothing; ``python -m bench.mtp`` measures the mid ones)."""
import pytest

from bench import mtp


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_calibrate_hits_the_accuracies(cache):
    noises = mtp.calibrate("tiny", (0.9, 0.5), log=lambda s: None)
    assert 0 < noises[0.9] < noises[0.5] < 1


def test_specdec_side_on_tiny(cache):
    rows = mtp.run("tiny", accuracies=(0.9,), n_max=(1, 2), n_gen=32, reps=1, llama=False,
                   log=lambda s: None)
    assert [r.method for r in rows] == ["plain", "n_max 1", "n_max 2"]
    assert all(r.specdec_tok_s > 0 for r in rows) and rows[1].specdec_acc > 0.5
    text = mtp.table(rows)
    assert text.count("\n") == 4 and "| 90% | n_max 2 |" in text


@pytest.mark.peer
def test_against_llama_on_tiny(cache):
    rows = mtp.run("tiny", accuracies=(0.9,), n_max=(2,), n_gen=32, reps=1, log=lambda s: None)
    assert rows[1].llama_tok_s > 0 and rows[1].llama_acc > 0.5
    assert not rows[1].note, rows[1].note     # llama.cpp's text equals specdec's plain text
