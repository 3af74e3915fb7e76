"""The public API type-checks under ``mypy --strict``: the README's examples and a user script."""
import subprocess
import sys
from pathlib import Path

import pytest

from readme_blocks import README, runnable

pytest.importorskip("mypy")
ROOT = Path(__file__).resolve().parent.parent

USER_SCRIPT = '''
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import specdec
from specdec import Decoder, Drafter, GenerationResult, Sampling, Stats, generate, register
from specdec.config import SpecConfig
from specdec.drafters import MtpDrafter, NgramDrafter, SuffixDrafter


@register("typed-repeat")
class Repeat(Drafter):
    """Proposes the last token again, with a draft distribution."""

    def propose(self, seq: int, last_token: int, n_max: int) -> Tuple[List[int], List[Dict[int, float]]]:
        return [last_token] * n_max, [{last_token: 0.5}] * n_max


class Echo(Drafter):
    """Proposes what followed the previous occurrence of the last token, from the history view."""

    def propose(self, seq: int, last_token: int, n_max: int) -> List[int]:
        hist = self.history(seq)
        where = np.flatnonzero(hist == last_token)
        return [int(t) for t in hist[where[-1] + 1:][:n_max]] if len(where) else []


class ShortNgram(NgramDrafter):
    """A built-in with its Python propose honoured: the first token of its draft."""

    def propose(self, seq: int, last_token: int, n_max: int) -> List[int]:
        draft: List[int] = super().propose(seq, last_token, n_max)
        return draft[:1]


def contract(d: Drafter) -> Tuple[bool, int, bool, Optional[bytes]]:
    d.configure(SpecConfig(n_max=4, p_min=0.2))
    d.forget_text()
    state = d.get_state()
    d.set_state(state)
    d.close()
    return d.needs_mtp_hidden, d.rollback_depth, d.has_model, state


def run(prompts: Sequence[str]) -> List[float]:
    suffix = SuffixDrafter(32, min_prob=0.2)
    suffix.add_corpus([[1, 2, 3]])
    print(contract(suffix), contract(MtpDrafter("q8_0", p_min=0.5)), suffix.min_prob)
    rates: List[float] = []
    with Decoder(specdec.default_model_path(), drafter=["typed-repeat", "ngram:3", Echo(),
                                                         ShortNgram(3)], n_max=3,
                 adaptive=True) as dec:
        for p in prompts:
            res: GenerationResult = dec.generate(p, max_tokens=8, stop=["END"],
                                                 sampling=Sampling(temperature=0.7, seed=1))
            st: Stats = res.stats
            rates.append((st.acceptance_rate or 0.0) + st.t_lm_head_s + st.t_verify_s)
            for piece in dec.stream(p, max_tokens=4):
                print(piece, end="")
    one = generate(str(specdec.default_model_path()), "Hi", max_tokens=2, drafter=Repeat)
    reason: str | None = one.finish_reason
    print(reason, one.tokens[:1], one.stats.n_generated)
    return rates
'''


def _mypy(path: Path) -> subprocess.CompletedProcess:
    # run from the checkout, so mypy reads specdec's sources and stubs (an editable install's
    # import hook is invisible to it); specdec's own modules are checked, not reported
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--no-incremental", "--python-version", "3.10", str(path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.parametrize("block", runnable("python"), ids=lambda b: b.id)
def test_readme_python_block_passes_mypy_strict(block, tmp_path):
    path = tmp_path / f"readme_{block.line}.py"
    path.write_text(block.code)
    p = _mypy(path)
    assert p.returncode == 0, p.stdout + p.stderr


def test_user_script_passes_mypy_strict(tmp_path):
    path = tmp_path / "user.py"
    path.write_text(USER_SCRIPT)
    p = _mypy(path)
    assert p.returncode == 0, p.stdout + p.stderr


def test_mypy_sees_real_types(tmp_path):
    """The check above is not vacuous: misuse of the same API is reported."""
    path = tmp_path / "wrong.py"
    path.write_text(USER_SCRIPT + '''

def wrong() -> None:
    r = specdec.generate("m.gguf", "x", max_tokens="many")
    r.stats.no_such_field
    specdec.Decoder("m.gguf").generate(42.0)
    SuffixDrafter(max_depth="deep")
    Echo().history(0).append(1)
''')
    p = _mypy(path)
    assert p.returncode == 1
    for what in ('"max_tokens"', '"no_such_field"', '"generate" of "Decoder"', '"SuffixDrafter"',
                 '"append"'):
        assert what in p.stdout, p.stdout
