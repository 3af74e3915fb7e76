"""How llama.cpp splits a verify batch into ubatches (``_ubatch_split``), checked against the
rules of its ``split_equal``, and the padding that keeps a mixed round in one pass: decided
by the cost line, the greedy output unchanged."""
from __future__ import annotations

import pytest

from specdec import Engine
from specdec._ubatch_split import padding_height, ubatches
from specdec.drafters import Drafter
from specdec.testing import bigram_successor, write_bigram_mtp_model
from bigram_greedy import greedy_cycle

KEEP = 5        # n_rollback 4: the last 5 rows of a sequence stay in one ubatch


def test_equal_rows_are_one_ubatch():
    assert ubatches([5] * 8, keep_tail=KEEP) == 1
    assert ubatches([1] * 8, keep_tail=KEEP) == 1
    assert ubatches([3, 3, 3], sequential=False, keep_tail=KEEP) == 1


def test_a_longer_sequence_before_a_shorter_goes_alone():
    # the shortest sets the rows each takes; a longer one keeps fewer than 5 rows for later,
    # which the snapshots forbid: the first sequence goes alone, to its end, again and again
    assert ubatches([5] * 7 + [1], keep_tail=KEEP) == 8
    assert ubatches([1] + [5] * 7, keep_tail=KEEP) == 2
    assert ubatches([5] + [1] * 7, keep_tail=KEEP) == 2
    assert ubatches([5, 1] * 4, keep_tail=KEEP) == 8
    # without snapshots the rows are split, not the sequences
    assert ubatches([5] * 7 + [1], keep_tail=0) == 2


def test_streams_need_consecutive_sequences():
    assert ubatches([5] * 7, ids=[0, 1, 2, 4, 5, 6, 7], keep_tail=KEEP) == 2
    assert ubatches([5] * 7, ids=[0, 1, 2, 4, 5, 6, 7], sequential=False, keep_tail=KEEP) == 1


def test_n_ubatch_bounds_a_ubatch():
    # 8 sequences of 5 rows, 20 rows a ubatch: the run takes 2 rows each (16; 24 would not
    # fit), which leaves 3 in each: the first goes alone, and so on until 4 sequences (20
    # rows) fit whole
    assert ubatches([5] * 8, keep_tail=KEEP, n_ubatch=20) == 5
    assert ubatches([5] * 4, keep_tail=KEEP, n_ubatch=20) == 1
    assert ubatches([5] * 8, keep_tail=0, n_ubatch=20) == 3


def test_padding_pays_where_it_saves_passes():
    # a pass costs two rows' worth (a CPU): 4 padding rows save 7 passes
    assert padding_height([5] * 7 + [1], keep_tail=KEEP, a=2.0, b=1.0) == 5
    # 28 padding rows would save one pass
    assert padding_height([5] + [1] * 7, keep_tail=KEEP, a=2.0, b=1.0) == 0
    # equal rows: nothing to pad
    assert padding_height([5] * 8, keep_tail=KEEP, a=2.0, b=1.0) == 0
    # a pass costing 40 rows (a GPU): even 28 padding rows pay
    assert padding_height([5] + [1] * 7, keep_tail=KEEP, a=40.0, b=1.0) == 5
    # ... unless the padded batch outgrows the rows the round may have
    assert padding_height([5] + [1] * 7, keep_tail=KEEP, a=40.0, b=1.0, max_rows=32) == 0
    # a middle height: the drafting sequences evened, the plain ones left at one row
    assert padding_height([1, 1, 1, 1, 3, 5], keep_tail=KEEP, a=2.0, b=1.0) in (0, 3, 5)


def test_rows_checked():
    with pytest.raises(ValueError, match="row"):
        ubatches([5, 0])


@pytest.fixture(scope="module")
def hybrid_target(model_file):
    return model_file("bigram-qwen35-ubatch.gguf", lambda p: write_bigram_mtp_model(p))


class Uneven(Drafter):
    """The target's own continuation (a bigram's successor cycle), none for the last slot:
    each round verifies 7 sequences of 5 rows and one of 1 row, a batch llama.cpp would split
    into 8 ubatches, which padding keeps in one."""

    def __init__(self, succ, n_slots):
        super().__init__("uneven")
        self.succ, self.n_slots = succ, n_slots

    def propose(self, seq, last_token, n_max):
        out, t = [], last_token
        for _ in range(n_max if seq != self.n_slots - 1 else 0):
            t = int(self.succ[t])
            out.append(t)
        return out


def test_padded_rounds_keep_the_greedy_output(hybrid_target):
    """A hybrid target with 4 snapshots under 8 slots, every round mixing drafts of 4 with a
    sequence that has none: the rounds are padded, the output is the target's own."""
    prompts = [[3 + 9 * i, 11, 52 + i, 97] for i in range(8)]
    d = Uneven(bigram_successor(hybrid_target), 8)
    with Engine(hybrid_target, drafters=[d], n_slots=8, n_max=4, n_ctx=512) as eng:
        res = [h.result(120) for h in [eng.submit(p, max_tokens=40) for p in prompts]]
    for p, r in zip(prompts, res):
        assert r.tokens == greedy_cycle(hybrid_target, p, 40)
    assert sum(r.stats.drafted for r in res) >= 7 * 4 * 5


def test_uneven_rounds_keep_the_greedy_output(hybrid_target):
    """An Engine on a hybrid target with MTP (a KV stream per slot, 4 snapshots) under the
    adaptive policy: its mixed verify batches are padded where that pays, and every request's
    greedy output is still the target's own."""
    prompts = [[3 + 9 * i, 11, 52 + i, 97] for i in range(6)]
    with Engine(hybrid_target, drafters=["mtp"], n_slots=6, n_max=4, adaptive=True,
                n_ctx=512) as eng:
        handles = [eng.submit(p, max_tokens=60 + 7 * i) for i, p in enumerate(prompts)]
        res = [h.result(120) for h in handles]
    for i, (p, r) in enumerate(zip(prompts, res)):
        assert r.tokens == greedy_cycle(hybrid_target, p, 60 + 7 * i)
