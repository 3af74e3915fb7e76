# cython: language_level=3
# distutils: language = c++
"""The EAGLE-3 drafter: a one-layer draft head fed the target's intermediate layer inputs
(llama.cpp's ``draft-eagle3``, common/speculative.cpp).

The draft GGUF (arch ``eagle3``) names the target layers it reads (``target_layers``, three
of them). The target context keeps those layers' inputs for every row it decodes
(``Context.set_layer_inputs``); the draft context runs two graphs:

* the *encoder*: the three rows of position ``P`` side by side, through ``fc``, give ``g_P``;
* the *decoder*: at position ``P`` it takes the pair (token ``x_{P+1}``, ``g_P``) and
  predicts ``x_{P+2}``; its pre-norm state is the ``g`` of the next draft step.

So the pair of the newest committed position waits for the next token, which only the
target's next sample gives (the "deferred boundary" of llama.cpp). Per round and sequence:

* ``observe`` copies the committed rows' features and holds them (the target's rows are
  valid until its next decode only): a round that does not draft runs no encoder;
* ``propose`` encodes the held rows (one encoder call), which completes their pairs and
  gives the deferred ``g``; then it decodes the queue together with the seed pair (``last``,
  deferred ``g``),
  every row marked an output (llama.cpp's eagle3 decoder computes all rows' logits and
  hands out the first ``n_outputs``, so a batch mixing output and non-output rows would
  misalign them), then the draft steps, one row each, taking the argmax;
* afterwards only the seed pair stays in the draft KV: it was built from the target's own
  features; the draft steps' pairs used the draft's own state and are trimmed.

Several sequences drafting in one round (``propose_batch``) share the encoder call (their
held rows together) and each draft step's decode (one row per sequence still drafting, the
first step also their queued pairs and seed pairs), so a round costs one encode and
``n_max`` draft decodes however many sequences draft.

Tokens that entered the target without rows to read (a reused prompt prefix) get zero
features, as llama.cpp's draft-simple does for rows it cannot read.
"""
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy
from libcpp.vector cimport vector

from .._core cimport Model, Context, Batch
from .._timing cimport now
from .._sampling cimport argmax, prob_at_least
from ._base cimport Drafter, Draft, Asks
from ._target_fed cimport TargetFedDrafter

import os

from .._archs import LAYER_DRAFT_ARCHS, LAYER_INPUT_ARCHS
from ..config import N_MAX_LIMIT


cdef class Eagle3Drafter(TargetFedDrafter):
    """Eagle3Drafter(path, *, p_min=None, n_threads=None, n_gpu_layers=None, name="eagle3")
--

    ``eagle3:PATH``: draft with the EAGLE-3 head in ``PATH`` (or a loaded ``Model``), which
    reads the target layers it names. ``p_min`` stops a draft when the head's probability of
    its own guess falls below it (None: the Decoder's ``p_min``)."""
    cdef readonly Model draft_model
    cdef readonly Context draft_ctx
    cdef Batch enc                       # feature rows for the encoder
    cdef object _source
    cdef int n_threads
    cdef readonly tuple layers           # target layers read, in the draft's order
    cdef vector[int32_t] lids            # the same, for the hot path
    cdef int n_embd_tgt
    cdef int n_vocab_draft
    cdef vector[float] zeros             # the features of a row the target did not hand out
    cdef vector[float] h                 # the draft step's pre-norm state
    cdef vector[vector[float]] feat      # per seq: held feature rows (3 target rows each)
    cdef vector[int32_t] n_feat          # per seq: rows held
    cdef vector[int32_t] feat_p0         # per seq: position of the first row held
    cdef int64_t n_encodes
    cdef double t_encode                 # seconds spent in encoder calls

    def __init__(self, path=None, *, p_min=None, n_threads=None, n_gpu_layers=None,
                 name="eagle3"):
        super().__init__(name)
        if path in (None, ""):
            raise ValueError("the eagle3 drafter needs a draft GGUF: eagle3:PATH")
        self.n_gpu_layers = n_gpu_layers
        self._source = path
        self._set_p_min(p_min, 0.0)
        self.n_threads = 0 if n_threads is None else int(n_threads)

    def close(self):
        TargetFedDrafter.close(self)
        self.draft_ctx = None
        self.enc = None

    # --- setup ------------------------------------------------------------------------

    cdef int bind_c(self, Context target, int n_seq) except -1:
        Drafter.bind_c(self, target, n_seq)
        cdef Model tm = target.model
        self.draft_model = self.own_model(self._source, tm)
        cdef Model dm = self.draft_model
        name = os.path.basename(dm.path)
        if dm.arch not in LAYER_DRAFT_ARCHS:
            raise ValueError(f"{name!r} is a {dm.arch!r} model, not an EAGLE-3 draft")
        if tm.arch not in LAYER_INPUT_ARCHS:
            raise ValueError(f"the target's architecture {tm.arch!r} does not hand out its layer "
                             f"inputs in llama.cpp, so no EAGLE-3 draft can read it")
        layers = dm.target_layers
        if len(layers) != 3:
            raise ValueError(f"{name!r} reads {len(layers)} target layers; EAGLE-3 reads 3")
        bad = [i for i in layers if not 0 <= i < tm.n_layer]
        if bad:
            raise ValueError(f"{name!r} reads target layers {list(layers)}, but the target has "
                             f"{tm.n_layer} layers: {bad} do not exist")
        if dm.target_hidden_size != tm.n_embd:
            raise ValueError(f"{name!r} was made for a target of hidden size "
                             f"{dm.target_hidden_size}; this target's is {tm.n_embd}")
        if not tm.vocab_compatible(dm):
            raise ValueError(f"{name!r} has a vocabulary incompatible with the target "
                             f"({dm.n_vocab} vs {tm.n_vocab} tokens)")
        self.layers = tuple(layers)
        self.lids = list(layers)
        target.set_layer_inputs(self.layers)
        cdef int cap = target.n_batch + n_seq    # a target batch of catch-up, a row per sequence
        # lazy head: the decoder's LM head runs over every row of a batch (catch-up rows
        # included); the drafter reads the last row's logits only
        # the target's layout: one KV for all sequences (each may use all of it: an Engine's
        # slots), with room for every sequence's draft rows, or a stream each
        cdef bint unified = n_seq > 1 and target.kv_unified
        self.draft_ctx = Context(dm, n_ctx=target.n_ctx + (n_seq * (N_MAX_LIMIT + 1) if unified
                                                           else 0),
                                 n_batch=cap, n_seq_max=n_seq,
                                 n_threads=self.n_threads or target.n_threads,
                                 mtp_hidden="dense", other=target,
                                 lazy_logits=dm.placement.n_gpu_layers == 0,
                                 kv_unified=unified if n_seq > 1 else None)
        if self.draft_ctx.n_ctx_seq < target.n_ctx_seq:
            raise ValueError(f"the draft context holds {self.draft_ctx.n_ctx_seq} positions per "
                             f"sequence, the target {target.n_ctx_seq}")
        self._bind_fed([self.draft_ctx], n_seq, cap, dm.n_embd)
        self.n_embd_tgt = tm.n_embd
        self.n_vocab_draft = min(dm.n_vocab, tm.n_vocab)
        self.enc = Batch(self.draft_ctx.n_ubatch, n_embd=3 * self.n_embd_tgt, n_seq_max=n_seq)
        self.zeros.assign(self.n_embd_tgt, 0.0)
        self.h.assign(self.n_embd, 0.0)
        self.feat.assign(n_seq, vector[float]())
        self.n_feat.assign(n_seq, 0)
        self.feat_p0.assign(n_seq, 0)
        self.n_encodes = 0
        self.t_encode = 0.0
        return 0

    # --- hooks (the queue of catch-up pairs: TargetFedDrafter) ------------------------

    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1:
        """Hold the features of the committed rows (``propose`` encodes them)."""
        self._check_bound(seq)
        if n <= 0:
            return 0
        cdef int p0 = <int>self.hist(seq).size() - n   # positions of toks: p0 .. p0+n-1
        cdef int i = 0, j, k
        cdef int E = self.n_embd_tgt
        cdef Context t = self._target
        cdef const float * src
        cdef float * dst
        # the pair of p0 - 1 is (toks[0], g_{p0-1}): in the KV already when the seed of the
        # last propose was exactly that; completed when its row is encoded if it is held
        if p0 > 0:
            i = self._seed_kept(seq, p0 - 1, toks[0])
        if i == 0 and p0 > 0 and self.n_feat[seq] == 0:
            self._queue(toks[0], p0 - 1, seq, self.pend[seq].data())
        if self.n_feat[seq] == 0:
            self.feat_p0[seq] = p0
        elif self.feat_p0[seq] + self.n_feat[seq] != p0:
            raise RuntimeError(f"the EAGLE-3 features of sequence {seq} end at "
                               f"{self.feat_p0[seq] + self.n_feat[seq]}, the tokens start at {p0}")
        for j in range(n):
            if self.n_feat[seq] == self.enc.capacity:
                self._encode_held(seq)
                self.feat_p0[seq] = p0 + j
            k = self.n_feat[seq]
            if <size_t>(k + 1) * 3 * E > self.feat[seq].size():
                self.feat[seq].resize(<size_t>(2 * k + 2) * 3 * E)
            dst = self.feat[seq].data() + <size_t>k * 3 * E
            for i in range(3):
                src = t.layer_inp_c(self.lids[i], row0 + j) if row0 >= 0 else NULL
                memcpy(dst + i * E, src if src != NULL else self.zeros.data(), E * sizeof(float))
            self.n_feat[seq] = k + 1
        self.n_sync[seq] = p0 + n - 1
        self.kept_tok[seq] = -1
        return 0

    cdef int _encode_rows(self, const vector[int] & row_seq, const vector[int] & row_pos) except -1:
        """Run the encoder over the rows in ``enc`` (row ``r``: the features of position
        ``row_pos[r]`` of ``row_seq[r]``) and hand each ``g`` on: queued with the next
        committed token, or the sequence's deferred one for its newest position."""
        cdef int r, seq, P
        cdef vector[int32_t] * h
        cdef Context dc = self.draft_ctx
        cdef const float * g
        cdef double t0 = now()
        dc.encode_c(self.enc)
        self.t_encode += now() - t0
        self.n_encodes += 1
        for r in range(self.enc.b.n_tokens):
            g = dc.mtp_hidden_c(r)
            if g == NULL:
                raise RuntimeError("the EAGLE-3 encoder gave no output row")
            seq = row_seq[r]
            P = row_pos[r]
            h = self.hist(seq)
            if P + 1 < <int>h.size():
                self._queue(h[0][P + 1], P, seq, g)
            else:
                memcpy(self.pend[seq].data(), g, self.n_embd * sizeof(float))
        self.enc.clear_c()
        return 0

    cdef int _encode_seqs(self, const vector[int] & seqs) except -1:
        """Encode the held feature rows of ``seqs`` together, ``enc.capacity`` rows a call
        (``_encode_held`` of each, in fewer calls)."""
        cdef int i, c, n, seq, r, pe
        cdef int E3 = 3 * self.n_embd_tgt
        cdef vector[int] row_seq, row_pos
        self.enc.clear_c()
        for i in range(<int>seqs.size()):
            seq = seqs[i]
            n = self.n_feat[seq]
            pe = self.draft_ctx.pos_max_c(seq) + 1
            for c in range(n):
                if self.enc.b.n_tokens == self.enc.capacity:
                    self._encode_rows(row_seq, row_pos)
                    row_seq.clear()
                    row_pos.clear()
                r = self.enc.b.n_tokens
                self.enc.add_c(0, pe + c, seq, True)
                memcpy(self.enc.b.embd + <size_t>r * E3,
                       self.feat[seq].data() + <size_t>c * E3, <size_t>E3 * sizeof(float))
                row_seq.push_back(seq)
                row_pos.push_back(self.feat_p0[seq] + c)
            self.n_feat[seq] = 0
        if self.enc.b.n_tokens > 0:
            self._encode_rows(row_seq, row_pos)
        return 0

    cdef int _encode_held(self, int seq) except -1:
        """Encode the held feature rows of ``seq`` (one encoder call per ``enc.capacity``
        rows): each ``g_P`` completes the pair (``x_{P+1}``, ``g_P``) at ``P``, and the newest
        committed position's becomes the deferred one. The encoder ignores positions, but
        llama.cpp checks them against the sequence's memory: they continue it, as llama.cpp's
        recipe does."""
        cdef int n = self.n_feat[seq], P0 = self.feat_p0[seq], c0 = 0, m, j, P
        cdef int E3 = 3 * self.n_embd_tgt, pe
        cdef vector[int32_t] * h = self.hist(seq)
        cdef int L = h.size()
        cdef Context dc = self.draft_ctx
        cdef const float * g
        cdef double t0
        while c0 < n:
            m = min(n - c0, self.enc.capacity)
            self.enc.clear_c()
            pe = dc.pos_max_c(seq) + 1
            for j in range(m):
                self.enc.add_c(0, pe + j, seq, True)
            memcpy(self.enc.b.embd, self.feat[seq].data() + <size_t>c0 * E3,
                   <size_t>m * E3 * sizeof(float))
            t0 = now()
            dc.encode_c(self.enc)
            self.t_encode += now() - t0
            self.n_encodes += 1
            for j in range(m):
                g = dc.mtp_hidden_c(j)
                if g == NULL:
                    raise RuntimeError("the EAGLE-3 encoder gave no output row")
                P = P0 + c0 + j
                if P + 1 < L:
                    self._queue(h[0][P + 1], P, seq, g)
                else:
                    memcpy(self.pend[seq].data(), g, self.n_embd * sizeof(float))
            c0 += m
        self.n_feat[seq] = 0
        return 0

    cdef int _forget(self, int seq) except -1:
        TargetFedDrafter._forget(self, seq)
        self.n_feat[seq] = 0
        return 0

    cdef int _trim(self, int seq, int keep) except -1:
        if self.n_sync[seq] > keep:
            self._encode_held(seq)
        return TargetFedDrafter._trim(self, seq, keep)

    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1:
        self._check_bound(seq)
        cdef int L = self.hist(seq).size()
        if n_max <= 0 or L == 0:
            return 0
        self._sync_at(seq, L - 1)
        # a round holds at most n_max + 1 rows per sequence (the configured n_max: this
        # call's cap may be shorter); more means rounds went by without drafts (or a prompt
        # came in): that catch-up runs on its own, so the time of the draft steps stays a
        # measure of drafting for the adaptive policy
        cdef int most = max(n_max, self.n_max) + 1
        cdef double t0 = now()
        cdef bint behind = self.n_feat[seq] > most or self.n_queued(seq) > most
        self._encode_held(seq)
        if behind:
            self._flush_seq(seq)
            self.t_sync = now() - t0
        # the queued catch-up goes with the seed pair, every row an output: llama.cpp's eagle3
        # decoder computes every row's logits anyway and hands out the first n_outputs rows,
        # so only an all-output batch keeps rows and outputs aligned
        self._load(seq)
        if self.batch.b.n_tokens >= self.batch.capacity:
            self._flush_batch()
        cdef Context c = self.draft_ctx
        cdef Model tm = self._target.model
        cdef int i, j, idx, n_dec = 0, n_ctx_seq = c.n_ctx_seq
        cdef int32_t tok = last, y
        cdef const float * g = self.pend[seq].data()
        cdef const float * lg
        cdef const float * hh
        for i in range(n_max):
            if L - 1 + i >= n_ctx_seq:
                break
            idx = self.batch.b.n_tokens
            self.batch.add_embd_c(tok, L - 1 + i, seq, True, g)
            for j in range(idx):
                self.batch.b.logits[j] = 1
            t0 = now()
            c.decode_c(self.batch)
            self.t_decode += now() - t0
            self.batch.clear_c()
            self.n_decodes += 1
            n_dec += 1
            lg = c.logits_c(idx)
            hh = c.mtp_hidden_c(idx)
            if lg == NULL or hh == NULL:
                raise RuntimeError("the EAGLE-3 context gave no output for a draft row")
            memcpy(self.h.data(), hh, self.n_embd * sizeof(float))
            g = self.h.data()
            y = argmax(lg, self.n_vocab_draft)
            if not prob_at_least(lg, self.n_vocab_draft, y, max(self.p_min, self.p_stop)):
                break
            out.tokens.push_back(y)
            if tm.is_eog_c(y):
                break
            tok = y
        # keep the seed pair (built from the target's own g); the draft steps' go
        self._keep_seed(seq, L - 1, last, n_dec)
        return 0

    cdef int _propose_batch(self, Asks asks) except -1:
        """Every ask's draft: one encoder call for all their held rows, then one decode per
        draft step for all of them (see the module notes)."""
        cdef int n = asks.n()
        if n <= 1:
            return Drafter._propose_batch(self, asks)
        cdef int j, i, r, seq, steps = 0, most = self.n_max, n_act
        cdef vector[int] L, idx, seqs
        cdef vector[int32_t] tok
        cdef vector[const float *] g
        cdef vector[char] live
        L.resize(n)
        idx.resize(n)
        tok.resize(n)
        g.resize(n)
        live.assign(n, 0)
        for j in range(n):
            seq = asks.seq[j]
            self._check_bound(seq)
            L[j] = self.hist(seq).size()
            tok[j] = asks.last[j]
            if asks.n_max[j] <= 0 or L[j] == 0:
                continue
            self._sync_at(seq, L[j] - 1)
            live[j] = 1
            seqs.push_back(seq)
            steps = max(steps, asks.n_max[j])
            most = max(most, asks.n_max[j])
        if seqs.empty():
            return 0
        # more held or queued rows than the rounds leave: that catch-up runs on its own, so
        # the time of the draft steps stays a measure of drafting (see _propose)
        cdef double t0 = now()
        cdef bint behind = False
        for j in range(<int>seqs.size()):
            behind = behind or self.n_feat[seqs[j]] > most + 1 or self.n_queued(seqs[j]) > most + 1
        self._encode_seqs(seqs)
        for j in range(<int>seqs.size()):
            self._load(seqs[j])             # the other sequences' queues wait
        if behind or self.batch.b.n_tokens + <int>seqs.size() > self.batch.capacity:
            self._flush_batch()
            self.t_sync = now() - t0
        for j in range(n):
            if live[j]:
                g[j] = self.pend[asks.seq[j]].data()
        cdef Context c = self.draft_ctx
        cdef Model tm = self._target.model
        cdef int n_ctx_seq = c.n_ctx_seq
        cdef int32_t y
        cdef const float * lg
        cdef vector[int] n_dec
        n_dec.assign(n, 0)
        for i in range(steps):
            n_act = 0
            for j in range(n):
                if live[j] and (i >= asks.n_max[j] or L[j] - 1 + i >= n_ctx_seq):
                    live[j] = 0
                if live[j]:
                    idx[j] = self.batch.b.n_tokens
                    self.batch.add_embd_c(tok[j], L[j] - 1 + i, asks.seq[j], True, g[j])
                    n_act += 1
            if n_act == 0:
                break
            # every row an output (see _propose)
            for r in range(self.batch.b.n_tokens):
                self.batch.b.logits[r] = 1
            t0 = now()
            c.decode_c(self.batch)
            self.t_decode += now() - t0
            self.batch.clear_c()
            self.n_decodes += 1
            for j in range(n):
                if not live[j]:
                    continue
                n_dec[j] += 1
                lg = c.logits_c(idx[j])
                g[j] = c.mtp_hidden_c(idx[j])      # read by the next step's add, before its decode
                if lg == NULL or g[j] == NULL:
                    raise RuntimeError("the EAGLE-3 context gave no output for a draft row")
                y = argmax(lg, self.n_vocab_draft)
                if not prob_at_least(lg, self.n_vocab_draft, y, max(self.p_min, asks.p_stop[j])):
                    live[j] = 0
                    continue
                (<Draft> asks.drafts[j]).tokens.push_back(y)
                if tm.is_eog_c(y):
                    live[j] = 0
                tok[j] = y
        for j in range(n):
            if L[j] > 0:
                self._keep_seed(asks.seq[j], L[j] - 1, asks.last[j], n_dec[j])
        return 0

    # --- introspection ----------------------------------------------------------------

    def counters(self) -> dict:
        """Draft decodes and encodes run, and catch-up pairs queued (since bind)."""
        return {"decodes": self.n_decodes, "encodes": self.n_encodes,
                "catchup_rows": self.n_catchup, "catchup_decoded": self.n_caught_up,
                "flushes": self.n_flushes,
                "t_decode_s": self.t_decode, "t_encode_s": self.t_encode}
