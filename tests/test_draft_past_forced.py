"""Drafting past a grammar's forced run (issue 31): a drafter that reads only its history
(the n-gram and suffix drafters) is asked with the forced tokens as its context, so its
draft goes on after them, e.g. copying a JSON value from the prompt after a forced
``"name": "``; the target verifies it, and exact mode still gives plain decoding's tokens.

The target is the two-layer byte model (``specdec.testing.chat``, greedy text "ab"): the
prompt holds the values ``ab``, the regex forces ``{"name": "`` and ``", "id": "``. The
baseline is the same n-gram drafter behind a Python ``propose`` override, which is asked
from the pending token only (as every drafter was before): its proposal there does not
begin with the forced run, so the round drafts the forced tokens alone.
"""
from __future__ import annotations

import pytest

import specdec
from specdec import Decoder
from specdec.constraint import Grammar
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.ngram_cache import NgramCacheDrafter
from specdec.drafters.ngram_map import NgramMapDrafter
from specdec.drafters.suffix import SuffixDrafter

pytest.importorskip("llguidance")

PROMPT = 'q "id": "ab"; "name": "ab"; '
REGEX = r'\{"name": "[a-z]+", "id": "[a-z]+"\}'


class _PendingOnlyNgram(NgramDrafter):
    """The n-gram drafter asked from the pending token (a Python override is never given
    the forced run as context)."""

    def propose(self, seq, last_token, n_max):
        return super().propose(seq, last_token, n_max)


@pytest.fixture(scope="module")
def byte_model(model_file):
    from specdec.testing.chat import write_tiny_chat
    path = model_file("tiny-bytes-2-layers.gguf", lambda p: write_tiny_chat(
        p, "chatml", chat_template=None, reply="ab", n_layer=2))
    return specdec.Model(path, use_extra_bufts=False)


def _run(model, drafter, monkeypatch):
    """The result and the request's grammar state (its counters)."""
    states = []
    make = Grammar.state

    def state(self):
        states.append(make(self))
        return states[-1]

    monkeypatch.setattr(Grammar, "state", state)
    res = Decoder(model, drafter=drafter, n_max=16, exact=True,
                  n_ctx=256).generate(PROMPT, max_tokens=64, regex=REGEX)
    monkeypatch.setattr(Grammar, "state", make)
    assert len(states) == 1
    return res, states[0]


@pytest.mark.parametrize("make", [lambda: NgramDrafter(3), lambda: SuffixDrafter(),
                                  lambda: NgramMapDrafter(2, 4), lambda: NgramCacheDrafter()],
                         ids=["ngram", "suffix", "ngram-map", "ngram-cache"])
def test_drafts_go_on_past_the_forced_run(byte_model, monkeypatch, make):
    plain = Decoder(byte_model, exact=True, n_ctx=256).generate(PROMPT, max_tokens=64,
                                                                regex=REGEX)
    res, st = _run(byte_model, make(), monkeypatch)
    base, st0 = _run(byte_model, _PendingOnlyNgram(3), monkeypatch)
    assert res.tokens == plain.tokens and base.tokens == plain.tokens
    assert res.text.startswith('{"name": "')
    # the drafter's tokens after a forced run were proposed and verified ...
    assert st.n_after_forced > 0
    assert st0.n_after_forced == 0
    assert st.n_forced > 0 and st0.n_forced > 0
    # ... and accepted: fewer rounds than drafting the forced tokens alone
    assert res.stats.rounds < base.stats.rounds


class _Logged(NgramDrafter):
    """The n-gram drafter (its C ``propose``: drafted past forced runs) with what it
    observes and what it hears accepted logged per round."""

    def __init__(self):
        super().__init__(3)
        self.log = []

    def observe(self, seq, tokens):
        self.log.append(["observe", list(tokens)])
        super().observe(seq, tokens)

    def accept(self, seq, n_accepted):
        self.log.append(["accept", n_accepted])


def test_accept_counts_the_drafters_own_tokens(byte_model, monkeypatch):
    """A proposal drafted past a forced run follows it: the drafter hears how many of its
    own tokens were accepted, not the forced ones before them. The regex forces
    ``"name": "`` after ``{`` and ``, "id": "`` after the name's ``"``: a round that kept
    such a run and ``j`` tokens after it observes ``1 + len(run) + j`` tokens (its pending
    token first) and must report ``j`` accepted."""
    d = _Logged()
    res, st = _run(byte_model, d, monkeypatch)
    assert st.n_after_forced > 0
    runs = {byte_model.tokenize(r, add_special=False)[0]: byte_model.tokenize(r[1:], add_special=False)
            for r in ('{"name": "', '", "id": "')}
    checked = 0
    for (what, obs), (what2, n_acc) in zip(d.log, d.log[1:]):
        if what != "observe" or what2 != "accept" or obs[0] not in runs:
            continue
        run = runs[obs[0]]
        if obs[1:1 + len(run)] == run:
            assert n_acc == len(obs) - 1 - len(run), (obs, n_acc)
            checked += 1
    assert checked > 0


@pytest.mark.slow      # 2000 requests
def test_sampled_law_with_drafts_past_a_forced_run(tiny_bytes):
    """Sampled verification stays exact when the draft follows a forced run: under regex
    ``[a-d]-[a-d]`` the n-gram drafter, given the forced ``-`` as context, drafts the prompt's
    ``c`` after it (the tiny model's successor after ``-`` is ``a``, so it is mostly
    rejected); the law of ``x1 x2`` is the masked, renormalised target's (chi-square)."""
    import math
    import numpy as np
    from scipy.stats import chisquare
    t, n = 15.0, 2000
    boost = math.exp(30.0 / t)

    def p(prev: str, x: str) -> float:
        succ = {"a": "b", "b": None}.get(prev, "a")
        w = {c: boost if c == succ else 1.0 for c in "abcd"}
        return w[x] / sum(w.values())
    exp = {x1 + x2: p("x", x1) * p("-", x2) for x1 in "abcd" for x2 in "abcd"}
    dec = Decoder(tiny_bytes, drafter=NgramDrafter(1), n_max=4, n_ctx=256)
    counts = dict.fromkeys(exp, 0)
    after = 0
    make = Grammar.state
    states = []

    def state(self):
        states.append(make(self))
        return states[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Grammar, "state", state)
        for i in range(n):
            res = dec.generate("-cx", max_tokens=5, regex="[a-d]-[a-d]",
                               sampling={"temperature": t, "seed": 7000 + i})
            counts[res.text[0] + res.text[2]] += 1
            after += states[-1].n_after_forced
    keys = sorted(exp)
    obs = np.array([counts[k] for k in keys], dtype=float)
    want = np.array([exp[k] for k in keys]) * n
    assert chisquare(obs, want).pvalue > 1e-3, dict(zip(keys, obs))
    assert after > n / 2        # the drafts past the forced '-' ran
