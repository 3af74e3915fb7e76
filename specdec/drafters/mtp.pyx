# cython: language_level=3
# distutils: language = c++
"""The MTP ("NextN") drafter: the target's own multi-token-prediction head drafts.

The head runs in an MTP context (its own KV, NextN layers only). Its input at
position ``p`` is the pair (token ``x_p``, target hidden row ``h_{p-1}``), where
``h`` is the target's post-norm hidden state (the target context runs with
``mtp_hidden="dense"``: one row per batch entry). So the MTP context has to mirror
every token that enters the target, one position behind in ``h``.

Per round, for one sequence, this costs ``n`` MTP decodes for ``n`` drafts and
nothing else:

* ``observe`` (right after each target decode) copies the committed tokens and
  the target rows they need into the sequence's queue (one copy per row, no
  decode): the catch-up is queued, not run;
* ``propose`` appends ``(last, h_last)`` to that queue and decodes it all at
  once: the first draft step *is* the catch-up decode. Later steps feed the
  head its own output row (the single head is applied recurrently, as
  llama.cpp's draft-mtp does) and take the argmax of the logits directly;
* while no drafts are asked for (the adaptive policy or the batch's floor holds the
  sequence plain), its rows wait in its queue, never decoded: a plain round costs a
  copy per row. When drafting resumes, the whole queue is decoded in one batch (see
  ``_target_fed``), so the resumed drafts are the ones a head kept current would make;
* afterwards only the draft rows past ``last`` are trimmed: the row of ``last``
  was built from the target's own ``h`` and stays, so the next catch-up starts
  at the first accepted draft. Rejected drafts never enter the MTP context, so
  acceptance needs no trimming.

The MTP contexts run with ``mtp_hidden="dense"``: in masked mode llama.cpp copies
the first ``n_outputs`` rows of the MTP graph's (unpruned) hidden states, so a
draft row decoded behind catch-up rows would get the first catch-up row's ``h``.
The archs whose MTP graph prunes to the output rows first (``MTP_PRUNED_ARCHS``,
qwen3next among them) hold exactly those rows, so their MTP contexts run masked.

Several sequences drafting in one round (``propose_batch``) share each draft step's decode:
step ``i`` holds one row per sequence still drafting (step 0 also the queued catch-up of
them all), so a round costs ``n_max`` MTP decodes however many sequences draft, and each
sequence's draft stops on its own (its cap, ``p_min``, end of generation).

Models with several trained heads (step35, mimo2, hy_v3) chain them instead:
draft step ``i`` runs head ``i`` over the whole prefix, llama.cpp's
``chain_heads``. Each head gets its own MTP context pinned to its layer with
``set_mtp_head``, so no head's KV is ever rewritten under another's. Several sequences
share each step's decode there too: step ``i`` holds every drafting sequence's prefix rows.
"""
from libc.stdint cimport int32_t
from libc.string cimport memcpy
from libcpp.vector cimport vector

from .._core cimport Model, Context
from .._timing cimport now
from .._sampling cimport argmax, prob_at_least
from ._base cimport Drafter, Draft, Asks
from ._target_fed cimport TargetFedDrafter

import os

from .._archs import MTP_ARCHS, MTP_PRUNED_ARCHS, MTP_MULTI_HEAD_ARCHS as CHAIN_ARCHS
from .mtp_head import HEAD_TYPES, derive_mtp_head_gguf



cdef class MtpDrafter(TargetFedDrafter):
    """MtpDrafter(path=None, *, p_min=None, n_threads=None, name="mtp")
--

    ``mtp``: draft with the target's MTP head; ``mtp:PATH``: with an MTP-only GGUF;
    ``mtp:q8_0`` / ``mtp:q5_0`` / ``mtp:q4_0``: with a requantized copy of the target's own
    head (``mtp_head.derive_mtp_head_gguf``, written once into the cache). A draft step
    reads the whole head, mostly its vocab projection, so a smaller copy drafts faster;
    the target still verifies every draft, so only acceptance can change, never output.

    ``p_min`` stops a draft when the head's probability of its own guess falls
    below it (taken from the Decoder's ``p_min`` unless given here).
    """

    def __init__(self, path=None, *, p_min=None, n_threads=None, n_gpu_layers=None, name="mtp"):
        super().__init__(name)
        self.n_gpu_layers = n_gpu_layers
        self._source = None if path in (None, "") else path
        self._set_p_min(p_min, 0.0)
        self.n_threads = 0 if n_threads is None else int(n_threads)

    @property
    def needs_mtp_hidden(self):
        """The head reads the target's hidden state of every row of every decode."""
        return True

    def close(self):
        TargetFedDrafter.close(self)
        self.mtp_ctx = None

    cdef int _head_count(self, Model mm) except -1:
        """Heads to chain: the model's own (one context per NextN layer), else one."""
        return mm.n_mtp_layers if mm.n_mtp_layers > 1 else 1

    # --- setup ------------------------------------------------------------------------

    cdef int bind_c(self, Context target, int n_seq) except -1:
        Drafter.bind_c(self, target, n_seq)
        cdef Model tm = target.model
        if target.is_mtp:
            raise ValueError("bind the MTP drafter to the target context, not to an MTP context")
        if tm.arch not in MTP_ARCHS:
            raise ValueError(f"architecture {tm.arch!r} has no MTP graph in llama.cpp: the mtp "
                             "drafter cannot run on it")
        src = self._source
        if isinstance(src, str) and src.lower() in HEAD_TYPES:
            if tm.n_mtp_layers <= 0:
                raise ValueError(f"model {os.path.basename(tm.path)!r} has no MTP (NextN) layers "
                                 f"to derive a {src} head from")
            src = str(derive_mtp_head_gguf(tm.path, src.lower()))
        if src is None and self.n_gpu_layers is not None \
                and self.n_gpu_layers != tm.placement.n_gpu_layers:
            # the head placed apart from the target (e.g. on the CPU under a GPU target):
            # the target's file again, placed as asked, of which only the head is used
            src = tm.path
        if src is None:
            self.mtp_model = tm
            if tm.n_mtp_layers <= 0:
                raise ValueError(f"model {os.path.basename(tm.path)!r} has no MTP (NextN) layers: "
                                 "give an MTP head file with mtp:PATH")
            if not tm.mtp_loaded:
                raise ValueError("the target was loaded with load_mtp=False: load it with "
                                 "Model(path, load_mtp=True) (Decoder does so for drafter='mtp')")
        else:
            self.mtp_model = self.own_model(src, tm, load_mtp=True)
            m = self.mtp_model
            name = os.path.basename(m.path)
            if m.n_mtp_layers <= 0:
                raise ValueError(f"MTP file {name!r} has no MTP (NextN) layers")
            if not m.mtp_loaded:
                raise ValueError(f"MTP model {name!r} was loaded with load_mtp=False")
            if m.arch != tm.arch:
                raise ValueError(f"MTP file {name!r} is for {m.arch!r}, the target is {tm.arch!r}")
            if m.n_embd_out != tm.n_embd_out:
                raise ValueError(f"MTP file {name!r} takes hidden rows of {m.n_embd_out} floats, "
                                 f"the target makes {tm.n_embd_out}")
            if not tm.vocab_compatible(m):
                raise ValueError(f"MTP file {name!r} has a vocabulary incompatible with the target")
        cdef Model mm = self.mtp_model
        if mm.n_mtp_layers > 1 and mm.arch not in CHAIN_ARCHS:
            raise ValueError(f"llama.cpp's {mm.arch} MTP graph runs one NextN layer, the model "
                             f"has {mm.n_mtp_layers}")
        # (targets without n_rollback snapshots roll back by checkpoints, at any depth)
        if ((tm.is_recurrent or tm.is_hybrid) and tm.supports_partial_rollback
                and target.n_rollback < self.rollback_depth):
            raise ValueError(f"n_rollback={target.n_rollback} of the target context is too small "
                             f"for MTP drafts of {self.rollback_depth} tokens: create it with "
                             "n_rollback >= n_max")
        if target.mtp_hidden != "dense":
            target.set_mtp_hidden("dense")
        self.n_heads = self._head_count(mm)
        # a whole target batch of catch-up plus a draft row per sequence
        cdef int cap = target.n_batch + n_seq
        ctxs = []
        for h in range(self.n_heads):
            # dense: llama.cpp's masked mode hands back the ubatch's *first* rows, wrong
            # for a draft row queued behind catch-up rows, unless the graph pruned to
            # the output rows (see the module notes)
            ctx = Context(mm, kind="mtp", n_ctx=target.n_ctx, n_batch=cap, n_seq_max=n_seq,
                          n_threads=self.n_threads or target.n_threads,
                          mtp_hidden="masked" if mm.arch in MTP_PRUNED_ARCHS else "dense")
            if ctx.n_ctx_seq < target.n_ctx_seq:
                raise ValueError(f"the MTP context holds {ctx.n_ctx_seq} positions per sequence, "
                                 f"the target {target.n_ctx_seq}")
            if mm.n_mtp_layers > 1:
                ctx.set_mtp_head(h)
            ctxs.append(ctx)
        self._bind_fed(ctxs, n_seq, cap, mm.n_embd_out)
        self.mtp_ctx = ctxs[0]
        self.n_vocab_draft = min(mm.n_vocab, tm.n_vocab)
        self.chain_h.resize(<size_t>(self.n_heads + 1) * self.n_embd)
        self.chain_tok.resize(self.n_heads + 1)
        self.one = Asks()
        return 0

    # --- hooks ------------------------------------------------------------------------

    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1:
        """Queue (x_p, h_{p-1}) for each committed token; keep h of the last one."""
        self._check_bound(seq)
        if n <= 0:
            return 0
        if row0 < 0:
            raise ValueError("the mtp drafter needs the target's hidden rows: observe must name "
                             "the batch index (row0) of these tokens in the last target decode")
        cdef int p0 = <int>self.hist(seq).size() - n     # the history has these tokens already
        cdef Context t = self._target
        cdef int i = 0
        cdef const float * h
        # the row of the pending token, decoded while drafting from the target's own h
        i = self._seed_kept(seq, p0, toks[0])
        for i in range(i, n):
            if i == 0:
                h = self.pend[seq].data()
            else:
                h = t.mtp_hidden_c(row0 + i - 1)
                if h == NULL:
                    raise RuntimeError(f"no target hidden row at batch index {row0 + i - 1}: the "
                                       "target context must run with mtp_hidden='dense'")
            self._queue(toks[i], p0 + i, seq, h)
        h = t.mtp_hidden_c(row0 + n - 1)
        if h == NULL:
            raise RuntimeError(f"no target hidden row at batch index {row0 + n - 1}: the target "
                               "context must run with mtp_hidden='dense'")
        memcpy(self.pend[seq].data(), h, self.n_embd * sizeof(float))
        self.n_sync[seq] = p0 + n
        self.kept_tok[seq] = -1
        return 0

    cdef bint _confident(self, const float * lg, int32_t y) noexcept nogil:
        """Whether softmax(lg)[y] >= p_min (y is the argmax)."""
        return prob_at_least(lg, self.n_vocab_draft, y, self.p_min)

    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1:
        if self.n_heads > 1:
            self.one.clear()
            self.one.add(seq, last, n_max, self.p_stop, out)
            try:
                return self._propose_chain(self.one)
            finally:
                self.one.drafts = []
        self._check_bound(seq)
        cdef int p0 = self.hist(seq).size()
        if n_max <= 0:
            return 0
        self._sync_at(seq, p0)
        cdef double t0
        # a round leaves at most n_max + 1 rows queued (the configured n_max: the cap of
        # this call may be shorter); more means rounds went by without drafts (or a prompt
        # came in): catch up on its own, so the draft steps' time stays a measure of
        # drafting for the adaptive policy
        if self.n_queued(seq) > max(n_max, self.n_max) + 1:
            t0 = now()
            self._flush_seq(seq)
            self.t_sync = now() - t0
        else:
            self._load(seq)
        cdef Context c = self.mtp_ctx
        cdef Model tm = self._target.model
        cdef int i, idx, n_dec = 0
        cdef int n_ctx_seq = c.n_ctx_seq
        cdef int32_t tok = last, y
        cdef const float * h = self.pend[seq].data()
        cdef const float * lg
        for i in range(n_max):
            if p0 + i >= n_ctx_seq:
                break
            if self.batch.b.n_tokens >= self.batch.capacity:
                self._flush_batch()
            idx = self.batch.b.n_tokens
            self.batch.add_embd_c(tok, p0 + i, seq, True, h)
            t0 = now()
            c.decode_c(self.batch)        # step 0 also decodes the queued catch-up
            self.t_decode += now() - t0
            self.batch.clear_c()
            self.n_decodes += 1
            n_dec += 1
            lg = c.logits_c(idx)
            h = c.mtp_hidden_c(idx)
            if lg == NULL or h == NULL:
                raise RuntimeError("the MTP context gave no output for a draft row")
            y = argmax(lg, self.n_vocab_draft)
            if not self._confident(lg, y):
                break
            out.tokens.push_back(y)
            if tm.is_eog_c(y):
                break
            tok = y
        # keep the row of ``last`` (built from the target's h); the rest was the head's own
        self._keep_seed(seq, p0, last, n_dec)
        return 0

    cdef int _start_asks(self, Asks asks, vector[int] & p0, vector[char] & live) except -1:
        """Before a batch's draft steps: each ask's position (``p0``), whether it drafts
        (``live``: a cap above 0, its pairs synced there); returns the largest cap."""
        cdef int j, seq, most = 0
        p0.resize(asks.n())
        live.assign(asks.n(), 0)
        for j in range(asks.n()):
            seq = asks.seq[j]
            self._check_bound(seq)
            p0[j] = self.hist(seq).size()
            if asks.n_max[j] <= 0:
                continue
            self._sync_at(seq, p0[j])
            live[j] = 1
            most = max(most, asks.n_max[j])
        return most

    cdef int _propose_batch(self, Asks asks) except -1:
        """Every ask's draft, one MTP decode per draft step for all of them (chained heads:
        one decode of each head's context, ``_propose_chain``)."""
        cdef int n = asks.n()
        if self.n_heads > 1:
            return self._propose_chain(asks)
        if n <= 1:
            return Drafter._propose_batch(self, asks)
        cdef int j, i, steps = 0, most = self.n_max, n_act
        cdef vector[int] p0, idx, n_dec
        cdef vector[int32_t] tok
        cdef vector[const float *] h
        cdef vector[char] live
        idx.resize(n)
        n_dec.assign(n, 0)
        tok.resize(n)
        h.resize(n)
        steps = self._start_asks(asks, p0, live)
        most = max(most, steps)
        for j in range(n):
            tok[j] = asks.last[j]
            if live[j]:
                h[j] = self.pend[asks.seq[j]].data()
        # the drafting sequences' queues (the others' wait); more queued rows than the rounds
        # leave (see _propose): that catch-up runs on its own, so the draft steps' time stays
        # a measure of drafting
        cdef double t0 = now()
        cdef bint behind = False
        for j in range(n):
            if live[j]:
                behind = behind or self.n_queued(asks.seq[j]) > most + 1
                self._load(asks.seq[j])
        if behind:
            self._flush_batch()
            self.t_sync = now() - t0
        cdef Context c = self.mtp_ctx
        cdef Model tm = self._target.model
        cdef int n_ctx_seq = c.n_ctx_seq
        cdef int32_t y
        cdef const float * lg
        cdef Draft out
        for i in range(steps):
            n_act = 0
            for j in range(n):
                if live[j] and (i >= asks.n_max[j] or p0[j] + i >= n_ctx_seq):
                    live[j] = 0
                n_act += live[j]
            if n_act == 0:
                break
            if self.batch.b.n_tokens + n_act > self.batch.capacity:
                self._flush_batch()
            for j in range(n):
                if live[j]:
                    idx[j] = self.batch.b.n_tokens
                    self.batch.add_embd_c(tok[j], p0[j] + i, asks.seq[j], True, h[j])
            t0 = now()
            c.decode_c(self.batch)        # step 0 also decodes the queued catch-up
            self.t_decode += now() - t0
            self.batch.clear_c()
            self.n_decodes += 1
            for j in range(n):
                if not live[j]:
                    continue
                n_dec[j] += 1
                lg = c.logits_c(idx[j])
                h[j] = c.mtp_hidden_c(idx[j])      # read by the next step's add, before its decode
                if lg == NULL or h[j] == NULL:
                    raise RuntimeError("the MTP context gave no output for a draft row")
                y = argmax(lg, self.n_vocab_draft)
                if not self._confident(lg, y):
                    live[j] = 0
                    continue
                out = <Draft> asks.drafts[j]
                out.tokens.push_back(y)
                if tm.is_eog_c(y):
                    live[j] = 0
                tok[j] = y
        for j in range(n):
            # keep each row of ``last`` (built from the target's h); the rest was the head's own
            self._keep_seed(asks.seq[j], p0[j], asks.last[j], n_dec[j])
        return 0

    cdef int _propose_chain(self, Asks asks) except -1:
        """Chained heads for every ask: step ``i`` runs head ``i`` over ``(last, d_0..d_{i-1})``
        with rows ``(h_last, out_0..out_{i-1})`` of every sequence still drafting, in one
        decode of head ``i``'s context (several where their rows outgrow its batch), so a
        round costs at most ``n_heads`` decodes however many sequences draft."""
        cdef int n = asks.n(), E = self.n_embd, W = self.n_heads + 1
        cdef int j, k, i, t, first, steps
        cdef vector[int] p0, out_row
        cdef vector[char] live
        cdef Context c
        cdef const float * lg
        cdef const float * h
        cdef int32_t y
        cdef Draft out
        out_row.resize(n)
        steps = min(self._start_asks(asks, p0, live), self.n_heads)
        for j in range(n):
            if live[j]:
                self._load(asks.seq[j])     # the others' queues wait
        self._flush_batch()
        if <int>self.chain_tok.size() < n * W:
            self.chain_tok.resize(n * W)
            self.chain_h.resize(<size_t>n * W * E)
        for j in range(n):
            if live[j]:
                memcpy(self.chain_h.data() + <size_t>j * W * E, self.pend[asks.seq[j]].data(),
                       E * sizeof(float))
                self.chain_tok[j * W] = asks.last[j]
        for i in range(steps):
            c = <Context> self.fed_ctxs[i]
            for j in range(n):
                if live[j] and (i >= asks.n_max[j] or p0[j] + i >= self.mtp_ctx.n_ctx_seq):
                    live[j] = 0
            j = 0
            while j < n:
                first = j
                while j < n and (not live[j] or self.batch.b.n_tokens + i + 1 <= self.batch.capacity):
                    if live[j]:
                        out_row[j] = self.batch.b.n_tokens + i
                        for t in range(i + 1):
                            self.batch.add_embd_c(self.chain_tok[j * W + t], p0[j] + t, asks.seq[j],
                                                  t == i, self.chain_h.data() + <size_t>(j * W + t) * E)
                    j += 1
                if self.batch.b.n_tokens == 0:
                    if j < n:
                        raise RuntimeError("a chained draft step outgrows the MTP batch")
                    break
                c.decode_c(self.batch)
                self.batch.clear_c()
                self.n_decodes += 1
                for k in range(first, j):
                    if not live[k]:
                        continue
                    lg = c.logits_c(out_row[k])
                    h = c.mtp_hidden_c(out_row[k])
                    if lg == NULL or h == NULL:
                        raise RuntimeError("the MTP context gave no output for a draft row")
                    y = argmax(lg, self.n_vocab_draft)
                    # copy before the trim: the outputs stay, but keep the order obvious
                    self.chain_tok[k * W + i + 1] = y
                    memcpy(self.chain_h.data() + <size_t>(k * W + i + 1) * E, h, E * sizeof(float))
                    # head i's draft region: rebuilt from scratch next time
                    c.seq_rm_c(asks.seq[k], p0[k], -1)
                    if not self._confident(lg, y):
                        live[k] = 0
                        continue
                    out = <Draft> asks.drafts[k]
                    out.tokens.push_back(y)
                    if self._target.model.is_eog_c(y):
                        live[k] = 0
        return 0

    # --- introspection ----------------------------------------------------------------

    def counters(self) -> dict:
        """MTP decodes run, catch-up rows queued and decoded, flushes forced (since bind)."""
        return {"decodes": self.n_decodes, "catchup_rows": self.n_catchup,
                "catchup_decoded": self.n_caught_up,
                "flushes": self.n_flushes, "heads": self.n_heads, "t_decode_s": self.t_decode}

