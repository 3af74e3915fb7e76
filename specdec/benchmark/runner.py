"""Run a benchmark matrix: specdec and its peers side by side, alternating, medians.

``Runner`` is one run's state (rows, progress, checkpoints, peers) that every step reads and
writes; what each step times or checks lives apart (``timed_sample``, ``sampled_row``,
``interleave``, ``exact_checks``, ``peers``, ``report``).

For each case (a model) and prompt, every method runs once per round, in turn, for
``reps`` rounds (A B C A B C): drift on these machines hits every method alike,
and each row keeps the median. Plain decoding against ``llama-bench`` runs the same
way from an empty context. Timed oracle rows (``ORACLE_TIMED``) draft each prompt's
continuation as their own fast-mode decoder outputs it, recorded before the timing (see
``Runner._record``): the speedup of a drafter that is always right, the ceiling the report
measures every drafter against (a share above it is a failure, not a row). Afterwards
every specdec method is checked in exact mode (``exact=True``: batch-invariant kernels)
against exact plain greedy output: a mismatch is a FAIL. The fast-mode share of tokens
equal to plain greedy output is reported for every method, peers included (they are not
bit-exact: batched and single-row kernels round differently).

``SPECDEC_BENCH_INJECT_SLEEP_MS`` makes the specdec side sleep that long per round.
It exists to show that the regression gate fails on a slower build; only this
runner reads it, never the library.
"""
from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import api
from .._progress import progress
from .._core import Model
from . import llama_tools, machine, peers
from .case_models import CaseModels
from .head_times import time_heads
from .exact_checks import exact_check
from .interleave import interleave
from .matrix import LCP, LLAMA_CPP, SPECDEC, Case, Matrix, Method
from .oracle import Oracle
from .prompts import Prompt
from .timed_sample import (INJECT_ENV, forget_texts, inject_sleep_s,  # noqa: F401 (tests)
                           specdec_sample as _specdec_sample)
from .rows import (BOS_PROMPT, INTERLEAVED, Row, Sample, interleaved_prompt, prefix_share,
                   is_interleaved, rows_of)
from .sampled_row import is_sampled_plain, sampled_row

# passes that make a timed oracle's book its own output (``Runner._record``)
ORACLE_PASSES = 4


class Runner:
    """Runs one matrix; ``run()`` returns the rows (see ``report`` for ratios and tables)."""

    def __init__(self, matrix: Matrix, *, peers_enabled: bool = True, build_peers: bool = True,
                 threads: int = 2, log: Callable[[str], None] = print,
                 checkpoint: Optional[Callable[[Dict[str, Any]], None]] = None,
                 n_gpu_layers: int = 0, device_rpc: bool = False) -> None:
        self.m = matrix
        # every case's layers on the device (``--gpu``: -1, all), on both sides; with
        # ``device_rpc`` a local RPC server per side stands in for the device (a CPU test)
        self.n_gpu_layers = -1 if device_rpc and not n_gpu_layers else n_gpu_layers
        self.device_rpc = device_rpc
        self.checkpoint = checkpoint     # called with the results so far, as rows are measured
        self.peers_enabled = peers_enabled
        self.build_peers = build_peers
        self.threads = threads
        self.log = log
        self.sleep_s = inject_sleep_s()
        self.models = CaseModels(log)
        self._lcp: Optional[peers.LcpWorker] = None
        self._lcp_error: Optional[str] = None
        self._t0 = 0.0
        self._t_steps = 0.0      # when the measurements began (after the peers' build)
        self._oracle_checks: List[Dict[str, Any]] = []   # exact mode at the matrix's oracle_check_n_max
        self._done = 0
        self._total = 0
        self._bar: Any = None     # a tqdm bar over the measurements, while run() runs
        self._case_n_ctx = 4096
        self._case_draft: Optional[str] = None     # the running case's draft file, if any
        self._placement: Dict[str, Any] = {}    # Model placement of the running case (RPC)
        self._peer_flags: Tuple[str, ...] = ()  # the same placement in llama.cpp's flags
        self._rows: List[Row] = []              # every row measured so far, this case's included
        self._completed: List[str] = []         # cases measured and checked
        self._info: Dict[str, Any] = {}
        self._heads: Dict[str, Dict[str, Any]] = {}   # per case: the LM head alone, both paths

    # --- bookkeeping --------------------------------------------------------------------

    def _count(self) -> int:
        from .structured import steps

        n = 0
        for c in self.m.cases:
            if c.concurrency:
                n += steps(c, self.m.reps)
                continue
            timed = [m for m in c.methods if not (m.side == LLAMA_CPP and m.family == "plain")]
            n += len(c.prompts) * len(timed) * self.m.reps   # (a sampled plain row: a tick a request)
            if c.interleave:
                n += len(c.prompts) * sum(1 for m in c.methods if m.side == SPECDEC and m.adaptive)
            if any(m.side == LLAMA_CPP and m.family == "plain" for m in c.methods):
                n += 2 * self.m.reps
            n += self._check_steps(c)
        return n

    def _check_steps(self, c: Case) -> int:
        """Steps of a case's exact-mode check: plain's reference, each checked method and
        each oracle batch size (none over RPC)."""
        if c.rpc_delay_ms is not None or self.n_gpu_layers:
            return 0
        checked = {m.label.removesuffix(" exact") for m in c.methods
                   if m.side == SPECDEC and m.family not in ("plain", "oracle")}
        return 1 + len(checked) + len(self.m.oracle_check_n_max)

    def _tick(self, what: str) -> None:
        """One step done: the bar moves (a terminal), else a line with the time so far and an
        estimate of the time left (at the mean pace of the steps so far, from the end of the
        peers' build: a build in this run is no step's cost)."""
        self._done += 1
        if self._bar is not None and not self._bar.disable:
            self._bar.update(1)
            self._bar.set_postfix_str(what, refresh=True)
        else:
            now = time.monotonic()
            spent = now - self._t0
            left = (now - self._t_steps) / self._done * max(self._total - self._done, 0)
            self.log(f"[{self._done}/{self._total} {spent:5.0f}s, ~{left:.0f}s left] {what}")

    def _save(self, complete: bool = False) -> None:
        if self.checkpoint is not None:
            self.checkpoint(self._results(complete))

    def _peer_reason(self, method: Method) -> Optional[str]:
        """Why a peer method cannot run here, or None."""
        if method.side == SPECDEC:
            return None
        if not self.peers_enabled:
            return "peers disabled (--no-peers)"
        if method.family == "greedy" and "--rpc" in self._peer_flags:
            return "llama-simple takes no --rpc: it cannot reach RPC servers"
        if method.side == LCP:
            if self._lcp is None and self._lcp_error is None:
                try:
                    self._lcp = peers.LcpWorker(build=self.build_peers)
                except Exception as e:  # noqa: BLE001 - becomes the rows' note
                    self._lcp_error = str(e)
            return self._lcp_error
        return None

    # --- one case -----------------------------------------------------------------------

    @staticmethod
    def _n_ctx(model: Model, n_gen: int, prompts: Sequence[Prompt]) -> int:
        """The longest prompt plus the generation, rounded up: the same for every side."""
        n_ctx = max(len(model.tokenize(p.text)) for p in prompts) + n_gen + 64
        return max(512, -(-n_ctx // 256) * 256)

    def _decoder(self, model: Model, method: Method, n_gen: int, prompts: Sequence[Prompt],
                 exact: bool = False, book: Optional[Dict[Any, List[int]]] = None) -> api.Decoder:
        n_ctx = self._n_ctx(model, n_gen, prompts)
        drafter: Any = None if method.family == "plain" else method.drafter
        if method.family in ("eagle3", "dflash"):
            drafter = f"{method.family}:{self._case_draft}"     # the case's draft file
        if method.family == "oracle":
            drafter = Oracle(book or {})
        return api.Decoder(model, drafter=drafter, n_max=method.n_max or 4, adaptive=method.adaptive,
                           exact=exact, n_ctx=n_ctx, n_threads=self.threads)

    def _ngl_flag(self) -> str:
        """llama.cpp's ``-ngl`` for ``n_gpu_layers`` (-1, every layer: 99)."""
        from .gpu import ngl
        return ngl(self.n_gpu_layers)

    def _placed(self, case: Case, placement: Dict[str, Any], flags: Sequence[str]) -> List[Row]:
        """Run ``case`` with its layers placed so on specdec's side and so in the tools'
        flags; afterwards the models are freed (remote memory while its servers still run)."""
        self._placement, self._peer_flags = placement, tuple(flags)
        try:
            return self._run_case_here(case)
        finally:
            self._placement, self._peer_flags = {}, ()
            gc.collect()

    def _run_case(self, case: Case) -> List[Row]:
        from ..testing.local_rpc import LocalRpcServers

        if case.concurrency:             # served: specdec serve against llama-server
            from .structured import run_case
            return self._keep(run_case(self, case))
        if case.rpc_delay_ms is None and self.device_rpc:
            # as in the RPC cases: the tools get a server of their own (one client each)
            with LocalRpcServers(1, threads=self.threads) as ours, \
                    LocalRpcServers(1, threads=self.threads) as theirs:
                self.log(f"{case.name}: a local RPC server stands in for the device "
                         f"({ours.endpoints}; llama.cpp's tools: {theirs.endpoints})")
                return self._placed(case, {"n_gpu_layers": self.n_gpu_layers,
                                           "rpc_servers": ours.endpoints},
                                    ("--rpc", theirs.endpoints, "-ngl", self._ngl_flag()))
        if case.rpc_delay_ms is None:
            if self.n_gpu_layers:
                return self._placed(case, {"n_gpu_layers": self.n_gpu_layers},
                                    ("-ngl", self._ngl_flag()))
            # peers built with a GPU backend would offload by default (-ngl's default)
            return self._placed(case, {}, llama_tools.cpu_only_flags())
        # a llama.cpp RPC server serves one client at a time, and a client process keeps its
        # connection until it exits: the llama.cpp tools get servers of their own, or they
        # would wait forever behind this process's connection
        with LocalRpcServers(2, threads=self.threads, delay_ms=case.rpc_delay_ms) as ours, \
                LocalRpcServers(2, threads=self.threads, delay_ms=case.rpc_delay_ms) as peers:
            # every layer remote on both sides (llama.cpp splits them by the devices' memory)
            self.log(f"{case.name}: 2 local RPC servers, {case.rpc_delay_ms:g} ms one-way delay "
                     f"({ours.endpoints}; llama.cpp's tools: {peers.endpoints})")
            return self._placed(case, {"n_gpu_layers": -1, "rpc_servers": ours.endpoints},
                                ("--rpc", peers.endpoints, "-ngl", "99"))

    def _run_case_here(self, case: Case) -> List[Row]:
        target = self.models.target(case)
        draft = self.models.draft(case)
        self._case_draft = draft
        mtp = any(m.family == "mtp" for m in case.methods)
        model = Model(target, load_mtp=mtp, **self._placement)
        # exact mode runs on weights that are not repacked
        oracle = any(m.family == "oracle" for m in case.methods)
        exact_model = (Model(target, load_mtp=mtp, use_extra_bufts=False)
                       if oracle or any(m.exact for m in case.methods) else None)
        self._case_n_ctx = self._n_ctx(model, case.n_gen, case.prompts)
        if not self._placement:   # both heads read host memory only there
            heads = time_heads(model, self.threads, self._case_n_ctx)
            if heads is not None:
                self._heads[case.name] = heads
        books = self._record(case, model) if oracle else {}
        rows: List[Row] = []
        decs: Dict[Method, api.Decoder] = {}
        errors: Dict[Method, str] = {}
        for m in case.methods:
            reason = self._peer_reason(m)
            if reason is not None:
                errors[m] = reason
            elif m.side == SPECDEC:
                try:
                    decs[m] = self._decoder(exact_model if m.exact else model, m, case.n_gen,
                                            case.prompts, exact=m.exact, book=books.get(m))
                except Exception as e:  # noqa: BLE001
                    errors[m] = f"{type(e).__name__}: {e}"
            elif m.side == LCP:
                assert self._lcp is not None
                try:
                    kw: Dict[str, Any] = {"threads": self.threads, "n_max": m.n_max,
                                          "n_ctx": self._case_n_ctx}
                    if m.drafter == "draft":
                        if draft is None:
                            raise ValueError("this case has no draft model")
                        kw["draft_model"] = draft
                    self._lcp.load(f"{case.name}/{m.label}", target, m.drafter, **kw)
                except Exception as e:  # noqa: BLE001
                    errors[m] = str(e)
        plain = next(m for m in case.methods if m.side == SPECDEC and m.family == "plain"
                     and not m.temperature)
        rows += self._keep(self._plain_vs_llama_bench(case, model, decs[plain], target, errors))
        for p in case.prompts:
            rows += self._keep(self._run_prompt(case, p, model, decs, errors, target, draft))
        exact_check(self, case, target, mtp, rows, exact_model)
        return rows

    def _keep(self, rows: List[Row]) -> List[Row]:
        """Rows just measured: kept, and written out through ``checkpoint``."""
        self._rows += rows
        self._save()
        return rows

    def _record(self, case: Case, model: Model) -> Dict[Method, Dict[Any, List[int]]]:
        """Each timed oracle row's book (untimed): the output of that row's own decoder
        (``model``, fast mode, its ``n_max``) when it drafts that output.

        A verify batch rounds differently from a single row, so speculative output departs
        from plain output; an oracle drafting plain output is then wrong from there on and
        no ceiling. Starting from plain greedy output, each prompt's book is replaced by the
        oracle's own output until the two agree (each pass agrees further: the rows before
        the first departure were computed in the same batches). A prompt whose output agrees
        with its book is settled and not decoded again: most settle in one or two passes."""
        plain = self._decoder(model, Method(SPECDEC, "plain"), case.n_gen, case.prompts)
        self.log(f"{case.name}: recording the oracle's continuations")
        t0 = time.monotonic()
        keys = {p.name: tuple(plain.tokenize(p.text)) for p in case.prompts}
        base = {keys[p.name]: plain.generate(p.text, max_tokens=case.n_gen).tokens
                for p in case.prompts}
        n_decodes = len(case.prompts)
        books = {}
        for m in case.methods:
            if m.family != "oracle":
                continue
            book = dict(base)
            open_prompts = list(case.prompts)
            for _ in range(ORACLE_PASSES):
                dec = self._decoder(model, m, case.n_gen, case.prompts, book=book)
                out = {keys[p.name]: dec.generate(p.text, max_tokens=case.n_gen).tokens
                       for p in open_prompts}
                n_decodes += len(open_prompts)
                open_prompts = [p for p in open_prompts if out[keys[p.name]] != book[keys[p.name]]]
                book.update(out)
                if not open_prompts:
                    break
            else:
                self.log(f"{case.name}: {m.label} still departs from its book after "
                         f"{ORACLE_PASSES} passes on {', '.join(p.name for p in open_prompts)}: "
                         f"its rows there are below the ceiling")
            books[m] = book
        self.log(f"{case.name}: recorded in {time.monotonic() - t0:.0f} s "
                 f"({n_decodes} decodes of {case.n_gen} tokens)")
        return books

    def _plain_vs_llama_bench(self, case: Case, model: Model, dec: api.Decoder, target: str,
                              errors: Dict[Method, str]) -> List[Row]:
        lb = next((m for m in case.methods if m.side == LLAMA_CPP and m.family == "plain"), None)
        if lb is None:
            return []
        ours = Row(case.name, BOS_PROMPT, "plain", "specdec plain", SPECDEC, "plain")
        theirs = Row(case.name, BOS_PROMPT, "plain", lb.label, LLAMA_CPP, "plain", lb.drafter)
        bos = [model.bos if model.bos >= 0 else 0]     # llama-bench starts from BOS, or any token
        _specdec_sample(dec, bos, case.n_gen + 1, 0.0)            # warm-up, as llama-bench does
        for _ in range(self.m.reps):
            if lb not in errors:
                try:
                    theirs.tok_s_runs.append(peers.llama_bench(target, case.n_gen, threads=self.threads,
                                                               reps=self.m.bench_reps,
                                                               extra=self._peer_flags))
                except Exception as e:  # noqa: BLE001
                    errors[lb] = str(e)
            self._tick(f"{case.name} {BOS_PROMPT} llama-bench")
            # the first token comes from the prompt pass: n_gen + 1 makes n_gen decodes
            ours.tok_s_runs.append(_specdec_sample(dec, bos, case.n_gen + 1, self.sleep_s).tok_s)
            self._tick(f"{case.name} {BOS_PROMPT} specdec plain")
        ours.tok_s = statistics.median(ours.tok_s_runs)
        if lb in errors:
            theirs.status, theirs.note = "unavailable", errors[lb]
        else:
            theirs.tok_s = statistics.median(theirs.tok_s_runs)
        ours.note = f"{case.n_gen} tokens from BOS"
        return [ours, theirs]

    def _run_prompt(self, case: Case, p: Prompt, model: Model, decs: Dict[Method, api.Decoder],
                    errors: Dict[Method, str], target: str, draft: Optional[str]) -> List[Row]:
        timed = [m for m in case.methods if not (m.side == LLAMA_CPP and m.family == "plain")]
        errs = dict(errors)
        echo = b"".join(model.token_to_piece(t, special=True)
                        for t in model.tokenize(p.text, add_special=True, parse_special=True)
                        ).decode("utf-8", "replace")
        plain_m = next(m for m in timed if m.side == SPECDEC and m.family == "plain"
                       and not m.temperature)
        if p is case.prompts[0] and not any(m.side == LLAMA_CPP and m.family == "plain"
                                            for m in case.methods):
            _specdec_sample(decs[plain_m], p.text, case.n_gen, 0.0)   # warm-up (page faults)
        if p is case.prompts[0]:
            # the adaptive policy learns costs and acceptance across the requests of one
            # Decoder (as in a service); its untimed first request is that learning
            for m in timed:
                if m.side == SPECDEC and m.adaptive and m in decs and m not in errs:
                    _specdec_sample(decs[m], p.text, case.n_gen, 0.0)
        samples: Dict[Method, List[Sample]] = {m: [] for m in timed}
        for _ in range(self.m.reps):
            for m in timed:
                if is_sampled_plain(m):
                    continue      # timed in turn with greedy plain below (``_sampled_vs_greedy``)
                if m in errs:
                    self._tick(f"{case.name} {p.name} {m.label}: skipped ({errs[m][:60]})")
                    continue
                try:
                    samples[m].append(self._sample(case, p, m, decs, target, draft, echo))
                    s = samples[m][-1]
                    self._tick(f"{case.name} {p.name} {m.label}: {s.tok_s:.1f} tok/s")
                except Exception as e:  # noqa: BLE001 - a peer that fails gets a row saying why
                    errs[m] = f"{type(e).__name__}: {str(e)[:300]}"
                    self._tick(f"{case.name} {p.name} {m.label}: error {errs[m][:80]}")
        ref = samples[plain_m][0] if samples[plain_m] else None
        rows = []
        for m in timed:
            if is_sampled_plain(m):
                rows.append(self._sampled_vs_greedy(case, p, m, decs, errs, plain_m, ref))
                continue
            r = Row(case.name, p.name, p.category, m.label, m.side, m.family, m.drafter, m.n_max,
                    m.adaptive, m.exact, m.temperature)
            got = samples[m]
            if m in errs and not got:
                r.status = "unavailable" if m in errors else "error"
                r.note = errs[m]
            elif got:
                if m in errs:
                    r.status, r.note = "error", errs[m]
                r.tok_s_runs = [s.tok_s for s in got]
                r.tok_s = statistics.median(r.tok_s_runs)
                last = got[-1]
                r.drafted, r.accepted = last.drafted, last.accepted
                r.drafted_per_position, r.accepted_per_position = last.drafted_at, last.accepted_at
                if ref is not None and m is not plain_m:
                    if last.tokens is not None:
                        r.match = prefix_share(last.tokens, ref.tokens or [])
                    else:
                        r.match = prefix_share(last.text, ref.text)
                elif m is plain_m:
                    r.match = 1.0
            rows.append(r)
        if case.interleave:
            rows += self._interleaved(case, p, decs, errs, plain_m)
        return rows

    def _sampled_vs_greedy(self, case: Case, p: Prompt, m: Method, decs: Dict[Method, api.Decoder],
                           errs: Dict[Method, str], plain_m: Method, ref: Optional[Sample]) -> Row:
        """The sampled plain row ``m``, timed in turn with greedy plain (``sampled_row``)."""
        why = errs.get(m) or errs.get(plain_m)
        if why is None:
            if p is case.prompts[0]:       # warm-up, as plain's
                _specdec_sample(decs[m], p.text, case.n_gen, 0.0, m.temperature)
            r = sampled_row(case, p, m, decs[m], decs[plain_m], self.m.reps, ref)
        else:
            r = Row(case.name, p.name, p.category, m.label, m.side, m.family,
                    temperature=m.temperature)
            r.status, r.note = ("unavailable" if m in errs else "error"), why
        for i in range(self.m.reps):
            self._tick(f"{case.name} {p.name} {m.label}: " + (
                f"{r.tok_s_runs[i]:.1f} tok/s, greedy in turn {r.ref_tok_s_runs[i]:.1f}"
                if i < len(r.tok_s_runs) else f"{r.status} ({r.note[:60]})"))
        return r

    def _interleaved(self, case: Case, p: Prompt, decs: Dict[Method, api.Decoder],
                     errs: Dict[Method, str], plain_m: Method) -> List[Row]:
        """Each adaptive method against plain decoding, round by round in turn (see
        ``interleave``): the ratio that decides "never slower than plain"."""
        rows = []
        for m in case.methods:
            if not (m.side == SPECDEC and m.adaptive) or m in errs or plain_m in errs:
                continue
            r = Row(case.name, interleaved_prompt(p.name), p.category, m.label, m.side, m.family,
                    m.drafter, m.n_max, m.adaptive)
            try:
                got = interleave(decs[m], decs[plain_m], p.text, case.n_gen, case.interleave,
                                 before=forget_texts)
            except Exception as e:  # noqa: BLE001
                r.status, r.note = "error", f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(r)
                continue
            r.tok_s, r.ref_tok_s = got.tok_s, got.ref_tok_s
            r.tok_s_runs = [n / t for n, t in zip(got.tokens, got.seconds)]
            r.ref_tok_s_runs = [n / t for n, t in zip(got.tokens, got.ref_seconds)]
            r.drafted, r.accepted = got.drafted, got.accepted
            r.match = 1.0 if got.same_tokens else 0.0
            r.note = f"{case.interleave} requests"
            self._tick(f"{case.name} {p.name} {m.label} interleaved with plain: "
                       f"{r.tok_s / r.ref_tok_s:.3f}x")
            rows.append(r)
        return rows

    def _sample(self, case: Case, p: Prompt, m: Method, decs: Dict[Method, api.Decoder],
                target: str, draft: Optional[str], echo: str) -> Sample:
        if m.side == SPECDEC:
            return _specdec_sample(decs[m], p.text, case.n_gen, self.sleep_s, m.temperature)
        if m.family == "greedy":
            out = llama_tools.run_simple_timed(target, p.text, case.n_gen, threads=self.threads,
                                               extra=self._peer_flags, echo=echo)
            return Sample(out["tok_s"], None, out["text"])
        if m.side == LCP:
            assert self._lcp is not None
            out = self._lcp.run(f"{case.name}/{m.label}", p.text, case.n_gen)
            return Sample(out["tok_s"], out["tokens"], out["text"], out.get("drafted", 0),
                          out.get("accepted", 0))
        out = llama_tools.run_spec_simple(
            target, p.text, case.n_gen, spec_type=m.drafter, n_max=m.n_max,
            extra=m.extra + self._peer_flags,
            echo=echo, draft=draft if m.family in ("draft", "eagle3", "dflash") else None,
            n_ctx=self._case_n_ctx,
            threads=self.threads)
        return Sample(out["tok_s"], None, out["text"], out["n_drafted"], out["n_accepted"])

    # --- all ----------------------------------------------------------------------------

    def run(self) -> Dict[str, Any]:
        """Run every case; returns the results dict that ``report`` renders and saves."""
        self._t0 = time.monotonic()
        self._total = self._count()
        self._oracle_checks = []
        self._rows, self._completed = [], []
        self._info = machine.describe(self.threads, self._device())
        self._save()           # a run stopped before its first row still leaves a results file
        self._build_tools()
        self._t_steps = time.monotonic()
        try:
            with progress(total=self._total, desc=f"specdec bench ({self.m.name})",
                          unit="step", leave=True) as self._bar:
                for case in self.m.cases:
                    self.log(f"== {case.name}: {len(case.prompts)} prompt(s) x {len(case.methods)} "
                             f"method(s), {case.n_gen} tokens, {self.m.reps} rounds")
                    self._run_case(case)
                    self._completed.append(case.name)
                    self._save()
        finally:
            self._bar = None
            if self._lcp is not None:
                self._lcp.close()
        return self._results(complete=True)

    def _build_tools(self) -> None:
        """The peers this matrix runs, built up front as named steps (``peers.build_for``)."""
        if self.peers_enabled and self.build_peers:
            self._lcp_error = peers.build_for(self.m.cases, self.log)

    def _device(self) -> Optional[str]:
        """What the layers run on when not this CPU: the RPC stand-in or the GPUs' names."""
        if self.device_rpc:
            return "rpc-standin"
        if self.n_gpu_layers:
            from .gpu import device_names
            return ",".join(device_names()) or None
        return None

    def _results(self, complete: bool) -> Dict[str, Any]:
        """The results dict that ``report`` renders and saves; ``progress`` says which cases
        are complete (a checkpoint's rows of the running case may lack their exact check)."""
        info = self._info
        return {
            "schema": 1,
            "matrix": self.m.name,
            "machine": info,
            "peers": {"llama.cpp": info.get("llama_cpp_pin"),
                      "llama-cpp-python": self._lcp.version if self._lcp else self._lcp_error},
            "settings": {"reps": self.m.reps, "check_tokens": self.m.check_tokens,
                         "oracle_check_n_max": list(self.m.oracle_check_n_max),
                         "threads": self.threads, "inject_sleep_ms": self.sleep_s * 1000,
                         "n_gpu_layers": self.n_gpu_layers, "device_rpc": self.device_rpc,
                         "cases": {c.name: {"n_gen": c.n_gen, "model": c.model,
                                            "accuracy": c.accuracy, "arch": c.arch, "dtype": c.dtype,
                                            "interleave": c.interleave,
                                            "rpc_delay_ms": c.rpc_delay_ms}
                                   for c in self.m.cases}},
            "wall_s": round(time.monotonic() - self._t0, 1),
            "progress": {"complete": complete, "planned": [c.name for c in self.m.cases],
                         "completed": list(self._completed)},
            "rows": [r.to_dict() for r in self._rows],
            "oracle_checks": list(self._oracle_checks),
            "lm_head": dict(self._heads),
        }


def run(matrix: Matrix, **kw: Any) -> Dict[str, Any]:
    return Runner(matrix, **kw).run()


__all__ = ["Row", "Runner", "run", "rows_of", "INJECT_ENV", "BOS_PROMPT", "INTERLEAVED",
           "interleaved_prompt", "is_interleaved"]
