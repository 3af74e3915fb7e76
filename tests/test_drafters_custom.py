"""User drafters: by decorator, by entry point, duck-typed; and drafters that misbehave."""
import sys

import pytest

import specdec
from specdec import Decoder, DrafterError
from specdec.drafters import Drafter, available, create, register

PROMPT = "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"


@pytest.fixture(scope="module")
def plain(gemma):
    return Decoder(gemma, n_ctx=1024).generate(PROMPT, max_tokens=40)


class Oracle(Drafter):
    """Proposes the plain greedy continuation, corrupted at every 3rd draft position,
    so each acceptance count 0..n_max occurs."""

    def __init__(self, truth, n_prompt):
        super().__init__("oracle")
        self.truth, self.n_prompt, self.calls = truth, n_prompt, 0

    def propose(self, seq, last_token, n_max):
        self.calls += 1
        done = len(self.history(seq)) - self.n_prompt + 1  # emitted so far, `last` included
        out = list(self.truth[done:done + n_max])
        if out and self.calls % 3 == 0:
            out[min(len(out) - 1, self.calls % n_max)] ^= 1
        return out


def test_decorator_registered_drafter_runs_through_controller(gemma, plain):
    @register("test-oracle", replace=True)
    class RegisteredOracle(Oracle):
        def __init__(self):
            n_prompt = len(gemma.tokenize(PROMPT, parse_special=True))
            super().__init__(plain.tokens, n_prompt)

    assert "test-oracle" in available()
    dec = Decoder(gemma, drafter="test-oracle", n_max=4, n_ctx=1024, check=True)
    r = dec.generate(PROMPT, max_tokens=40)
    assert r.tokens == plain.tokens
    s = r.stats
    assert s.drafted > 0 and 0 < s.accepted < s.drafted
    assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
    assert len(s.accepted_per_position) == 4


def test_duck_typed_drafter(gemma, plain):
    class Duck:
        def __init__(self):
            self.seen = []

        def observe(self, seq, tokens):
            self.seen.extend(tokens)

        def propose(self, seq, last_token, n_max):
            return [last_token] * min(2, n_max)

    duck = Duck()
    dec = Decoder(gemma, drafter=duck, n_max=3, n_ctx=1024, check=True)
    r = dec.generate(PROMPT, max_tokens=40)
    assert r.tokens == plain.tokens
    assert len(duck.seen) >= len(gemma.tokenize(PROMPT, parse_special=True))


ENTRY_POINT_PKG = '''
from specdec.drafters import Drafter

class EchoDrafter(Drafter):
    def propose(self, seq, last_token, n_max):
        h = self.history(seq)
        return h[-n_max:] if n_max else []
'''


def test_entry_point_plugin(tmp_path, gemma, plain, monkeypatch):
    """A tiny installed-looking package: a module plus dist-info with an entry point."""
    site = tmp_path / "site"
    (site / "echo_plugin").mkdir(parents=True)
    (site / "echo_plugin" / "__init__.py").write_text(ENTRY_POINT_PKG)
    dist = site / "echo_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[specdec.drafters]\necho = echo_plugin:EchoDrafter\n")
    monkeypatch.syspath_prepend(str(site))
    import importlib
    importlib.invalidate_caches()
    assert "echo" in available()
    d = create("echo")
    assert type(d).__name__ == "EchoDrafter"
    r = Decoder(gemma, drafter="echo", n_max=3, n_ctx=1024, check=True).generate(PROMPT, max_tokens=40)
    assert r.tokens == plain.tokens


class Bad(Drafter):
    def __init__(self, answer):
        super().__init__("bad")
        self.answer = answer

    def propose(self, seq, last_token, n_max):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer,match", [
    ([1, 10**9], "outside"),
    ([-3], "outside"),
    ([5] * 9, "more than n_max"),
    (["a", "b"], "non-integer"),
    ([1.5], "non-integer"),
    ("abc", "sequence of token ids"),
    (42, "sequence of token ids"),
    (ZeroDivisionError("boom"), "ZeroDivisionError: boom"),
    (([5], [[0.1]]), "entries"),
    (([5], [{5: float("nan")}]), "probability"),
    (([5], [{5: -1.0}]), "probability"),
    (([5], [{6: 1.0}]), "zero draft probability"),
])
def test_misbehaving_drafter(gemma, plain, answer, match):
    bad = Bad(answer)
    dec = Decoder(gemma, drafter=bad, n_max=4, n_ctx=1024)
    with pytest.raises(DrafterError, match=match):
        dec.generate(PROMPT, max_tokens=10)
    # the decoder is usable afterwards, and the target state was never touched by the bad draft
    bad.answer = []
    assert dec.generate(PROMPT, max_tokens=40).tokens == plain.tokens


def test_create_errors():
    with pytest.raises(ValueError, match="unknown drafter"):
        create("no-such-drafter")
    with pytest.raises(TypeError):
        create(3.5)
    with pytest.raises(ValueError):
        register("bad:name")
