# cython: language_level=3
# distutils: language = c++
"""The speculative controller: draft -> verify -> accept -> rollback -> notify.

One loop for every drafter, and for plain decoding (no drafter: every round
verifies just the pending token). Built-in drafters are called through their C
hooks, so a round enters Python only for Python drafters.

Per sequence, ``last`` is the token sampled but not yet in the target's memory,
and ``n_past`` the number of tokens that are. A round decodes
``[last, d1..dk]`` at ``n_past..``, keeps ``last, d1..da`` for the ``a`` drafts
the target agrees with, emits ``d1..da`` and the target's own next token, and
removes the rest from the target's memory.

Recurrent and hybrid targets without partial rollback (mamba2, rwkv, jamba,
qwen3next, ...) roll back by checkpoint: the sequence's recurrent state is saved
before a verify that holds drafts; on a partial accept it is restored, the
attention KV trimmed, and ``last, d1..da, y`` decoded again (see ``_redecode``).
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libcpp.string cimport string
from libcpp.vector cimport vector
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from ._core cimport Model, Context, Batch
from ._llama cimport LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from ._sampling cimport SamplingParams, argmax, Rng, Distribution
from .drafters._base cimport Drafter, Draft
from ._policy cimport DraftPolicy

import numpy as np

from ._core import ContextFullError

# why a sequence stopped
DEF RUNNING = 0
DEF STOP_EOG = 1
DEF STOP_STRING = 2
DEF LENGTH = 3
DEF CTX_FULL = 4

_FINISH = {RUNNING: None, STOP_EOG: "eos", STOP_STRING: "stop", LENGTH: "length",
           CTX_FULL: "context"}

# where a round's time goes: every interval of a round is added to exactly one of these
DEF T_TARGET = 0      # the target's decode (llama.cpp)
DEF T_HEAD = 1        # the lazy LM head's passes (logits of the rows verification reads)
DEF T_DRAFT = 2       # drafters: proposing, and observing / accepting what was kept
DEF T_VERIFY = 3      # accept / reject (argmax, rejection sampling) and the rollback
DEF T_CONTROL = 4     # the controller itself: batches, policy, emitting text, stop strings
DEF N_PARTS = 5


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef class _Seq:
    cdef int id
    cdef int32_t last
    cdef int n_past
    cdef int max_tokens
    cdef int finish
    cdef int n_prompt
    cdef vector[int32_t] out
    cdef vector[size_t] ends   # text length after each token of ``out``
    cdef string text
    cdef size_t taken
    cdef Rng rng
    cdef Draft draft
    cdef int proposer      # index of the drafter that made the current draft, -1 none
    cdef int row0          # batch index of ``last`` in the current verify batch
    cdef int k             # drafts in the current verify batch
    cdef double t_asked    # time spent drafting this round (catch-up left out)
    cdef double pred_e, pred_t   # the policy's prediction for the round (pred_t 0: none)
    cdef vector[uint8_t] ckpt    # recurrent state before the current verify (checkpoint archs)
    cdef double t_ckpt     # this round's checkpoint save and restore
    cdef bint redo         # a partial accept restored the checkpoint: decode again
    cdef int32_t prev      # the ``last`` of the current verify
    cdef int a             # drafts accepted in the current verify
    cdef double t_v        # the current verify's cost so far


cdef class Controller:
    """Runs generation for one or more sequences of a target context.

    Built once per configuration; ``start`` begins a request, ``step`` runs one
    round for every live sequence, ``run`` loops to the end.
    """
    cdef readonly Context ctx
    cdef readonly Model model
    cdef list drafters
    cdef int n_drafters
    cdef Batch batch
    cdef list seqs
    cdef int n_seqs
    cdef vector[string] stops
    cdef Distribution dist
    cdef SamplingParams sp
    cdef bint greedy
    cdef int n_max, n_min
    cdef bint check
    cdef bint exact          # never decode a single row (see ``_pad``)
    cdef bint unsafe_accept_all   # a deliberately wrong rule, so tests can show they detect it
    cdef bint record         # keep every verified draft (``draft_log``): for tests and debugging
    cdef list _log
    cdef int64_t n_filler
    cdef int rs_cap          # max rollback per round (n_rs_seq), -1 unlimited
    cdef bint ckpt           # roll back by state checkpoints (recurrent without n_rs_seq)
    cdef uint32_t ckpt_flags
    cdef int64_t n_redecode
    cdef DraftPolicy policy
    cdef vector[int32_t] scratch
    # stats, counted in C, turned into Python once in ``stats()``
    cdef int64_t n_rounds, n_drafted, n_accepted, n_draft_rounds
    cdef vector[int64_t] drafted_at, accepted_at
    cdef double t_prompt, t_start, t_gen
    cdef double t_part[N_PARTS]   # seconds per T_* part, summed over the rounds
    cdef double t_mark            # end of the last interval added to t_part
    cdef double t_sync       # of the last _propose: drafters catching up, not drafting

    def __init__(self, Context ctx not None, drafters=(), *, int n_max=0, int n_min=0,
                 bint adaptive=False, float temperature=0.0, int top_k=0,
                 float top_p=1.0, float min_p=0.0, stop=(), bint check=False, bint exact=False,
                 bint unsafe_accept_all=False, bint record=False, DraftPolicy policy=None):
        if ctx.is_mtp:
            raise ValueError("the controller drives a target context, not an MTP context")
        if n_max < 0 or n_min < 0:
            raise ValueError("n_max and n_min must be >= 0")
        if top_k < 0 or not 0.0 < top_p <= 1.0 or not 0.0 <= min_p <= 1.0 or temperature < 0:
            raise ValueError(f"bad sampling parameters (temperature={temperature}, top_k={top_k}, "
                             f"top_p={top_p}, min_p={min_p})")
        self.ctx = ctx
        self.model = ctx.model
        self.drafters = list(drafters)
        for d in self.drafters:
            if not isinstance(d, Drafter):
                raise TypeError(f"drafters must be specdec Drafter instances, got {type(d).__name__}")
        self.n_drafters = len(self.drafters)
        if self.n_drafters == 0:
            n_max = 0
        # recurrent/hybrid archs without n_rs_seq snapshots: checkpoints, whatever the depth
        self.ckpt = not self.model.supports_partial_rollback
        # only the recurrent part (hybrids trim their attention KV with seq_rm)
        self.ckpt_flags = LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        self.rs_cap = -1
        if (self.model.is_recurrent or self.model.is_hybrid) and n_max > 0 and not self.ckpt:
            if ctx.n_rs_seq < n_max:
                raise ValueError(f"n_rs_seq={ctx.n_rs_seq} of the target context is too small for "
                                 f"drafts of {n_max} tokens: create it with n_rs_seq >= n_max")
            self.rs_cap = ctx.n_rs_seq
        if n_max + 1 > ctx.n_batch:
            raise ValueError(f"n_max={n_max} needs n_batch >= {n_max + 1} (have {ctx.n_batch})")
        self.n_max = n_max
        self.n_min = n_min
        self.greedy = temperature <= 0.0
        self.sp.temperature = temperature
        self.sp.top_k = top_k
        self.sp.top_p = top_p
        self.sp.min_p = min_p
        self.check = check
        self.exact = exact
        self.unsafe_accept_all = unsafe_accept_all
        self.record = record
        self._log = []
        if exact and not ctx.batch_invariant:
            raise ValueError("exact mode needs a batch-invariant target context: "
                             "Context(..., batch_invariant=True) on a Model(..., use_extra_bufts=False)")
        rs_snapshots = (self.model.is_recurrent or self.model.is_hybrid) and not self.ckpt
        if exact and rs_snapshots and ctx.n_rs_seq < 1:
            raise ValueError("exact mode on a recurrent/hybrid target needs n_rs_seq >= 1")
        if exact and self.rs_cap < 0 and rs_snapshots:
            self.rs_cap = ctx.n_rs_seq
        for s in ([stop] if isinstance(stop, (str, bytes)) else list(stop)):
            b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
            if not b:
                raise ValueError("stop strings must not be empty")
            self.stops.push_back(b)
        self.dist = Distribution()
        # a policy passed in keeps what it learnt (Decoder reuses one across its requests)
        if policy is not None and policy.n_max == n_max and policy.adaptive == adaptive:
            self.policy = policy
        else:
            self.policy = DraftPolicy(n_max, 0.0, adaptive)
        self.batch = Batch(ctx.n_batch, n_seq_max=ctx.n_seq_max)
        self.seqs = []
        self.n_seqs = 0

    # --- request setup ----------------------------------------------------------------

    def start(self, prompts, max_tokens, seeds=None):
        """Begin one request per prompt (lists of token ids) on sequences 0..n-1."""
        if not prompts:
            raise ValueError("no prompts")
        if len(prompts) > self.ctx.n_seq_max:
            raise ValueError(f"{len(prompts)} prompts but the context has n_seq_max="
                             f"{self.ctx.n_seq_max}")
        if isinstance(max_tokens, int):
            max_tokens = [max_tokens] * len(prompts)
        seeds = [0] * len(prompts) if seeds is None else list(seeds)
        cdef int i
        cdef vector[int32_t] toks
        for i, mt in enumerate(max_tokens):
            if not isinstance(mt, int) or isinstance(mt, bool) or not 0 < mt < 2**31:
                raise ValueError(f"max_tokens must be an int in [1, 2**31), got {mt!r}")
        checked = []
        for p in prompts:
            p = list(p)
            if not p:
                raise ValueError("empty prompt: nothing to condition on")
            for t in p:
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                    raise TypeError(f"prompt token ids must be ints, got {type(t).__name__}")
                if not 0 <= t < self.model.n_vocab:
                    raise ValueError(f"prompt token id {t} out of range [0, {self.model.n_vocab})")
            if len(p) >= self.ctx.n_ctx_seq:
                raise ContextFullError(f"prompt of {len(p)} tokens does not fit the context "
                                       f"(n_ctx={self.ctx.n_ctx_seq}); leave room to generate")
            checked.append(p)
        self._reset_stats()
        self.seqs = []
        self.n_seqs = len(checked)
        self.t_start = _now()
        cdef _Seq s
        for i in range(self.n_seqs):
            s = _Seq()
            s.id = i
            s.max_tokens = max_tokens[i]
            s.rng = Rng(seeds[i])
            s.draft = Draft()
            s.proposer = -1
            self.seqs.append(s)
            self.ctx.seq_rm_c(i, -1, -1)
            toks.assign(<size_t>len(checked[i]), 0)
            for j, t in enumerate(checked[i]):
                toks[j] = t
            self._prefill(s, toks)
        self.t_mark = _now()
        self.t_prompt = self.t_mark - self.t_start

    cdef int _prefill(self, _Seq s, vector[int32_t] & toks) except -1:
        cdef int n = toks.size(), i0 = 0, i, m
        cdef Drafter d
        for d in self.drafters:
            d.begin_c(s.id, toks.data(), n)
        cdef bint pad
        while i0 < n:
            m = min(self.ctx.n_batch, n - i0)
            if self.exact and n - i0 - m == 1 and m > 2:
                m -= 1      # no 1-token chunk at the end
            self.batch.clear_c()
            for i in range(m):
                self.batch.add_c(toks[i0 + i], i0 + i, s.id, i0 + i == n - 1)
            pad = self.exact and m == 1
            if pad:         # a one-token prompt: decode it with a throw-away second row
                self.batch.add_c(toks[i0], i0 + 1, s.id, False)
            self.ctx.decode_c(self.batch)
            if pad:
                if not self.ctx.seq_rm_c(s.id, i0 + 1, -1):
                    raise RuntimeError("could not drop the padding row")
            for d in self.drafters:
                d.observe_c(s.id, toks.data() + i0, m, 0)
            i0 += m
        s.n_past = n
        s.n_prompt = n
        s.last = self._sample(s, m - 1)
        self._emit(s, s.last)
        return 0

    # --- the round --------------------------------------------------------------------

    cdef int32_t _sample(self, _Seq s, int row) except -1:
        cdef float * lg = self.ctx.logits_c(row)
        if lg == NULL:
            raise RuntimeError(f"no logits at batch row {row}")
        cdef int32_t y
        if self.greedy:
            y = argmax(lg, self.model.n_vocab)
            if self.check:
                self._check_argmax(row, y)
            return y
        self.dist.from_logits(lg, self.model.n_vocab, self.sp)
        return self.dist.sample(s.rng)

    cdef int _check_argmax(self, int row, int32_t y) except -1:
        # an independent path (numpy over the zero-copy view) for the tests' internal check
        ref = int(np.argmax(self.ctx.logits(row)))
        if ref != y:
            raise AssertionError(f"emitted token {y} is not the argmax {ref} of its verify row")
        return 0

    cdef inline double _lap(self, int part) noexcept nogil:
        """Add the time since the last lap to ``part``; returns it."""
        cdef double now = _now(), dt = now - self.t_mark
        self.t_part[part] += dt
        self.t_mark = now
        return dt

    cdef bint _emit(self, _Seq s, int32_t tok) except -1:
        """Append one token; True when the sequence is finished.

        A stop string cuts the text where it begins, and the tokens that lie wholly at or
        after that point are dropped: ``tokens`` ends with the token in which the stop
        string begins (whose text may run past ``text``), or before it when it begins
        exactly at a token boundary.
        """
        cdef char buf[256]
        cdef int n, start
        cdef size_t pos, from_
        if self.model.is_eog_c(tok):
            s.finish = STOP_EOG
            return True
        s.out.push_back(tok)
        n = self.model.piece_c(tok, buf, sizeof(buf))
        if n > 0:
            s.text.append(buf, n)
        s.ends.push_back(s.text.size())
        if n > 0:
            for i in range(self.stops.size()):
                start = <int>s.text.size() - n - <int>self.stops[i].size() + 1
                from_ = start if start > 0 else 0
                pos = s.text.find(self.stops[i], from_)
                if pos != <size_t>-1:
                    s.text.resize(pos)
                    while s.out.size() > 0 and (s.ends[s.ends.size() - 2]
                                                if s.ends.size() >= 2 else 0) >= pos:
                        s.out.pop_back()
                        s.ends.pop_back()
                    s.finish = STOP_STRING
                    return True
        if <int>s.out.size() >= s.max_tokens:
            s.finish = LENGTH
            return True
        return False

    cdef int _propose(self, _Seq s, int k_cap) except -1:
        """Ask the drafters in turn; ``t_sync`` gets the time they spent catching up."""
        cdef Drafter d
        cdef int i
        s.draft.clear()
        s.proposer = -1
        self.t_sync = 0.0
        if k_cap <= 0:
            return 0
        for i in range(self.n_drafters):
            d = <Drafter> self.drafters[i]
            d.t_sync = 0.0
            d.propose_c(s.id, s.last, k_cap, s.draft)
            self.t_sync += d.t_sync
            if <int>s.draft.tokens.size() > k_cap:
                s.draft.tokens.resize(k_cap)
            if <int>s.draft.tokens.size() >= (self.n_min if self.n_min > 0 else 1):
                s.proposer = i
                return 0
            s.draft.clear()
        return 0

    def step(self) -> int:
        """One round for every live sequence; returns how many sequences are still running."""
        cdef _Seq s
        cdef int i, k_cap, k_want, alive = 0
        cdef double t1, t0 = _now()
        self.t_mark = t0          # the caller's time between rounds is not generation time
        self.batch.clear_c()
        for s in self.seqs:
            if s.finish != RUNNING:
                continue
            if s.n_past >= self.ctx.n_ctx_seq:
                s.finish = CTX_FULL
                continue
            k_want = self.policy.cap()
            k_cap = min(k_want,
                        s.max_tokens - <int>s.out.size(),
                        self.ctx.n_ctx_seq - s.n_past - 1,
                        self.ctx.n_batch - self.batch.b.n_tokens - 1)
            if self.rs_cap >= 0:
                k_cap = min(k_cap, self.rs_cap)
            self._lap(T_CONTROL)
            self._propose(s, k_cap)
            t1 = self._lap(T_DRAFT)
            # a cap cut by the limits is not a sample of td(k_want); catching up after rounds
            # without drafts is not a cost of drafting this round (it would stop the drafts
            # for good: the longer the pause, the dearer the next draft would look)
            if k_cap == k_want:
                self.policy.observe_draft_time(k_cap, t1 - self.t_sync)
            s.k = self.policy.choose(s.draft.tokens.size(), t1 - self.t_sync)
            # a catch-up after plain rounds is the price of switching, not of a drafting
            # round: calibrating with it would keep a paying drafter off after every pause
            s.t_asked = t1 - self.t_sync
            s.pred_e = self.policy.pred_e
            s.pred_t = self.policy.pred_t if k_cap > 0 else 0.0   # no drafter asked: no sample
            if s.k < <int>s.draft.tokens.size():
                s.draft.tokens.resize(s.k)
                if s.k == 0:
                    s.proposer = -1
            s.row0 = self.batch.b.n_tokens
            self.batch.add_c(s.last, s.n_past, s.id, True)
            for i in range(s.k):
                self.batch.add_c(s.draft.tokens[i], s.n_past + 1 + i, s.id, True)
            alive += 1
        if alive == 0:
            self._lap(T_CONTROL)
            self.t_gen += self.t_mark - t0
            return 0
        if self.exact and self.batch.b.n_tokens == 1:
            self._pad()
        self._lap(T_CONTROL)
        if self.ckpt:
            self._save_checkpoints()
        self.ctx.decode_c(self.batch)
        cdef double t_dec = self._lap(T_TARGET)
        self.n_rounds += 1
        alive = 0
        for s in self.seqs:
            if s.finish != RUNNING or s.row0 < 0:
                continue
            self._verify(s, t_dec)
            s.row0 = -1
        if self.ckpt:
            self._redecode()
        for s in self.seqs:
            if s.finish == RUNNING:
                alive += 1
        self._lap(T_CONTROL)
        self.t_gen += self.t_mark - t0
        return alive

    cdef int _save_checkpoints(self) except -1:
        """Save the recurrent state of every sequence whose verify holds drafts (or the
        exact-mode filler): a rejected one is rolled back by restoring it."""
        cdef _Seq s
        for s in self.seqs:
            s.t_ckpt = 0.0
            s.redo = False
            if s.finish == RUNNING and s.row0 >= 0 and s.k > 0:
                self._lap(T_CONTROL)
                self.ctx.save_state_c(s.id, self.ckpt_flags, s.ckpt)
                s.t_ckpt = self._lap(T_VERIFY)
        return 0

    cdef int _redecode(self) except -1:
        """Decode ``last, d1..da, y`` again for the sequences whose checkpoint was restored.

        ``y`` (the target's own token, already emitted) rides along: its row yields the
        next token, so the decode a rejection costs is also the next plain round, and
        the batch always has two rows or more (exact mode never decodes a single row).
        Its cost is charged to the round that rejected, for the policy to weigh.
        """
        cdef _Seq s
        cdef int i, base, n_rows = 0
        cdef int32_t z
        cdef Drafter d
        self.batch.clear_c()
        for s in self.seqs:
            if not s.redo:
                continue
            s.row0 = self.batch.b.n_tokens
            base = s.n_past - 1 - s.a
            self.batch.add_c(s.prev, base, s.id, True)
            for i in range(s.a):
                self.batch.add_c(s.draft.tokens[i], base + 1 + i, s.id, True)
            self.batch.add_c(s.last, base + 1 + s.a, s.id, True)
            n_rows += s.a + 2
        if n_rows == 0:
            return 0
        self._lap(T_CONTROL)
        self.ctx.decode_c(self.batch)
        cdef double t_dec = self._lap(T_TARGET), t_head
        for s in self.seqs:
            if not s.redo:
                continue
            s.redo = False
            self.n_redecode += 1
            # exact mode: the lazy head computes two rows, as a verify's first pass does
            self.ctx.prepare_logits_c(s.row0 + s.a, 2)
            t_head = self._lap(T_HEAD)
            z = self._sample(s, s.row0 + s.a + 1)
            s.n_past += 1
            self._lap(T_VERIFY)
            for i in range(self.n_drafters):
                d = <Drafter> self.drafters[i]
                d.observe_c(s.id, &s.last, 1, s.row0 + s.a + 1)
            self._lap(T_DRAFT)
            s.t_v += t_dec * (s.a + 2) / n_rows + t_head
            self._observe_policy(s, s.k, s.a, s.a + 2)
            s.row0 = -1
            if not self._emit(s, z):
                s.last = z
        return 0

    cdef int _pad(self) except -1:
        """Make a one-row verify batch two rows long.

        llama.cpp's CPU matmuls take tinyBLAS for two or more rows and vec_dot for
        one, and the two round differently; repacked weights even depend on the row
        count mod 4. With repacking off and never a single row, every row's logits
        are the same whatever the batch, so speculative output equals plain output.
        The extra row is a free guess (the pending token again), verified like a draft.
        """
        cdef _Seq s
        for s in self.seqs:
            if s.finish == RUNNING and s.row0 >= 0 and s.k == 0:
                if s.n_past + 1 >= self.ctx.n_ctx_seq or <int>s.out.size() >= s.max_tokens:
                    # no room to guess: the row is dropped after the decode
                    self.batch.add_c(s.last, s.n_past + 1, s.id, False)
                    s.k = -1
                    return 0
                s.draft.tokens.push_back(s.last)
                self.batch.add_c(s.last, s.n_past + 1, s.id, True)
                s.k = 1
                s.proposer = -2
                self.n_filler += 1
                return 0
        return 0

    cdef inline int _ready(self, _Seq s, int a, int k, int n_ready) noexcept nogil:
        """Have the logits of verify row ``a`` computed; returns how many rows are.

        With the lazy LM head (``Context(lazy_logits=True)``) the first pass computes
        two rows, which costs about one (a pass reads the whole head once; a second
        row rides along in cache), and a second pass the rest once both were accepted:
        an early rejection pays for one pass, a long run for two instead of k+1 rows.
        Without the lazy head this is a no-op.
        """
        if a < n_ready:
            return n_ready
        cdef int c = min(2, k + 1) if n_ready == 0 else k + 1 - n_ready
        self._lap(T_VERIFY)
        self.ctx.prepare_logits_c(s.row0 + n_ready, c)
        self._lap(T_HEAD)
        return n_ready + c

    cdef int _verify(self, _Seq s, double t_dec) except -1:
        self._lap(T_CONTROL)
        cdef double t_v = self.t_mark
        cdef int a = 0, i, k = s.k
        cdef int32_t y, x
        cdef float px, qx
        cdef bint done = False
        cdef bint filler = s.proposer == -2
        cdef Drafter d
        if k < 0:   # an exact-mode padding row with nothing to guess: verify ``last`` only
            k = s.k = 0
            # (a checkpoint arch keeps it: the sequence fills its context with this round)
            if not self.ckpt and not self.ctx.seq_rm_c(s.id, s.n_past + 1, -1):
                raise RuntimeError("could not drop the padding row")
        # accept the longest agreeing prefix
        cdef int n_ready = 0
        if self.greedy:
            while True:
                n_ready = self._ready(s, a, k, n_ready)
                y = self._sample(s, s.row0 + a)
                if a < k and s.draft.tokens[a] == y:
                    a += 1
                    continue
                break
        else:
            y = -1
            while a < k:
                n_ready = self._ready(s, a, k, n_ready)
                self.dist.from_logits(self.ctx.logits_c(s.row0 + a), self.model.n_vocab, self.sp)
                x = s.draft.tokens[a]
                px = self.dist.prob_of(x)
                qx = self._q(s, a, x)
                if s.rng.uniform() < px / qx or self.unsafe_accept_all:
                    a += 1
                    continue
                if s.draft.has_probs:
                    y = self.dist.sample_residual(
                        s.rng, s.draft.q_ids.data() + s.draft.q_off[a],
                        s.draft.q_probs.data() + s.draft.q_off[a],
                        s.draft.q_off[a + 1] - s.draft.q_off[a])
                else:
                    qx = 1.0
                    y = self.dist.sample_residual(s.rng, &x, &qx, 1)
                break
            if y < 0:
                n_ready = self._ready(s, k, k, n_ready)
                y = self._sample(s, s.row0 + k)
        # the target's memory keeps ``last, d1..da``; the rest is rolled back
        cdef int keep = s.n_past + 1 + a
        cdef bint redo = False
        if a < k and self.ckpt:
            # back to the state before ``last``; ``_redecode`` decodes the kept tokens again
            self.ctx.load_state_c(s.id, self.ckpt_flags, s.ckpt)
            if not self.ctx.seq_rm_c(s.id, s.n_past, -1):
                raise RuntimeError(f"rollback of sequence {s.id} to {s.n_past} refused by llama.cpp")
            redo = True
        elif a < k:
            if not self.ctx.seq_rm_c(s.id, keep, -1):
                raise RuntimeError(f"rollback of sequence {s.id} to {keep} refused by llama.cpp")
        # what the policy weighs is the whole verification: the decode, the lazy head's
        # passes (with gemma's 262k vocab as costly per row as the trunk), the rollback and,
        # on checkpoint archs, saving the checkpoint (the decode again is added by _redecode)
        self._lap(T_VERIFY)
        t_v = t_dec + self.t_mark - t_v + s.t_ckpt
        self.scratch.clear()
        self.scratch.push_back(s.last)
        for i in range(a):
            self.scratch.push_back(s.draft.tokens[i])
        self._lap(T_CONTROL)
        for i in range(self.n_drafters):
            d = <Drafter> self.drafters[i]
            d.observe_c(s.id, self.scratch.data(), a + 1, s.row0)
            if i == s.proposer:
                d.accept_c(s.id, a)
        self._lap(T_DRAFT)
        s.n_past = keep
        # stats (the exact-mode filler guess is not a draft)
        if k > 0 and not filler:
            self.n_draft_rounds += 1
            self.n_drafted += k
            self.n_accepted += a
            if <int>self.drafted_at.size() < k:
                self.drafted_at.resize(k, 0)
                self.accepted_at.resize(k, 0)
            for i in range(k):
                self.drafted_at[i] += 1
                if i < a:
                    self.accepted_at[i] += 1
        if not filler and self.record and k > 0:
            self._log.append((s.id, keep - 1 - a, [s.draft.tokens[i] for i in range(k)], a))
        s.t_v = t_v
        s.a = a
        s.prev = s.last
        # emit d1..da then y, stopping at EOS / stop strings / max_tokens
        for i in range(a):
            if self._emit(s, s.draft.tokens[i]):
                self._observe_policy(s, k, a, a + 1)
                return 0
        if not self._emit(s, y):
            s.last = y
            s.redo = redo
        if not s.redo:
            self._observe_policy(s, k, a, a + 1)
        return 0

    cdef int _observe_policy(self, _Seq s, int k, int a, int tokens) except -1:
        """The round's outcome and cost to the policy (not for the exact-mode filler guess)."""
        if s.proposer == -2:
            return 0
        self.policy.observe(k, a, s.t_v)
        self.policy.observe_round(s.pred_e, s.pred_t, tokens, s.t_asked + s.t_v)
        return 0

    cdef float _q(self, _Seq s, int pos, int32_t x) noexcept:
        cdef int j
        if not s.draft.has_probs:
            return 1.0
        for j in range(s.draft.q_off[pos], s.draft.q_off[pos + 1]):
            if s.draft.q_ids[j] == x:
                return s.draft.q_probs[j]
        return 1.0

    def run(self):
        """Rounds until every sequence has finished."""
        while self.step() > 0:
            pass

    # --- results ----------------------------------------------------------------------

    def take_text(self, int seq=0) -> bytes:
        """Bytes emitted for ``seq`` since the last call (for streaming)."""
        cdef _Seq s = self.seqs[seq]
        if s.taken >= s.text.size():   # nothing new, or a stop string cut the tail
            s.taken = s.text.size()
            return b""
        cdef bytes b = s.text.substr(s.taken)
        s.taken = s.text.size()
        return b

    def text(self, int seq=0) -> bytes:
        cdef _Seq s = self.seqs[seq]
        return s.text

    def tokens(self, int seq=0) -> list:
        cdef _Seq s = self.seqs[seq]
        return [s.out[i] for i in range(s.out.size())]

    def finish_reason(self, int seq=0):
        cdef _Seq s = self.seqs[seq]
        return _FINISH[s.finish]

    def n_prompt(self, int seq=0) -> int:
        cdef _Seq s = self.seqs[seq]
        return s.n_prompt

    def n_past(self, int seq=0) -> int:
        cdef _Seq s = self.seqs[seq]
        return s.n_past

    @property
    def n_sequences(self) -> int:
        return self.n_seqs

    @property
    def policy(self) -> DraftPolicy:
        """The draft-length policy (pass it to the next Controller to keep what it learnt)."""
        return self.policy

    @property
    def policy_state(self) -> dict:
        """The draft-length policy's estimates (acceptance per position, verify and draft times)."""
        return self.policy.state()

    @property
    def draft_log(self) -> list:
        """With ``record=True``: ``(seq, pos, drafts, n_accepted)`` for every verified draft of
        the current request, in order (``pos``: position of the pending token the drafts follow)."""
        return list(self._log)

    cdef _reset_stats(self):
        cdef int i
        self._log = []
        self.n_rounds = self.n_drafted = self.n_accepted = self.n_draft_rounds = 0
        self.n_filler = 0
        self.n_redecode = 0
        self.drafted_at.clear()
        self.accepted_at.clear()
        self.t_prompt = self.t_gen = 0.0
        for i in range(N_PARTS):
            self.t_part[i] = 0.0

    def stats(self) -> dict:
        """Counters of the current request, as plain Python values."""
        n_gen = sum((<_Seq>s).out.size() for s in self.seqs)
        t_gen = max(self.t_gen, 1e-9)
        return {
            "n_prompt": sum((<_Seq>s).n_prompt for s in self.seqs),
            "n_generated": n_gen,
            "rounds": self.n_rounds,
            "draft_rounds": self.n_draft_rounds,
            "filler_rounds": self.n_filler,
            "redecodes": self.n_redecode,
            "drafted": self.n_drafted,
            "accepted": self.n_accepted,
            "acceptance_rate": (<double>self.n_accepted / self.n_drafted) if self.n_drafted else 0.0,
            "drafted_per_position": [self.drafted_at[i] for i in range(self.drafted_at.size())],
            "accepted_per_position": [self.accepted_at[i] for i in range(self.accepted_at.size())],
            "t_prompt_s": self.t_prompt,
            "t_generate_s": t_gen,
            "t_target_s": self.t_part[T_TARGET],
            "t_lm_head_s": self.t_part[T_HEAD],
            "t_draft_s": self.t_part[T_DRAFT],
            "t_verify_s": self.t_part[T_VERIFY],
            "t_controller_s": self.t_part[T_CONTROL],
            # the first token comes from the prompt pass; the rest from rounds
            "tokens_per_s": (max(n_gen - len(self.seqs), 0) / t_gen) if n_gen else 0.0,
        }
