"""The MTP head's catch-up while it does not draft: a sequence held plain (the adaptive
policy, the batch's floor, another drafter of its chain) queues its rows and never decodes
them; when drafting resumes, its queue is decoded in one batch, and the drafts are exactly
those of a head kept current (checked against a head recomputed from scratch)."""
from __future__ import annotations

import pytest
from mtp_scratch import Checking, Scratch

from specdec import Decoder
from specdec.drafters.mtp import MtpDrafter

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
OFF = range(4, 84)       # rounds in which the MTP head only observes: another drafter serves


class Watching(Checking):
    """``Checking`` that also notes the MTP drafter's counters as the off stretch begins and
    ends, and how many draft tokens the reference checked in each MTP round."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.at, self.checked_at = {}, {}

    def propose(self, seq, last, n_max):
        r = self.rounds.get(seq, 0) + 1
        if r in (OFF.start, OFF.stop):
            self.at[r] = self.mtp.counters()
        before = self.checked
        got = super().propose(seq, last, n_max)
        self.checked_at[r] = self.checked - before
        return got


@pytest.mark.parametrize("n_batch", [512, 16])
def test_drafts_after_a_long_plain_stretch_equal_a_head_kept_current(tiny_qwen35, n_batch):
    """80 rounds in which another drafter's drafts are verified (the MTP head only observes,
    as under a policy that holds it off) and no MTP decode runs; then the head drafts again,
    from exactly the KV it would have had decoding every round: random weights, where its
    attention reads all of that KV. ``n_batch`` 16: the queue outgrows its cap (16 + 1 rows)
    and is decoded while off, in batches of its own."""
    mtp = MtpDrafter()
    ref = Scratch(tiny_qwen35, n_ctx=1024)
    chk = Watching(mtp, ref.draft, lambda s, r: r not in OFF, ref.oracle)
    dec = Decoder(tiny_qwen35, drafter=[chk, mtp], n_max=3, n_ctx=1024, n_batch=n_batch)
    res = dec.generate(PROMPT, max_tokens=300)
    assert len(res.tokens) == 300
    assert chk.rounds[0] > OFF.stop + 20, "the head drafted again after the stretch"
    before, after = chk.at[OFF.start], chk.at[OFF.stop]
    queued = after["catchup_rows"] - before["catchup_rows"]
    assert queued >= 150                   # the stretch's committed tokens
    if n_batch == 512:
        assert after["decodes"] == before["decodes"], "no MTP decode while the head is off"
        assert after["catchup_decoded"] == before["catchup_decoded"]
    else:
        # decoded in batches of the cap, each a single decode
        assert after["decodes"] - before["decodes"] <= queued // 16
        assert after["catchup_decoded"] - before["catchup_decoded"] >= queued - 17
    # the first rounds after the stretch drafted what a head kept current drafts (Checking
    # asserts equality each round; here, that the reference was sure of some of them)
    assert sum(chk.checked_at.get(r, 0) for r in range(OFF.stop, OFF.stop + 5)) >= 3
    assert chk.checked >= chk.asked * 0.9


def test_a_sequence_that_never_drafts_has_its_rows_never_decoded(tiny_qwen35):
    """Two sequences share the head: the first drafts with it every round, the second is
    served by another drafter all along. Only the first's rows are decoded (with its draft
    steps); the second's wait in its queue, then go with its request."""
    mtp = MtpDrafter()
    ref = Scratch(tiny_qwen35, n_ctx=512)
    chk = Checking(mtp, ref.draft, lambda s, r: s == 0, ref.oracle)
    dec = Decoder(tiny_qwen35, drafter=[chk, mtp], n_max=2, n_ctx=1024, n_seq_max=2)
    res = dec.generate_batch([PROMPT, PROMPT[:5]], max_tokens=60)
    assert [len(r.tokens) for r in res] == [60, 60]
    c = mtp.counters()
    assert set(chk.rounds) == {0, 1} and chk.mtp_rounds >= 15
    waiting = c["catchup_rows"] - c["catchup_decoded"]
    assert waiting >= len(PROMPT[:5]) + 60 - 1          # the second sequence's rows
    assert waiting <= len(PROMPT[:5]) + 60 + 3          # ... and at most the first's last round
    assert chk.checked >= chk.asked * 0.9
