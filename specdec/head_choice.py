"""Which LM head a target context uses: the lazy head or llama.cpp's own, chosen by timing
both for the loaded model on this machine, once, and cached.

Why: the lazy head (``_lm_head.h``: the decode stops at the final norm and a verify row's
logits are computed, with ggml's ``vec_dot``, only when verification reads it) wins where
llama.cpp's head is slow for the rows a decode asks for (tinyBLAS on an AMD EPYC, ~4 ms a
row of Gemma's 262k-token head), and loses where llama.cpp's kernels beat ``vec_dot`` (an
Intel Xeon with AVX-512: t_lm_head 1.71 s against t_target 1.21 s for 128 tokens). Which
one wins depends on the CPU, the head's type and width and the thread count, so it is
measured: decodes of a plain step, of a verify batch (``n_max + 1`` rows, each one read, as
a fully accepted draft reads them) and, for a long verify, of one in between, each way,
interleaved, medians compared.

The choice is per decode, by its output rows. The lazy head reads its whole weight once per
pass for the rows it computes and wins a plain step; llama.cpp's multiplies every output row
in the graph, and on an AMD EPYC wins a verify of 65 rows (Gemma: 238 ms against 247) while
losing the plain step (14.3 ms against 12.1) and a verify of 17 rows (91 against 74). One
choice for every decode, taken on the plain step plus the 65-row verify, gave llama.cpp's
head to an adaptive suffix drafter's plain steps, which its code prompts are mostly: 0.79x
plain decoding while drafting nothing. So the measured shapes give ``upto``, the most output
rows a decode may have and still take the lazy head (where the two heads' times cross,
interpolated between the measured shapes); decodes with more rows run llama.cpp's.

The record lives in the cache dir (``head-choice/<key>.json``), keyed by the model's
content, the CPU, the thread count, exact mode and the verify width, so later loads do
not measure again. A record that does not parse, or that names another model, CPU or
setting, is ignored and measured again. A measurement that does not look like the
machine's own is used for that load and not recorded (``HeadTimes.steady``): measured
while other processes held the cores, one recorded gemma's lazy head at 2.3 s a verify
against 0.25 s, and every later load on that machine kept llama.cpp's head. ``lazy_logits=True`` / ``False`` skip all this.

The choice is for unconstrained rows. Under a grammar the lazy head computes a row that
allows few tokens (a JSON key, punctuation, an enum's tail) as those tokens' logits alone,
a dot product each, against a pass over the whole 262k-row head either way: so where
llama.cpp's head wins, decodes that hold a grammar's rows still stop at the norm
(``Context.set_lazy_head(grammar=True)``).
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from . import cache
from ._build_facts import LLAMA_CPP_PIN
from ._core import Batch, Context, LlamaAbortError
from ._cpu import cpu_model

#: bump when the measurement or the record changes meaning, or when either head's cost does
#: (4: the lazy head's fused pass tiled, one read of the weights for any number of rows, and
#: two rows per 512-bit register with AVX-512 VNNI): older records are then ignored
FORMAT = 4
#: the sub-directory of the cache dir holding the records
KIND = "head-choice"
#: timed decodes per path and shape (after one untimed decode of each)
REPS = 5
#: a verify of at least this many rows is measured at a shape in between too (its quarter):
#: the two heads' times are not straight lines in the rows, and the crossing is found between
#: the two measured shapes it lies between
MID_FROM = 8
#: ``upto`` where the lazy head wins every measured shape: every decode takes it
EVERY = 1 << 30
#: a measurement is recorded only when each path's timed runs of a shape agree within this
#: factor (the second slowest against the fastest: one outlier is allowed) ...
NOISY_SPREAD = 2.0
#: ... and neither head costs this many times the other (idle 2-core machines: at most 1.6x)
IMPLAUSIBLE = 3.0


@dataclass(frozen=True)
class HeadTimes:
    """Median seconds of a decode whose logits are all ready, per path: a plain step
    (``plain``) and a verify batch (``verify``, 0 when nothing drafts)."""

    lazy_plain: float
    graph_plain: float
    lazy_verify: float = 0.0
    graph_verify: float = 0.0
    spread: float = 1.0     # the widest agreement of one path's runs (see NOISY_SPREAD)
    plain_rows: int = 1     # the shapes timed: a plain step's output rows, ...
    verify_rows: int = 0    # ... a verify's (0: none), ...
    mid_rows: int = 0       # ... and one in between (0: none), timed so:
    lazy_mid: float = 0.0
    graph_mid: float = 0.0

    def shapes(self) -> List[Tuple[int, float, float]]:
        """``(rows, lazy, graph)`` of each shape timed, fewest rows first."""
        out = [(self.plain_rows, self.lazy_plain, self.graph_plain)]
        if self.mid_rows:
            out.append((self.mid_rows, self.lazy_mid, self.graph_mid))
        if self.verify_rows:
            out.append((self.verify_rows, self.lazy_verify, self.graph_verify))
        return out

    @property
    def upto(self) -> int:
        """The most output rows a decode may have and take the lazy head: 0 where llama.cpp's
        wins the plain step, ``EVERY`` where the lazy head wins every shape timed, else where
        the two heads' times cross, interpolated between the shapes on either side."""
        pts = self.shapes()
        n0, l0, g0 = pts[0]
        if l0 > g0:
            return 0
        for n1, l1, g1 in pts[1:]:
            if l1 > g1:      # the lazy head's lead (g - l) falls from >= 0 to < 0 in (n0, n1]
                lead0, lead1 = g0 - l0, g1 - l1
                return n0 + int((n1 - n0) * lead0 / (lead0 - lead1))
            n0, l0, g0 = n1, l1, g1
        return EVERY

    @property
    def lazy_wins(self) -> bool:
        """The lazy head costs no more than llama.cpp's over a plain step and a verify."""
        return self.lazy_plain + self.lazy_verify <= self.graph_plain + self.graph_verify

    @property
    def steady(self) -> bool:
        """The runs agreed and neither head is implausibly dearer: the machine's own
        timings, worth recording (else another process most likely held the cores)."""
        lazy, graph = self.lazy_plain + self.lazy_verify, self.graph_plain + self.graph_verify
        if lazy <= 0.0 or graph <= 0.0:
            return False
        return self.spread <= NOISY_SPREAD and max(lazy, graph) <= IMPLAUSIBLE * min(lazy, graph)


@dataclass(frozen=True)
class HeadChoice:
    """The head a context uses and why: the lazy head for decodes of at most ``upto`` output
    rows (``EVERY``: all of them, ``lazy``) and llama.cpp's for the rest; the ``times`` it was
    chosen by, and whether they came from the cache (``cached``)."""

    upto: int
    times: HeadTimes
    cached: bool

    @property
    def lazy(self) -> bool:
        """The lazy head for every decode."""
        return self.upto >= EVERY


def key_fields(ctx: Context, *, verify_rows: int, exact: bool) -> Dict[str, Any]:
    """What a measurement holds for: the model's content, the CPU, threads and shapes, and
    the kernels' versions (specdec's and llama.cpp's)."""
    from . import __version__   # (specdec is imported by the time a context is made)
    return {"format": FORMAT, "specdec": __version__, "llama_cpp": LLAMA_CPP_PIN,
            "model": cache.content_key(ctx.model.path), "cpu": cpu_model(),
            "n_cpus": os.cpu_count() or 1, "n_threads": ctx.n_threads, "exact": bool(exact),
            "verify_rows": int(verify_rows)}


def record_path(fields: Dict[str, Any]) -> Path:
    """Where the record of ``fields`` lives (a file name hashed from all of them)."""
    h = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return cache.cache_dir() / KIND / f"{h}.json"


def load(path: Path, fields: Dict[str, Any]) -> Optional[HeadChoice]:
    """The record at ``path`` if it is one for ``fields``; None if it is missing, does not
    parse, or was measured for anything else."""
    try:
        rec = json.loads(path.read_text())
        if not isinstance(rec, dict) or any(rec.get(k) != v for k, v in fields.items()):
            return None
        t = rec["times"]
        times = HeadTimes(**{k: (int if f.type in (int, "int") else float)(t[k])
                             for k, f in HeadTimes.__dataclass_fields__.items()})
        if type(rec["upto"]) is not int or not 0 <= rec["upto"] <= EVERY:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return HeadChoice(rec["upto"], times, cached=True)


def save(path: Path, fields: Dict[str, Any], choice: HeadChoice) -> None:
    """Writes the record (atomically: a reader sees the old one or the new one)."""
    rec = dict(fields, upto=choice.upto, times=asdict(choice.times),
               measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(rec, indent=1))
    os.replace(tmp, path)


def _decode(ctx: Context, batch: Batch, n: int, lazy: bool) -> float:
    """Seconds of one decode of ``n`` rows on sequence 0 with every row's logits ready,
    read as verification reads them (two rows in a first pass, the rest in a second)."""
    ctx.seq_rm(0, -1, -1)
    t0 = time.perf_counter()
    ctx.decode(batch)
    if lazy:
        ctx.prepare_logits(0, min(2, n))
        if n > 2:
            ctx.prepare_logits(2, n - 2)
    return time.perf_counter() - t0


def measure(ctx: Context, *, plain_rows: int, verify_rows: int) -> Optional[HeadTimes]:
    """Times both heads on ``ctx`` (made with ``lazy_logits=True``), interleaved, and leaves
    the lazy head on; None when the lazy head cannot serve this model (llama.cpp's head is
    then the only one). Sequence 0's memory is cleared before and after."""
    token = min(1, ctx.n_vocab - 1)
    mid = verify_rows // 4 + 1 if verify_rows >= MID_FROM else 0
    shapes = [plain_rows] + [n for n in (mid, verify_rows) if n > plain_rows]
    batches = {}
    for n in shapes:
        b = Batch(n)
        for i in range(n):
            b.add(token, i, 0, True)
        batches[n] = b
    med: Dict[Tuple[bool, int], float] = {}
    spread = 1.0
    try:
        ctx.set_lazy_head(True)
        _decode(ctx, batches[plain_rows], plain_rows, False)   # the head finds its weight
        if ctx.lazy_logits != "on":
            return None
        for n in shapes:
            runs: Dict[bool, list] = {True: [], False: []}
            for rep in range(REPS + 1):
                for lazy in ((True, False) if rep % 2 else (False, True)):
                    ctx.set_lazy_head(lazy)
                    t = _decode(ctx, batches[n], n, lazy)
                    if rep:   # the first of each is a warm-up
                        runs[lazy].append(t)
            med[(True, n)] = statistics.median(runs[True])
            med[(False, n)] = statistics.median(runs[False])
            for r in runs.values():
                r.sort()
                spread = max(spread, r[-2] / r[0] if r[0] > 0 else float("inf"))
    finally:
        try:
            ctx.seq_rm(0, -1, -1)
            ctx.set_lazy_head(True)
        except LlamaAbortError:
            pass   # a decode above aborted (the context is freed): its error is the one raised
    v = verify_rows if verify_rows > plain_rows else 0
    m = mid if mid > plain_rows else 0
    return HeadTimes(med[(True, plain_rows)], med[(False, plain_rows)],
                     med[(True, v)] if v else 0.0, med[(False, v)] if v else 0.0, spread,
                     plain_rows, v, m, med[(True, m)] if m else 0.0, med[(False, m)] if m else 0.0)


def choose(ctx: Context, *, verify_rows: int, exact: bool) -> Optional[HeadChoice]:
    """Sets ``ctx``'s head (made with ``lazy_logits=True``) to the faster one for this
    model, CPU and threads: from the cached record, else measured and recorded. None when
    the lazy head cannot serve the model (``ctx.lazy_logits`` then says why)."""
    fields = key_fields(ctx, verify_rows=verify_rows, exact=exact) if ctx.model.path else None
    path = record_path(fields) if fields is not None else None
    choice = load(path, fields) if path is not None and fields is not None else None
    if choice is None:
        # exact mode never decodes a single row: its plain step has two
        times = measure(ctx, plain_rows=2 if exact else 1, verify_rows=verify_rows)
        if times is None:
            return None
        choice = HeadChoice(times.upto, times, cached=False)
        if path is not None and fields is not None and times.steady:
            try:
                save(path, fields, choice)
            except OSError:
                pass   # a read-only cache dir: measured again at the next load
    # under a grammar the lazy head computes a row's allowed tokens only, which beats either
    # whole head: decodes holding a grammar's rows keep it whichever head won unconstrained
    ctx.set_lazy_head(choice.lazy, grammar=True, upto=0 if choice.lazy else choice.upto)
    return choice
