"""References for the MTP drafter's drafts: ``Scratch`` recomputes them from nothing (a fresh
target decode of the whole history for the hidden rows, a fresh MTP context fed every
position), ``Checking`` checks each draft of a drafter against a reference as it is made."""
from __future__ import annotations

import numpy as np

from specdec import Batch, Context
from specdec.drafters import Drafter
from specdec.drafters._run import run_propose


class Checking(Drafter):
    """Put first in a chain: drafts through the MTP drafter's C hook and checks every draft
    against ``reference(seq, history, last, n)``; on rounds where ``script(seq, round)``
    says so it proposes ``oracle(...)`` instead, so the MTP drafter only observes."""

    def __init__(self, mtp, reference, script=None, oracle=None):
        super().__init__("checking")
        self.mtp, self.reference, self.script, self.oracle = mtp, reference, script, oracle
        self.rounds, self.checked, self.asked, self.mtp_rounds = {}, 0, 0, 0
        self.oracle_accepts, self._mode = set(), {}

    def propose(self, seq, last, n_max):
        r = self.rounds[seq] = self.rounds.get(seq, 0) + 1
        hist = self.mtp.history(seq)
        self._mode[seq] = self.script is None or self.script(seq, r)
        if not self._mode[seq]:
            return self.oracle(seq, hist, last, n_max, r)
        got = run_propose(self.mtp, seq, last, n_max)
        want = self.reference(seq, hist, last, n_max)
        assert len(got) == n_max
        assert got[:len(want)] == want, f"seq {seq} round {r}: drafted {got}, reference {want}"
        self.checked += len(want)
        self.asked += n_max
        self.mtp_rounds += 1
        return got

    def accept(self, seq, n_accepted):
        if not self._mode[seq]:
            self.oracle_accepts.add(n_accepted)


class Scratch:
    """MTP drafts recomputed from nothing, and the target's greedy continuation."""

    def __init__(self, target_model, mtp_model=None, n_ctx=512):
        mm = mtp_model or target_model
        self.tgt = Context(target_model, n_ctx=n_ctx, n_batch=n_ctx, mtp_hidden="dense")
        self.mtp = Context(mm, n_ctx=n_ctx, n_batch=n_ctx, kind="mtp", mtp_hidden="dense")
        self.E = mm.n_embd_out
        self.margin = 1e-3

    def _target(self, hist):
        self.tgt.clear()
        b = Batch(len(hist))
        for p, t in enumerate(hist):
            b.add(t, p, 0, p == len(hist) - 1)
        self.tgt.decode(b)
        return np.array(self.tgt.mtp_hidden_rows())

    def draft(self, seq, hist, last, n):
        """The drafts while the reference is sure of them (top-2 margin above 1e-3)."""
        H = self._target(hist)
        P = len(hist)
        self.mtp.clear()
        b = Batch(P + 1, n_embd=self.E)
        for p, t in enumerate(hist):
            b.add(t, p, 0, False, embd=np.zeros(self.E, np.float32) if p == 0 else H[p - 1])
        b.add(last, P, 0, True, embd=H[P - 1])
        self.mtp.decode(b)
        i, res = P, []
        while True:
            lg = np.array(self.mtp.logits(i))
            top = np.sort(lg)[-2:]
            if top[1] - top[0] < self.margin:
                return res
            res.append(int(np.argmax(lg)))
            if len(res) == n:
                return res
            h = np.array(self.mtp.mtp_hidden_row(i))
            b = Batch(1, n_embd=self.E)
            b.add(res[-1], P + len(res), 0, True, embd=h)
            self.mtp.decode(b)
            i = 0

    def continuation(self, hist, last, n):
        self._target(hist)
        out, t = [], last
        for i in range(n):
            b = Batch(1)
            b.add(t, len(hist) + i, 0, True)
            self.tgt.decode(b)
            t = int(np.argmax(self.tgt.logits(0)))
            out.append(t)
        return out

    def oracle(self, seq, hist, last, n, r):
        """The target's own continuation, wrong at position r mod (n+1): every
        acceptance count 0..n comes round in turn."""
        d = self.continuation(hist, last, n)
        bad = r % (n + 1)
        if bad < n:
            d[bad] = (d[bad] + 1) % self.tgt.n_vocab
        return d
