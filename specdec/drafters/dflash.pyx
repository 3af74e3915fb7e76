# cython: language_level=3
# distutils: language = c++
"""The DFlash drafter: a block-diffusion draft that proposes a whole block in one decode,
fed the target's intermediate layer inputs (llama.cpp's ``draft-dflash``,
common/speculative.cpp).

The draft GGUF (arch ``dflash``) names the target layers it reads (``target_layers``), its
trained block size (``dflash.block_size``) and a mask token. Its context holds, at each
committed position ``P``, K and V made from the target's features of ``P`` (a decode of
feature-only rows: llama.cpp's KV injection). A draft is one decode of the block
``[last, <mask> x n]`` at positions ``L .. L+n``, with non-causal attention unless the
model asks for causal (``dflash.attention.causal``); block row ``i`` gives the draft token
for position ``L+i``, by argmax. The block is then removed from the draft's KV.

Per round and sequence:

* ``observe`` copies the committed rows' features, which the next target decode
  overwrites; they wait there until a draft needs them (or a feature decode's worth has
  gathered), so rounds the policy does not draft cost no draft decode;
* ``propose`` writes the waiting features into the KV (chunks of ``n_ubatch`` rows, since
  non-causal decodes take no more), then decodes the block.

Several sequences drafting in one round (``propose_batch``) share the feature decode
(their waiting rows together) and the block decode (every sequence's block, as long as
they are equally long and fit one ubatch: llama.cpp may split a batch of several KV
streams by sequence, and a block cut across ubatches would not see its own rows).

Tokens that entered the target without rows to read (a reused prompt prefix) get zero
features, as the EAGLE-3 drafter does.
"""
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy, memset
from libcpp.vector cimport vector

from .._core cimport Model, Context, Batch
from .._sampling cimport argmax, prob_at_least
from .._timing cimport now
from ._base cimport Drafter, Draft, Asks
from .._gguf_layout import parse_gguf

import mmap
import os

from .._archs import BLOCK_DRAFT_ARCHS, LAYER_INPUT_ARCHS

# llama.cpp's default when a draft names no block size
DEFAULT_BLOCK_SIZE = 16


def _tensor_names(path) -> set:
    """Tensor names in a GGUF file's header (the variants of the dflash arch differ by them)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return {t.name for t in parse_gguf(mm, strings=False).tensors}


cdef class DFlashDrafter(Drafter):
    """DFlashDrafter(path, *, p_min=None, n_threads=None, n_gpu_layers=None, name="dflash")
--

    ``dflash:PATH``: draft a block at a time with the DFlash model in ``PATH`` (or a loaded
    ``Model``), which reads the target layers it names. A draft is at most the trained block
    size less one token long. ``p_min`` stops a draft at the first block row whose argmax
    has a lower probability (None: the Decoder's ``p_min``). The adaptive policy's per-token
    floor (``p_stop``) is not applied: it weighs one more draft step, and the block's rows
    come from one decode together."""
    cdef readonly Model draft_model
    cdef readonly Context draft_ctx
    cdef Batch feat                      # feature rows written into the draft's KV
    cdef Batch block                     # [last, mask, ...], of several sequences together
    cdef object _source
    cdef int n_threads
    cdef readonly tuple layers           # target layers read, in the draft's order
    cdef readonly int block_size         # trained block size: drafts are at most one less
    cdef readonly bint causal            # the block attends causally (dflash.attention.causal)
    cdef readonly int mask_token
    cdef vector[int32_t] lids
    cdef int n_embd_tgt, width, n_vocab_draft
    cdef vector[vector[float]] pend      # per seq: features of positions n_kv.. not yet in the KV
    cdef vector[int32_t] n_kv            # per seq: positions whose features are in the KV
    cdef vector[int32_t] n_pend          # per seq: rows waiting in pend
    cdef int64_t n_decodes, n_injects, n_rows

    def __init__(self, path=None, *, p_min=None, n_threads=None, n_gpu_layers=None,
                 name="dflash"):
        super().__init__(name)
        if path in (None, ""):
            raise ValueError("the dflash drafter needs a draft GGUF: dflash:PATH")
        self.n_gpu_layers = n_gpu_layers
        self._source = path
        self._set_p_min(p_min, 0.0)
        self.n_threads = 0 if n_threads is None else int(n_threads)

    @property
    def has_model(self):
        return True

    def close(self):
        """Free the draft context now (the drafter cannot draft afterwards)."""
        if self.draft_ctx is not None:
            self.draft_ctx.close()
        self.draft_ctx = None
        self.feat = None
        self.block = None

    # --- setup ------------------------------------------------------------------------

    cdef int bind_c(self, Context target, int n_seq) except -1:
        Drafter.bind_c(self, target, n_seq)
        cdef Model tm = target.model
        self.draft_model = self.own_model(self._source, tm)
        cdef Model dm = self.draft_model
        name = os.path.basename(dm.path)
        self._check_draft(dm, tm, name)
        meta = dm.meta("dflash.block_size")
        self.block_size = int(meta) if meta else DEFAULT_BLOCK_SIZE
        if self.block_size < 2:
            raise ValueError(f"{name!r} has block size {self.block_size}; a DFlash block holds "
                             f"the last token and at least one mask")
        self.causal = dm.meta("dflash.attention.causal") == "true"
        self.mask_token = dm.mask
        self.layers = tuple(dm.target_layers)
        self.lids = list(self.layers)
        target.set_layer_inputs(self.layers)
        self.n_embd_tgt = tm.n_embd
        self.width = len(self.layers) * tm.n_embd
        # non-causal decodes take at most n_ubatch rows: the block must fit one
        cdef int cap = max(self.block_size, min(target.n_ubatch, 512))
        # the target's layout: one KV for all sequences (each may use all of it), or a stream
        # each; a shared one also holds the drafting sequences' blocks
        cdef bint unified = n_seq > 1 and target.n_ctx_seq * n_seq > target.n_ctx
        self.draft_ctx = Context(dm, n_ctx=target.n_ctx + (n_seq * self.block_size if unified
                                                           else 0),
                                 n_batch=cap, n_ubatch=cap, n_seq_max=n_seq,
                                 n_threads=self.n_threads or target.n_threads, other=target,
                                 kv_unified=unified if n_seq > 1 else None)
        if self.draft_ctx.n_ctx_seq < target.n_ctx_seq:
            raise ValueError(f"the draft context holds {self.draft_ctx.n_ctx_seq} positions per "
                             f"sequence, the target {target.n_ctx_seq}")
        self.draft_ctx.set_causal_attn(self.causal)
        self.n_vocab_draft = min(dm.n_vocab, tm.n_vocab)
        self.feat = Batch(self.draft_ctx.n_ubatch, n_embd=self.width, n_seq_max=n_seq)
        self.block = Batch(cap, n_seq_max=n_seq)
        self.pend.assign(n_seq, vector[float]())
        self.n_kv.assign(n_seq, 0)
        self.n_pend.assign(n_seq, 0)
        self.n_decodes = self.n_injects = self.n_rows = 0
        return 0

    def _check_draft(self, Model dm, Model tm, str name):
        """Refuse, in Python, what llama.cpp would abort on or draft wrongly with."""
        if dm.arch not in BLOCK_DRAFT_ARCHS:
            raise ValueError(f"{name!r} is a {dm.arch!r} model, not a DFlash draft")
        if tm.arch not in LAYER_INPUT_ARCHS:
            raise ValueError(f"the target's architecture {tm.arch!r} does not hand out its layer "
                             f"inputs in llama.cpp, so no DFlash draft can read it")
        if dm.meta("dflash.selector_top_k") not in (None, "0"):
            raise ValueError(f"{name!r} is a DFlash2 draft (a selector lattice), which specdec "
                             f"does not drive")
        if dm.meta("dflash.hyper_connection.count") not in (None, "0"):
            raise ValueError(f"{name!r} is a DSpark draft on a DeepSeek-V4 backbone, which "
                             f"specdec does not drive")
        try:
            names = _tensor_names(dm.path)
        except (OSError, ValueError):
            names = set()
        if "markov_w1.weight" in names:
            raise ValueError(f"{name!r} is a DSpark draft (a Markov head: llama.cpp's "
                             f"draft-dspark), which specdec does not drive")
        layers = dm.target_layers
        if not layers:
            raise ValueError(f"{name!r} names no target layers to read")
        bad = [i for i in layers if not 0 <= i < tm.n_layer]
        if bad:
            raise ValueError(f"{name!r} reads target layers {list(layers)}, but the target has "
                             f"{tm.n_layer} layers: {bad} do not exist")
        if dm.n_embd != tm.n_embd:
            raise ValueError(f"{name!r} has hidden size {dm.n_embd}; llama.cpp's DFlash graph "
                             f"reads target features of its own width, and this target's "
                             f"hidden size is {tm.n_embd}")
        if not tm.vocab_compatible(dm):
            raise ValueError(f"{name!r} has a vocabulary incompatible with the target "
                             f"({dm.n_vocab} vs {tm.n_vocab} tokens)")
        if not 0 <= dm.mask < dm.n_vocab:
            raise ValueError(f"{name!r} names no mask token (tokenizer.ggml.mask_token_id), "
                             f"which fills the draft positions of a DFlash block")
        return None

    cdef int _check_bound(self, int seq) except -1:
        if self.draft_ctx is None:
            raise RuntimeError("the dflash drafter is not bound to a target (Decoder does this)")
        if seq < 0 or seq >= <int>self.n_kv.size():
            raise ValueError(f"sequence {seq} out of range for the draft context")
        return 0

    # --- the draft's KV: target features at committed positions -----------------------

    cdef int _forget(self, int seq) except -1:
        self.draft_ctx.seq_rm_c(seq, -1, -1)
        self.n_kv[seq] = 0
        self.n_pend[seq] = 0
        return 0

    cdef int _truncate(self, int seq, int keep) except -1:
        """Forget the features of positions >= keep (waiting ones included)."""
        if self.n_kv[seq] > keep:
            self.draft_ctx.seq_rm_c(seq, keep, -1)
            self.n_kv[seq] = keep
            self.n_pend[seq] = 0
        elif self.n_kv[seq] + self.n_pend[seq] > keep:
            self.n_pend[seq] = keep - self.n_kv[seq]
        return 0

    cdef float * _pend_row(self, int seq) except NULL:
        cdef size_t need = <size_t>(self.n_pend[seq] + 1) * self.width
        if self.pend[seq].size() < need:
            self.pend[seq].resize(max(need, 2 * self.pend[seq].size()))
        self.n_pend[seq] += 1
        return self.pend[seq].data() + need - self.width

    cdef int _zero_to(self, int seq, int p) except -1:
        """Zero features for the positions before ``p`` that entered the target without
        rows to read (a reused prompt prefix)."""
        while self.n_kv[seq] + self.n_pend[seq] < p:
            memset(self._pend_row(seq), 0, self.width * sizeof(float))
        return 0

    cdef int _inject(self, int seq) except -1:
        """Write the waiting features of ``seq`` into the draft's KV."""
        cdef int done = 0, m, j, P = self.width
        cdef int n = self.n_pend[seq]
        cdef Context dc = self.draft_ctx
        while done < n:
            m = min(n - done, self.feat.capacity)
            self.feat.clear_c()
            for j in range(m):
                self.feat.add_embd_c(0, self.n_kv[seq] + j, seq, False,
                                     self.pend[seq].data() + <size_t>(done + j) * P)
            dc.decode_c(self.feat)
            self.n_injects += 1
            self.n_kv[seq] += m
            done += m
        self.n_pend[seq] = 0
        return 0

    cdef int _inject_seqs(self, const vector[int] & seqs) except -1:
        """Write the waiting features of ``seqs`` into the draft's KV together, a feature
        decode's worth of rows at a time (``_inject`` of each, in fewer decodes)."""
        cdef int i, j, seq, P = self.width
        self.feat.clear_c()         # (``_inject`` leaves its last rows in it)
        for i in range(<int>seqs.size()):
            seq = seqs[i]
            for j in range(self.n_pend[seq]):
                if self.feat.b.n_tokens == self.feat.capacity:
                    self.draft_ctx.decode_c(self.feat)
                    self.n_injects += 1
                    self.feat.clear_c()
                self.feat.add_embd_c(0, self.n_kv[seq] + j, seq, False,
                                     self.pend[seq].data() + <size_t>j * P)
            self.n_kv[seq] += self.n_pend[seq]
            self.n_pend[seq] = 0
        if self.feat.b.n_tokens > 0:
            self.draft_ctx.decode_c(self.feat)
            self.n_injects += 1
            self.feat.clear_c()
        return 0

    # --- hooks ------------------------------------------------------------------------

    cdef int _begin(self, int seq, const int32_t * toks, int n) except -1:
        self._check_bound(seq)
        self._forget(seq)
        return 0

    cdef int _reset(self, int seq) except -1:
        if self.draft_ctx is not None and 0 <= seq < <int>self.n_kv.size():
            self._forget(seq)
        return 0

    cdef int _observe(self, int seq, const int32_t * toks, int n, int row0) except -1:
        """Keep the features of the committed rows until a draft needs them."""
        self._check_bound(seq)
        if n <= 0:
            return 0
        cdef int p0 = <int>self.hist(seq).size() - n   # positions of toks: p0 .. p0+n-1
        cdef int j, k, E = self.n_embd_tgt
        cdef Context t = self._target
        cdef const float * src
        cdef float * dst
        self._truncate(seq, p0)
        self._zero_to(seq, p0)
        for j in range(n):
            dst = self._pend_row(seq)
            for k in range(<int>self.lids.size()):
                src = t.layer_inp_c(self.lids[k], row0 + j) if row0 >= 0 else NULL
                if src != NULL:
                    memcpy(dst + k * E, src, E * sizeof(float))
                else:
                    memset(dst + k * E, 0, E * sizeof(float))
        self.n_rows += n
        if self.n_pend[seq] >= self.feat.capacity:     # bounded memory without drafts
            self._inject(seq)
        return 0

    cdef int _propose(self, int seq, int32_t last, int n_max, Draft out) except -1:
        self._check_bound(seq)
        cdef int L = self.hist(seq).size()
        if n_max <= 0 or L == 0:
            return 0
        cdef double t0 = now()
        self._truncate(seq, L)
        self._zero_to(seq, L)
        if self.n_pend[seq] > 0:
            self._inject(seq)
        self.t_sync = now() - t0
        cdef Context c = self.draft_ctx
        cdef Model tm = self._target.model
        cdef int i, n = min(n_max, self.block_size - 1, c.n_ctx_seq - 1 - L)
        cdef int32_t y
        cdef const float * lg
        if n <= 0:
            return 0
        # every row an output: llama.cpp's dflash decoder computes every row's logits and
        # hands out the first n_outputs rows, so only an all-output block keeps them aligned
        self.block.clear_c()
        self.block.add_c(last, L, seq, True)
        for i in range(1, n + 1):
            self.block.add_c(self.mask_token, L + i, seq, True)
        try:
            c.decode_c(self.block)
            self.n_decodes += 1
            for i in range(1, n + 1):
                lg = c.logits_c(i)
                if lg == NULL:
                    raise RuntimeError("the DFlash context gave no logits for a block row")
                y = argmax(lg, self.n_vocab_draft)
                if not prob_at_least(lg, self.n_vocab_draft, y, self.p_min):
                    break
                out.tokens.push_back(y)
                if tm.is_eog_c(y):
                    break
        finally:
            # the block leaves the KV: only target features stay
            c.seq_rm_c(seq, L, -1)
        return 0

    cdef int _propose_batch(self, Asks asks) except -1:
        """Every ask's draft: one feature decode for all their waiting rows, then their
        blocks together, one decode per block length that fits one ubatch."""
        cdef int n = asks.n()
        if n <= 1:
            return Drafter._propose_batch(self, asks)
        cdef Context c = self.draft_ctx
        cdef int j, i, seq, nb, rows
        cdef vector[int] L, nblk, row0, seqs
        L.resize(n)
        nblk.assign(n, 0)
        row0.assign(n, -1)
        cdef double t0 = now()
        for j in range(n):
            seq = asks.seq[j]
            self._check_bound(seq)
            L[j] = self.hist(seq).size()
            if asks.n_max[j] <= 0 or L[j] == 0:
                continue
            self._truncate(seq, L[j])
            self._zero_to(seq, L[j])
            seqs.push_back(seq)
            nblk[j] = max(0, min(asks.n_max[j], self.block_size - 1, c.n_ctx_seq - 1 - L[j]))
        self._inject_seqs(seqs)
        self.t_sync = now() - t0
        cdef Model tm = self._target.model
        cdef int32_t y
        cdef const float * lg
        cdef vector[char] done
        done.assign(n, 0)
        cdef int k
        for k in range(n):
            if done[k] or nblk[k] <= 0:
                continue
            nb = nblk[k]
            # the blocks of this length that fit one ubatch, every row an output (see _propose)
            self.block.clear_c()
            for j in range(k, n):
                if done[j] or nblk[j] != nb or self.block.b.n_tokens + nb + 1 > self.block.capacity:
                    continue
                done[j] = 1
                row0[j] = self.block.b.n_tokens
                self.block.add_c(asks.last[j], L[j], asks.seq[j], True)
                for i in range(1, nb + 1):
                    self.block.add_c(self.mask_token, L[j] + i, asks.seq[j], True)
            try:
                c.decode_c(self.block)
                self.n_decodes += 1
                for j in range(k, n):
                    if row0[j] < 0:
                        continue
                    for i in range(1, nb + 1):
                        lg = c.logits_c(row0[j] + i)
                        if lg == NULL:
                            raise RuntimeError("the DFlash context gave no logits for a block row")
                        y = argmax(lg, self.n_vocab_draft)
                        if not prob_at_least(lg, self.n_vocab_draft, y, self.p_min):
                            break
                        (<Draft> asks.drafts[j]).tokens.push_back(y)
                        if tm.is_eog_c(y):
                            break
            finally:
                # the blocks leave the KV: only target features stay
                for j in range(k, n):
                    if row0[j] >= 0:
                        c.seq_rm_c(asks.seq[j], L[j], -1)
                        row0[j] = -1
        return 0

    # --- introspection ----------------------------------------------------------------

    def counters(self) -> dict:
        """Block decodes, feature decodes (KV injections) and feature rows kept, since bind."""
        return {"decodes": self.n_decodes, "injects": self.n_injects, "rows": self.n_rows}

    def synced(self, int seq=0) -> int:
        """Positions of ``seq`` whose features are in the draft's KV or waiting for it."""
        self._check_bound(seq)
        return self.n_kv[seq] + self.n_pend[seq]
