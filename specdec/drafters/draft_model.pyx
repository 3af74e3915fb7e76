# cython: language_level=3
# distutils: language = c++
"""A separate, smaller draft model (llama.cpp's ``draft-simple``).

The draft context mirrors the target's history. Drafting decodes the pending
token and then its own greedy guesses one at a time; what the target accepts is
already in the draft context, so ``observe`` keeps the agreeing prefix of those
speculative tokens, trims the rest and queues what is missing (``todo``): the next
draft's first decode takes it along, so a round costs no decode of its own for it (a
prompt chunk, or more than a round's worth, is decoded at once).

Several sequences drafting in one round (``propose_batch``) share each draft step's
decode: one row per sequence still drafting (the first step also their queued tokens),
so a round costs ``n_max`` draft decodes however many sequences draft.

A draft model with another vocabulary drafts only with ``translate`` on: a
:class:`~specdec.drafters.translate.Translation` then gives the draft tokens the draft
context should hold and turns the draft's tokens into target tokens.
"""
from libc.math cimport exp
from libc.stdint cimport int32_t
from libcpp.vector cimport vector

from .._core cimport Model, Context, Batch
from .._sampling cimport argmax
from .._timing cimport now
from ._base cimport Drafter, Draft, Asks
from .translate cimport Translation
from .translate import translation

import os

from .._archs import BLOCK_DRAFT_ARCHS, LAYER_DRAFT_ARCHS

#: draft architectures fed by the target (no tokens alone): what they are, and their drafter
_FED_DRAFTS = {**{a: ("an EAGLE-3", "eagle3") for a in LAYER_DRAFT_ARCHS},
               **{a: ("a DFlash", "dflash") for a in BLOCK_DRAFT_ARCHS}}


cdef class DraftModelDrafter(Drafter):
    """DraftModelDrafter(path=None, *, p_min=None, n_threads=None, n_gpu_layers=None, name="draft")
--

    ``path``: the draft GGUF (or a loaded ``Model``). ``p_min``: stop drafting when the
    draft model's probability of its own next guess falls below it (None: the
    Decoder's ``p_min``). ``translate``: draft with a model whose vocabulary is not the
    target's (True; ``"ids"`` or ``"text"`` force a way, see ``translate.translation``);
    off, such a model is refused."""
    cdef readonly Model draft_model
    cdef readonly Context draft_ctx
    cdef Batch batch
    cdef object _source
    cdef int n_threads
    cdef vector[vector[int32_t]] in_ctx   # per sequence: tokens held by the draft context
    cdef vector[vector[int32_t]] todo     # per sequence: history after in_ctx, not decoded yet
    cdef vector[int32_t] n_hist           # per sequence: how many of them are target history
    cdef object _translate                # False, or the translation mode asked for
    cdef readonly Translation translation # None: the draft shares the target's vocabulary

    def __init__(self, path=None, *, p_min=None, n_threads=None, n_gpu_layers=None, name="draft",
                 translate=False):
        super().__init__(name)
        self.translate = translate
        self.n_gpu_layers = n_gpu_layers
        if path is None and type(self) is DraftModelDrafter:
            raise ValueError("the draft drafter needs a model: draft:PATH")
        self._source = path
        self._set_p_min(p_min, 0.0)
        self.n_threads = 0 if n_threads is None else int(n_threads)

    @property
    def translate(self):
        """False, or how a draft model with another vocabulary is translated ("auto",
        "ids", "text"); set before ``bind``."""
        return self._translate

    @translate.setter
    def translate(self, value):
        if value is True:
            value = "auto"
        if value not in (False, None, "auto", "ids", "text"):
            raise ValueError(f"translate must be a bool, 'auto', 'ids' or 'text', got {value!r}")
        self._translate = value or False

    def set_source(self, path):
        """The draft GGUF to load at ``bind`` (subclasses that derive it late use this)."""
        self._source = path

    @property
    def has_model(self):
        return True

    def close(self):
        """Free the draft context now (the drafter cannot draft afterwards)."""
        if self.draft_ctx is not None:
            self.draft_ctx.close()
            self.draft_ctx = None
            self.batch = None

    cdef int bind_c(self, Context target, int n_seq) except -1:
        Drafter.bind_c(self, target, n_seq)
        if self._source is None:
            raise ValueError("no draft model to load")
        self.draft_model = self.own_model(self._source, target.model)
        kind = _FED_DRAFTS.get(self.draft_model.arch)
        if kind is not None:
            raise ValueError(f"{os.path.basename(self.draft_model.path)!r} is {kind[0]} draft, "
                             f"which reads the target's hidden states: load it as {kind[1]}:PATH, "
                             f"not draft:PATH")
        if self.draft_model.is_recurrent or self.draft_model.is_hybrid:
            raise ValueError("recurrent/hybrid draft models are not supported: their state cannot "
                             "be rolled back across the draft's several decodes")
        self.translation = None
        same = target.model.vocab_compatible(self.draft_model)
        if not same and not self._translate:
            raise ValueError(f"draft model {os.path.basename(self.draft_model.path)!r} has a "
                             f"vocabulary incompatible with the target {target.model.arch!r}; "
                             "translate=True (--draft-translate) drafts through text")
        if self._translate in ("ids", "text") or (self._translate and not same):
            self.translation = translation(target.model, self.draft_model, self._translate)
            self.translation.bind(n_seq)
        # through text the draft may spell the history in more tokens than the target
        cdef int n_ctx = target.n_ctx * (2 if self.translation is not None
                                         and self.translation.mode == "text" else 1)
        self.draft_ctx = Context(self.draft_model, n_ctx=n_ctx, n_batch=target.n_batch,
                                 n_seq_max=n_seq,
                                 n_threads=self.n_threads or target.n_threads)
        self.batch = Batch(self.draft_ctx.n_batch, n_seq_max=n_seq)
        self.in_ctx.clear()
        self.in_ctx.resize(n_seq)
        self.todo.clear()
        self.todo.resize(n_seq)
        self.n_hist.assign(n_seq, 0)
        return 0

    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1:
        self._check_bound(seq)
        self.draft_ctx.seq_rm_c(seq, -1, -1)
        self.in_ctx[seq].clear()
        self.todo[seq].clear()
        self.n_hist[seq] = 0
        if self.translation is not None:
            self.translation.begin(seq)
        return 0

    cdef int _check_bound(self, int seq) except -1:
        if self.draft_ctx is None:
            raise RuntimeError("the draft drafter is not bound to a target (Decoder does this)")
        if seq < 0 or seq >= <int>self.in_ctx.size():
            raise ValueError(f"sequence {seq} out of range for the draft context")
        return 0

    cdef int _trim(self, int seq, int keep) except -1:
        """Keep the first ``keep`` tokens of what the context holds or has queued."""
        cdef int n_in = self.in_ctx[seq].size()
        if keep < n_in + <int>self.todo[seq].size():
            self.todo[seq].resize(max(0, keep - n_in))
        if n_in > keep:
            self.draft_ctx.seq_rm_c(seq, keep, -1)
            self.in_ctx[seq].resize(keep)
        return 0

    cdef int _flush_todo(self, int seq) except -1:
        """Decode the queued history of ``seq`` now."""
        cdef vector[int32_t] toks
        if self.todo[seq].size():
            toks.swap(self.todo[seq])
            self._decode(seq, toks.data(), toks.size(), False)
        return 0

    cdef int _decode(self, int seq, const int32_t * toks, int n, bint out_last) except -1:
        """Decode ``toks`` after what the context holds; the batch row of the last one."""
        cdef int i0 = 0, i, m = 0, pos
        while i0 < n:
            m = min(n - i0, self.draft_ctx.n_batch)
            self.batch.clear_c()
            for i in range(m):
                pos = self.in_ctx[seq].size()
                self.batch.add_c(toks[i0 + i], pos, seq, out_last and i0 + i == n - 1)
                self.in_ctx[seq].push_back(toks[i0 + i])
            self.draft_ctx.decode_c(self.batch)
            i0 += m
        return m - 1

    cdef int _sync(self, int seq, const vector[int32_t] & want, bint logits) except -2:
        """Make the context hold ``want``: keep the common prefix, decode the rest (the
        last one again when ``logits`` asks for its row). The row, or -1: no room."""
        cdef vector[int32_t] * have = &self.in_ctx[seq]
        cdef int m = 0, n = want.size()
        while m < n and m < <int>have.size() and have[0][m] == want[m]:
            m += 1
        if logits and m == n:
            m -= 1
        self._trim(seq, m)
        if n >= self.draft_ctx.n_ctx_seq:
            return -1
        self.n_hist[seq] = n
        if m < n:
            return self._decode(seq, want.data() + m, n - m, logits)
        return -1

    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1:
        self._check_bound(seq)
        if self.translation is not None:
            self._sync(seq, self.translation.observe(seq, toks, n)[0], False)
            return 0
        cdef int base = self.n_hist[seq], m = 0
        cdef vector[int32_t] * have = &self.in_ctx[seq]
        # keep what the draft context already holds of these tokens (its accepted drafts)
        while m < n and base + m < <int>have.size() and have[0][base + m] == toks[m]:
            m += 1
        self._trim(seq, base + m)
        # the rest waits for the next draft's first decode, unless more than a round's worth
        # gathered (a prompt chunk, rounds without drafts): that is decoded now
        self.todo[seq].insert(self.todo[seq].end(), toks + m, toks + n)
        if <int>self.todo[seq].size() > self.n_max + 1:
            self._flush_todo(seq)
        self.n_hist[seq] = base + n
        return 0

    cdef bint _below_p_min(self, const float * lg, int32_t y) noexcept nogil:
        cdef int j
        cdef double z = 0.0, mx = lg[y]
        if self.p_min <= 0.0:
            return False
        for j in range(self.draft_model.n_vocab):
            z += exp(lg[j] - mx)
        return 1.0 / z < self.p_min

    cdef int _propose_translated(self, int seq, int32_t last, int n_max, Draft out) except -1:
        cdef Translation tr = self.translation
        cdef vector[int32_t] * want = tr.context(seq, last)
        if want.size() == 0:
            return 0
        cdef int row = self._sync(seq, want[0], True), i, r
        if row < 0:
            return 0
        cdef int32_t y
        cdef float * lg
        tr.draft_start(seq)
        for i in range(tr.budget(n_max)):
            lg = self.draft_ctx.logits_c(row)
            y = argmax(lg, self.draft_model.n_vocab)
            if self._below_p_min(lg, y):
                break
            r = tr.draft_add(y)
            if r < 0 or tr.eog or r >= n_max:
                break
            if <int>self.in_ctx[seq].size() >= self.draft_ctx.n_ctx_seq:
                break
            row = self._decode(seq, &y, 1, True)
        tr.draft_finish(out, n_max)
        return 0

    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1:
        self._check_bound(seq)
        if self.translation is not None:
            return self._propose_translated(seq, last, n_max, out)
        cdef int n_vocab = self.draft_model.n_vocab, i, row
        cdef int32_t tok = last, y
        cdef float * lg
        cdef vector[int32_t] first
        self._trim(seq, self.n_hist[seq])
        for i in range(n_max):
            if <int>(self.in_ctx[seq].size() + self.todo[seq].size()) >= self.draft_ctx.n_ctx_seq:
                break
            # the first step takes the queued history along
            first.swap(self.todo[seq])
            first.push_back(tok)
            row = self._decode(seq, first.data(), first.size(), True)
            first.clear()
            lg = self.draft_ctx.logits_c(row)
            y = argmax(lg, n_vocab)
            if self._below_p_min(lg, y):
                break
            out.tokens.push_back(y)
            tok = y
        return 0

    cdef int _propose_batch(self, Asks asks) except -1:
        """Every ask's draft, one decode per draft step for all of them (the first step with
        their queued history; a translated draft: one sequence at a time)."""
        cdef int n = asks.n()
        if self.translation is not None or n <= 1:
            return Drafter._propose_batch(self, asks)
        cdef int j, i, k, seq, steps = 0, rows = 0, n_act
        cdef int n_vocab = self.draft_model.n_vocab, n_ctx_seq = self.draft_ctx.n_ctx_seq
        cdef vector[int] idx
        cdef vector[int32_t] tok
        cdef vector[char] live
        idx.resize(n)
        tok.resize(n)
        live.assign(n, 0)
        for j in range(n):
            seq = asks.seq[j]
            self._check_bound(seq)
            tok[j] = asks.last[j]
            if asks.n_max[j] <= 0:
                continue
            self._trim(seq, self.n_hist[seq])
            live[j] = 1
            steps = max(steps, asks.n_max[j])
            rows += self.todo[seq].size() + 1
        cdef double t0
        if rows > self.batch.capacity:
            # more queued than one decode takes: catch up first (not a cost of drafting)
            t0 = now()
            for j in range(n):
                self._flush_todo(asks.seq[j])
            self.t_sync = now() - t0
        cdef int32_t y
        cdef float * lg
        for i in range(steps):
            self.batch.clear_c()
            n_act = 0
            for j in range(n):
                if not live[j]:
                    continue
                seq = asks.seq[j]
                if i >= asks.n_max[j] or \
                        <int>(self.in_ctx[seq].size() + self.todo[seq].size()) >= n_ctx_seq:
                    live[j] = 0
                    continue
                for k in range(<int>self.todo[seq].size()):
                    self.batch.add_c(self.todo[seq][k], self.in_ctx[seq].size(), seq, False)
                    self.in_ctx[seq].push_back(self.todo[seq][k])
                self.todo[seq].clear()
                idx[j] = self.batch.b.n_tokens
                self.batch.add_c(tok[j], self.in_ctx[seq].size(), seq, True)
                self.in_ctx[seq].push_back(tok[j])
                n_act += 1
            if n_act == 0:
                break
            self.draft_ctx.decode_c(self.batch)
            for j in range(n):
                if not live[j]:
                    continue
                lg = self.draft_ctx.logits_c(idx[j])
                y = argmax(lg, n_vocab)
                if self._below_p_min(lg, y):
                    live[j] = 0
                    continue
                (<Draft> asks.drafts[j]).tokens.push_back(y)
                tok[j] = y
        return 0

    cdef int _reset(self, int seq) except -1:
        if self.draft_ctx is not None and 0 <= seq < <int>self.in_ctx.size():
            self.draft_ctx.seq_rm_c(seq, -1, -1)
            self.in_ctx[seq].clear()
            self.todo[seq].clear()
            self.n_hist[seq] = 0
            if self.translation is not None:
                self.translation.begin(seq)
        return 0

