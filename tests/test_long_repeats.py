"""Drafts that ride long verbatim repeats.

Where the text repeats a long passage word for word (code that repeats itself, a passage
asked for again), llama.cpp's ``ngram-simple`` with a 12-token key and 48-token drafts
accepts nearly everything. specdec's lookup drafters must find the same run and draft it as
far as it goes, and the adaptive policy must let the draft length grow past 16 while the
drafts keep being accepted (``_policy.pyx``: long drafts priced by the cost line).

The bigram model's greedy text follows one cycle through its vocabulary, so a prompt that
holds a long stretch of that cycle, then other tokens, then the stretch's first tokens again
is continued by repeating the stretch verbatim: the drafts' lengths and acceptance are
countable, not timed. Between the stretch and its head come decoys: three tokens of the
stretch followed by others, as a short key recurs all over code (``self.``); the latest
occurrence of a 3-token key is then the decoy, and only the longest match is the passage.
"""
import pytest

from specdec import Decoder
from specdec.testing import bigram_successor

RUN, HEAD, GEN = 400, 24, 320


DECOYS = (60, 130, 200, 270)


def _repeat_prompt(succ):
    """A 400-token stretch of the cycle; decoys (3 of its tokens, then 5 that do not follow
    them); then the stretch's first 24 tokens."""
    run, t = [], 7
    for _ in range(RUN):
        run.append(t)
        t = int(succ[t])
    decoys = []
    for d in DECOYS:
        decoys += run[d - 2:d + 1] + [int(succ[succ[x]]) for x in run[d + 1:d + 6]]
    return run + decoys + run[:HEAD], run


@pytest.fixture(scope="module")
def repeat(bigram_tiny_path):
    succ = bigram_successor(bigram_tiny_path)
    prompt, run = _repeat_prompt(succ)
    plain = Decoder(bigram_tiny_path, n_ctx=2048).generate(prompt, max_tokens=GEN)
    # the premise: the greedy text is the rest of the stretch, word for word
    assert plain.tokens[:RUN - HEAD] == run[HEAD:GEN + HEAD]
    return prompt, plain.tokens


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_adaptive_drafts_ride_a_long_repeat_past_16(bigram_tiny_path, repeat, drafter):
    prompt, plain = repeat
    dec = Decoder(bigram_tiny_path, drafter=drafter, n_max=64, adaptive=True, n_ctx=2048,
                  check=True)
    r = dec.generate(prompt, max_tokens=GEN)
    assert r.tokens == plain
    s = r.stats
    deep = s.accepted_per_position[16:]
    assert sum(deep) > 0, f"no draft past 16 accepted: {s.drafted_per_position}"
    # most of the text comes from drafts, mostly ones longer than 16
    assert s.accepted > 0.8 * GEN, (s.accepted, s.rounds)
    assert sum(deep) > 0.4 * GEN, s.accepted_per_position
    assert s.acceptance_rate > 0.9


def test_ngram_follows_the_repeated_passage_not_the_latest_key(bigram_tiny_path, repeat):
    """At each decoy the latest occurrence of the 3-token key is the decoy, whose text goes
    on otherwise; the longest match is the passage, and its drafts of 48 are accepted whole."""
    prompt, plain = repeat
    r = Decoder(bigram_tiny_path, drafter="ngram", n_max=48, n_ctx=2048, check=True).generate(
        prompt, max_tokens=GEN)
    assert r.tokens == plain
    assert r.stats.acceptance_rate > 0.95, r.stats.acceptance_rate
    assert r.stats.accepted_per_position[47] > 0
