"""What a benchmark run measures: models, prompts and methods (``quick`` and ``full``).

A *method* is one way of decoding (a side: specdec, llama.cpp or llama-cpp-python; a
family that pairs like with like across sides; its draft settings). A *case* is one
model with its prompts and methods. The fixed ``n_max`` of each drafter in ``quick``
is the best one found by ``full``, which sweeps them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

from ..config import N_MAX_LIMIT
from .prompts import Prompt, all_prompts

SPECDEC = "specdec"
LLAMA_CPP = "llama.cpp"
LCP = "llama-cpp-python"
LLAMA_SERVER = "llama-server"     # llama.cpp's server: the structured case's peer
JSON_SCHEMA = "json_schema"       # a method's constraint: each request's JSON schema

MTP_PROMPT = ("The bigram model ignores the meaning of this prompt; it only needs some tokens "
              "to start from, and a few more so that the prompt pass is not trivial. ") * 2


@dataclass(frozen=True)
class Method:
    side: str                        # SPECDEC, LLAMA_CPP or LCP
    family: str                      # plain, greedy (a peer's sampling plain), ngram, ngram-map, ngram-mod, ngram-cache, suffix, draft, mtp,
                                     # eagle3, dflash, oracle
    drafter: str = ""                # specdec drafter spec, llama.cpp --spec-type, or LCP kind
    n_max: int = 0
    adaptive: bool = False
    extra: Tuple[str, ...] = ()      # llama.cpp flags
    exact: bool = False              # specdec exact mode (batch-invariant kernels), timed
    temperature: float = 0.0         # specdec: sampled decoding at this temperature (0: greedy)
    constraint: str = ""             # JSON_SCHEMA: every output under its request's schema

    @property
    def label(self) -> str:
        tag = ((" exact" if self.exact else "")
               + (f" t{self.temperature:g}" if self.temperature else "")
               + (f" {self.constraint}" if self.constraint else ""))
        if self.family == "greedy":      # a peer's plain decoding that samples (llama-simple)
            return f"{self.side} {self.drafter} greedy"
        if self.family == "plain":
            return f"{self.side} plain{tag}"
        how = "adaptive" if self.adaptive else f"n{self.n_max}"
        return f"{self.side} {self.drafter} {how}{tag}"


@dataclass(frozen=True)
class Case:
    name: str                        # e.g. "gemma3-270m", "mtp-mid-90"
    model: str                       # "gemma", "layerskip:N" (gemma + its first N layers), "bigram",
                                     # "bigram+eagle3" (bigram + an EAGLE-3 draft),
                                     # "bigram+dflash" (periodic bigram + a DFlash draft)
    prompts: Tuple[Prompt, ...]
    methods: Tuple[Method, ...]
    n_gen: int
    size: str = ""                   # bigram: "tiny" / "mid" / "large"
    accuracy: float = 0.0            # bigram: first-draft accuracy of the MTP head (or EAGLE-3 draft)
    arch: str = "qwen35"             # bigram: qwen35 or qwen35moe
    dtype: str = ""                  # bigram: weight type ("" = the size's default, F16 for mid)
    interleave: int = 0              # requests per adaptive method timed round by round with plain
    rpc_delay_ms: Optional[float] = None   # every layer on two local RPC servers behind a proxy
                                           # adding this one-way delay; None: local
    concurrency: int = 0             # >0: served (``structured``), this many requests at once


@dataclass(frozen=True)
class Matrix:
    name: str
    cases: Tuple[Case, ...]
    reps: int = 2                    # alternating rounds per (prompt, method); medians
    check_tokens: int = 64           # tokens of the exact-mode output check
    bench_reps: int = 2              # llama-bench repetitions per round
    oracle_check_n_max: Tuple[int, ...] = (4, 8, 16)   # exact check: verify batches of n + 1 rows
    expected_minutes: float = 0.0    # wall time on 2 cores with peers built (stated at start)


#: the adaptive lookup drafters' cap: the longest draft there is (``N_MAX_LIMIT``). A long
#: verbatim repeat is accepted 40+ tokens at a time (llama.cpp's default drafts 48), and the
#: policy prices long drafts by the measured cost line, so the cap is not what limits them
LOOKUP_CAP = N_MAX_LIMIT


def _s(family: str, drafter: str, n_max: int = 0, adaptive: bool = False,
       exact: bool = False) -> Method:
    """A specdec method; with ``adaptive`` ``n_max`` is the longest draft the policy may pick."""
    return Method(SPECDEC, family, drafter, n_max, adaptive, exact=exact)


# exact mode's cost: plain, a fixed n-gram and the adaptive suffix drafter, timed in exact mode
# beside the same methods in fast mode (ratio kind "exact-cost")
EXACT = (Method(SPECDEC, "plain", exact=True), _s("ngram", "ngram", 3, exact=True),
         _s("suffix", "suffix", 16, adaptive=True, exact=True))


# the oracle drafter (``oracle.py``, harness only) timed at these draft lengths: on each prompt,
# the speedup a drafter that is always right gets, i.e. the hardware's ceiling per n_max
ORACLE_TIMED = tuple(Method(SPECDEC, "oracle", "oracle", n) for n in (2, 4, 8, 16))


PLAIN = Method(SPECDEC, "plain")
# sampled plain decoding at OpenAI's default temperature (what a client that sends none gets):
# its cost over greedy plain is the sampler's (ratio kind "sampling-cost")
SAMPLED_PLAIN = Method(SPECDEC, "plain", temperature=1.0)
LLAMA_PLAIN = Method(LLAMA_CPP, "plain", "llama-bench")
LCP_PLAIN = Method(LCP, "plain", "plain")
# llama.cpp's plain decoding that samples (greedy) on each prompt, as specdec plain does;
# llama-bench decodes without sampling, so it is the lower bound of the work, not the same work
LLAMA_GREEDY = Method(LLAMA_CPP, "greedy", "llama-simple")


_LLAMA_FAMILY = {"ngram-simple": "ngram", "ngram-map-k": "ngram-map", "ngram-mod": "ngram-mod",
                 "ngram-cache": "ngram-cache"}
# ngram-simple and ngram-map-k match a 12-token key by default and then draft nothing
# shorter than the key: a 3-token key is their best setting on these prompts (see the anchors)
_LLAMA_EXTRA = {"ngram-simple": ("--spec-ngram-simple-size-n", "3"),
                "ngram-map-k": ("--spec-ngram-map-k-size-n", "3")}


def _llama_ngram(n_max: int, mode: str = "ngram-simple") -> Method:
    return Method(LLAMA_CPP, _LLAMA_FAMILY[mode], mode, n_max, extra=_LLAMA_EXTRA.get(mode, ()))


# llama.cpp's own defaults for ngram-simple: a 12-token key, drafts of up to 48 tokens. On long
# verbatim repeats (code that restates itself) the long key finds the right occurrence and the
# long draft rides it: there it beats the short keys above, so both are peers
LLAMA_NGRAM_DEFAULT = Method(LLAMA_CPP, "ngram", "ngram-simple", 48,
                             extra=("--spec-ngram-simple-size-n", "12"))


def _pick(names: List[str]) -> Tuple[Prompt, ...]:
    by = {p.name: p for p in all_prompts()}
    return tuple(by[n] for n in names)


# the target's own MTP head (what llama.cpp's draft-mtp runs), and a Q4_0 copy of it: a draft
# step reads the whole head, mostly its vocab projection, so the copy drafts ~2.5x faster
MTP_HEADS = ("mtp", "mtp:q4_0")


def _mtp_case(acc: float, n_max_list: Tuple[int, ...], size: str, n_gen: int,
              arch: str = "qwen35", dtype: str = "", interleave: int = 0,
              heads: Tuple[str, ...] = MTP_HEADS, adaptive_cap: int = 4,
              greedy_peer: bool = False, llama_plain: bool = True) -> Case:
    """specdec (both heads) and llama.cpp's draft-mtp at each fixed ``n_max``, plus specdec's
    adaptive policy (also timed round by round against plain decoding, ``interleave``
    requests: the floor "never below 0.97x plain" is a question of a few percent).
    ``llama_plain``: llama-bench's plain decoding too (its trunk's speed, the same at every
    head accuracy: a matrix may time it once per size and weight type)."""
    methods = ([PLAIN] + ([LLAMA_PLAIN] if llama_plain else [])
               + ([LLAMA_GREEDY] if greedy_peer else []))
    for head in heads:
        methods += [_s("mtp", head, n) for n in n_max_list]
    methods += [Method(LLAMA_CPP, "mtp", "draft-mtp", n) for n in n_max_list]
    methods += [_s("mtp", head, adaptive_cap, adaptive=True) for head in heads]
    tag = "mtp-moe" if arch != "qwen35" else "mtp"
    name = f"{tag}-{size}{'-' + dtype if dtype else ''}-{round(acc * 100)}"
    return Case(name, "bigram", (Prompt("bigram", "open", MTP_PROMPT),), tuple(methods), n_gen,
                size, acc, arch, dtype, interleave)


# llama.cpp's draft-eagle3 and draft-dflash stop a draft below their p_min (0.75 by default);
# specdec's p_min is 0 unless set: both sides draft to n_max
EAGLE3_LLAMA_EXTRA = ("--spec-draft-p-min", "0")


def _eagle3_case(acc: float, n_max_list: Tuple[int, ...], size: str, n_gen: int,
                 interleave: int = 0) -> Case:
    """An EAGLE-3 draft (``specdec.testing.eagle3``) of the bigram target whose first draft is
    right ``acc`` of the time: specdec and llama.cpp's draft-eagle3 at each fixed ``n_max``,
    plus specdec's adaptive policy with the longest of them as its cap."""
    methods = [PLAIN, LLAMA_PLAIN]
    methods += [_s("eagle3", "eagle3", n) for n in n_max_list]
    methods += [Method(LLAMA_CPP, "eagle3", "draft-eagle3", n, extra=EAGLE3_LLAMA_EXTRA)
                for n in n_max_list]
    methods.append(_s("eagle3", "eagle3", max(n_max_list), adaptive=True))
    return Case(f"eagle3-{size}-{round(acc * 100)}", "bigram+eagle3",
                (Prompt("bigram", "open", MTP_PROMPT),), tuple(methods), n_gen, size, acc,
                interleave=interleave)


def _dflash_case(acc: float, n_max_list: Tuple[int, ...], size: str, n_gen: int,
                 interleave: int = 0) -> Case:
    """A DFlash draft (``specdec.testing.dflash``) of the periodic bigram target, right on
    ``acc`` of every cycle's tokens: specdec and llama.cpp's draft-dflash at each fixed
    ``n_max``, plus specdec's adaptive policy (up to the block's 15 draft tokens)."""
    methods = [PLAIN, LLAMA_PLAIN]
    methods += [_s("dflash", "dflash", n) for n in n_max_list]
    methods += [Method(LLAMA_CPP, "dflash", "draft-dflash", n, extra=EAGLE3_LLAMA_EXTRA)
                for n in n_max_list]
    methods.append(_s("dflash", "dflash", 15, adaptive=True))
    return Case(f"dflash-{size}-{round(acc * 100)}", "bigram+dflash",
                (Prompt("bigram", "open", MTP_PROMPT),), tuple(methods), n_gen, size, acc,
                interleave=interleave)


# llama.cpp's RPC engine: every layer of the target on two local ``specdec rpc-server``s (a
# layer split, as over two machines), each message delayed by a user-space proxy (no tc netem
# here). A decode pays network round trips whatever its row count, so a verify of k+1 rows
# costs little more than one token: the case where speculation should pay most.
RPC_DELAYS_MS = (0.0, 0.5, 2.0)


def _rpc_case(delay_ms: float, prompts: Tuple[Prompt, ...], n_gen: int) -> Case:
    methods = (PLAIN, LLAMA_PLAIN, _s("ngram", "ngram", 3),
               _s("ngram", "ngram", LOOKUP_CAP, adaptive=True),
               _s("suffix", "suffix", 8), _s("suffix", "suffix", LOOKUP_CAP, adaptive=True),
               _llama_ngram(3), _llama_ngram(3, "ngram-map-k"), _llama_ngram(8, "ngram-mod"))
    return Case(f"rpc-{delay_ms:g}ms", "gemma", prompts, methods, n_gen, rpc_delay_ms=delay_ms)


def structured_cases(n_gen: int = 192, full: bool = False) -> Tuple[Case, ...]:
    """JSON-schema extraction and classification (``structured_prompts``) on gemma3-270m,
    served at concurrency 1 and 4 (``structured``): specdec's forced-token drafting with
    n-gram and suffix drafting against its own constrained plain decoding, its unconstrained
    plain decoding (what the mask costs), and llama-server's constrained decoding plain and
    with its n-gram modes (best settings as above), every side writing the same compact
    JSON (``structured``). ``n_gen`` caps each answer, well above the constrained answers'
    length (up to ~120 tokens), so that each ends with its JSON. ``full``: each drafter
    fixed and adaptive."""
    from .structured_prompts import SETS, describe

    j = JSON_SCHEMA
    methods = (PLAIN, Method(SPECDEC, "plain", constraint=j),
               Method(SPECDEC, "ngram", "ngram", 8, constraint=j),
               Method(SPECDEC, "suffix", "suffix", 16, adaptive=True, constraint=j))
    if full:
        methods += (Method(SPECDEC, "ngram", "ngram", 8, adaptive=True, constraint=j),
                    Method(SPECDEC, "suffix", "suffix", 8, constraint=j))
    methods += (Method(LLAMA_SERVER, "plain", constraint=j),)
    methods += tuple(replace(_llama_ngram(8, mode), side=LLAMA_SERVER, constraint=j)
                     for mode in ("ngram-simple", "ngram-map-k", "ngram-mod"))
    prompts = tuple(Prompt(name, name, describe(name)) for name in SETS)
    return tuple(Case(f"structured-c{c}", "gemma", prompts, methods, n_gen, concurrency=c)
                 for c in (1, 4))


def ci() -> Matrix:
    """The CI tier (``specdec bench --ci``): the ratios that matter most in about 3 minutes on
    2 cores with peers built. Plain against llama-bench; the best n-gram drafters (fixed and
    adaptive suffix) against plain and against llama.cpp's two strongest n-gram modes; MTP at
    90% (fixed, adaptive, llama.cpp's draft-mtp); the floor (adaptive MTP >= 0.97x plain,
    interleaved). Two short grounded prompts, 64 tokens, 3 alternating rounds (the gate needs
    a spread); the exact-mode check at 32 tokens and one oracle batch size."""
    gemma = Case("gemma3-270m", "gemma", _pick(["code-api-head", "repeat-passage"]),
                 (PLAIN, LLAMA_PLAIN, _s("ngram", "ngram", 3),
                  _s("suffix", "suffix", LOOKUP_CAP, adaptive=True),
                  _llama_ngram(3), _llama_ngram(3, "ngram-map-k")),
                 n_gen=64)
    mtp = _mtp_case(0.9, (3,), "mid", 64, interleave=2, heads=("mtp",))
    return Matrix("ci", (gemma, mtp), reps=3, check_tokens=32, bench_reps=1,
                  oracle_check_n_max=(8,), expected_minutes=3)


#: the quick matrix's wall time on 2 cores with peers built and the synthetic models made,
#: measurement and checks (stated at its start), as measured (see ``quick``): under the
#: 10-minute aim with room for a slower CPU or a busier machine
QUICK_MINUTES = 8    # measured: 472 s on an idle 2-core AMD EPYC, 2026-11-27 (168 steps)
#: the quick matrix's steps (``Runner``'s count, ``--list``) when ``QUICK_MINUTES`` was derived:
#: a quick with more states a duration nobody derived (``tests/test_bench_ci.py``)
QUICK_STEPS = 168

# the oracle's draft length in ``quick``: the one that was the ceiling on every prompt of the
# idle runs but once (n8, by 2%); each oracle row costs a recording of its own, and n2/n4/n8 sit
# at or below it (``full`` times all four: the ceiling per draft length)
QUICK_ORACLE = tuple(m for m in ORACLE_TIMED if m.n_max == 16)


def quick() -> Matrix:
    """Every tracked ratio of issue 30 in one run, under 10 minutes on 2 cores: short prompts
    (the prompt pass is most of a short run's time), the strongest llama.cpp n-gram modes and
    its defaults, sampled plain decoding, the oracle's ceiling, and MTP at 90/70/50% and
    Q8_0-70% with the adaptive floor timed interleaved.

    Sized from the idle 2-core AMD EPYC runs of 2026-11-27: 769 s for 218 steps, then 515 s
    for this matrix with Gemma at 96 tokens, where the adaptive suffix drafter's warm-up
    weighed on its rows (0.87x plain against 1.07x at 128 tokens): Gemma is back at 128 tokens,
    about 250 s of its 8 prompt-rounds of 9 timed methods (llama.cpp's tools ~5 s a step: each
    loads the model; specdec's ~2.5 s), 30 s of the oracle's recording, 25 s of exact checks;
    each MTP case about 60 s (2 rounds ~20 s, the interleaved floor of both heads over 3
    requests ~23 s, setup and checks ~9 s) and llama-bench's plain decoding once per trunk
    (mtp-mid-90 and the Q8_0 copy: the 70% and 50% models differ from the 90% one only in
    their head's noise). Left to ``full``: exact mode's speed rows (``EXACT``: shown, never
    tracked; the exact-mode *checks* of every drafter stay), the oracle's shorter drafts and
    its exact check at short verify batches (the drafters' checks verify those), a second
    form of one drafter (``ngram`` adaptive: ``suffix`` is the adaptive lookup drafter here),
    llama-cpp-python (the ratios issue 30 tracks are against llama.cpp's tools). Measured
    as it is (168 steps, the sampled row timed in turn with greedy): 472 s, idle EPYC."""
    gemma = Case("gemma3-270m", "gemma",
                 _pick(["code-api-head", "repeat-passage", "records-csv", "open-story"]),
                 (PLAIN, LLAMA_PLAIN,
                  _s("ngram", "ngram", 3), _s("suffix", "suffix", LOOKUP_CAP, adaptive=True),
                  _llama_ngram(3), _llama_ngram(3, "ngram-map-k"), _llama_ngram(8, "ngram-mod"),
                  LLAMA_NGRAM_DEFAULT, SAMPLED_PLAIN)
                 + QUICK_ORACLE,
                 n_gen=128)
    # the best fixed n_max in the full sweep (2026-11-22, 2 cores): 3 at 90%, 2 at 70%, 1 at 50%;
    # Q8_0 at 70% only (the full matrix has every level in both weight types)
    mtp = tuple(_mtp_case(a, n, "mid", 128, dtype=dt, interleave=3, llama_plain=lp)
                for a, n, dt, lp in ((0.9, (3,), "", True), (0.7, (2,), "", False),
                                     (0.5, (1,), "", False), (0.7, (2,), "q8_0", True)))
    # the RPC case (``--case rpc``) and the structured cases (``--case structured``) have
    # matrices of their own: eight server processes behind latency proxies, or serving at two
    # concurrencies against llama-server, they would not fit this one's 10 minutes
    return Matrix("quick", (gemma,) + mtp, reps=2, check_tokens=32,
                  bench_reps=1, oracle_check_n_max=(16,),
                  expected_minutes=QUICK_MINUTES)


def gpu(quick: bool = False) -> Matrix:
    """``specdec bench --gpu``: every layer on the device on both sides (the runner's
    placement). MTP on the ~1.4B bigram size (a GPU model's cost; the mid size is launch-bound
    there) at 90/70/50% with fixed n_max up to 8 and adaptive (cap 8), and on the mid size at
    90/70% (the adaptive floor); specdec plain against llama-bench and against llama-simple
    (which samples greedily, as specdec does). Synthetic models only: no download. ``quick``:
    the large size only, fewer draft lengths, 2 rounds."""
    if quick:
        large = tuple(_mtp_case(a, (2, 4, 6, 8), "large", 128, interleave=3, heads=("mtp",),
                                adaptive_cap=8, greedy_peer=True) for a in (0.9, 0.7, 0.5))
        return Matrix("gpu-quick", large, reps=2, check_tokens=32, bench_reps=1,
                      oracle_check_n_max=())
    large = tuple(_mtp_case(a, (1, 2, 3, 4, 6, 8), "large", 256, interleave=4, adaptive_cap=8,
                            greedy_peer=True) for a in (0.9, 0.7, 0.5))
    mid = tuple(_mtp_case(a, (1, 2, 3, 4), "mid", 256, interleave=4, greedy_peer=True)
                for a in (0.9, 0.7))
    return Matrix("gpu", large + mid, reps=3, check_tokens=32, bench_reps=2,
                  oracle_check_n_max=())


def full() -> Matrix:
    """The whole matrix: every prompt, every drafter swept over n_max and adaptive, the
    layer-skip draft model, MTP at three acceptance levels, and the MoE variant."""
    s: List[Method] = [PLAIN, LLAMA_PLAIN]
    for fam, drafter, sweep in (("ngram", "ngram", (3, 4, 6)), ("suffix", "suffix", (3, 4, 6)),
                                ("ngram-map", "ngram-map", (4, 8)),
                                ("ngram-cache", "ngram-cache", (3, 4))):
        # lookup drafters draft long runs when the text repeats: the policy may go to 64
        s += [_s(fam, drafter, n) for n in sweep] + [_s(fam, drafter, LOOKUP_CAP, adaptive=True)]
    s += [_llama_ngram(n) for n in (3, 4, 6)] + [LLAMA_NGRAM_DEFAULT]
    s += [_llama_ngram(n, "ngram-map-k") for n in (3, 4, 6)]
    s += [_llama_ngram(n, "ngram-mod") for n in (4, 8, 16)]
    s += [Method(LLAMA_CPP, "ngram-cache", "ngram-cache", n) for n in (3, 4)]
    s += [LCP_PLAIN] + [Method(LCP, "ngram", "pld", n) for n in (2, 3, 10)]
    s += (SAMPLED_PLAIN,) + EXACT + ORACLE_TIMED
    gemma = Case("gemma3-270m", "gemma", tuple(all_prompts()), tuple(s), n_gen=256)
    # layer-skip draft: the first 14 of gemma's 18 layers. 6 or 10 layers are never accepted
    # (0% on every side); 14 is (~80%), though on a model this small it costs nearly a full pass
    ls = (PLAIN, LLAMA_PLAIN, _s("draft", "layerskip:14", 2), _s("draft", "layerskip:14", 4),
          _s("draft", "layerskip:14", 8, adaptive=True),
          Method(LLAMA_CPP, "draft", "draft-simple", 2), Method(LLAMA_CPP, "draft", "draft-simple", 4),
          LCP_PLAIN, Method(LCP, "draft", "draft", 2))
    layerskip = Case("gemma3-270m+layerskip14", "layerskip:14",
                     _pick(["code-api", "repeat-passage", "records-csv", "open-story"]), ls, n_gen=256)
    mtp = tuple(_mtp_case(a, (1, 2, 3, 4), "mid", 256, dtype=dt, interleave=6)
                for dt in ("", "q8_0") for a in (0.9, 0.7, 0.5))
    moe = _mtp_case(0.9, (1, 2, 3), "mid", 256, arch="qwen35moe", interleave=6)
    eagle3 = tuple(_eagle3_case(a, (1, 2, 3, 4, 6, 8), "mid", 256, interleave=6)
                   for a in (0.9, 0.7, 0.5))
    dflash = tuple(_dflash_case(a, (2, 4, 7, 15), "mid", 256, interleave=6)
                   for a in (0.9, 0.7, 0.5))
    rpc = tuple(_rpc_case(d, _pick(["code-api", "repeat-passage", "records-csv", "records-jsonl"]),
                          256) for d in RPC_DELAYS_MS)
    return Matrix("full", (gemma, layerskip) + mtp + (moe,) + eagle3 + dflash + rpc
                  + structured_cases(full=True), reps=3,
                  check_tokens=128)


def tiny(n_gen: int = 128, reps: int = 3, peers: bool = True, interleave: int = 0,
         exact: bool = False, oracle: bool = False, sampled: bool = False) -> Matrix:
    """The tiny bigram model, plain and MTP (and MTP in exact mode, timed oracle rows, sampled
    plain decoding): for tests of the runner, report and gate."""
    methods = [PLAIN, _s("mtp", "mtp", 2)] + ([_s("mtp", "mtp", 2, exact=True)] if exact else [])
    if sampled:
        methods.append(SAMPLED_PLAIN)
    if oracle:
        methods += [m for m in ORACLE_TIMED if m.n_max <= 4]
    if interleave:
        methods.append(_s("mtp", "mtp", 2, adaptive=True))
    if peers:
        methods += [LLAMA_PLAIN, Method(LLAMA_CPP, "mtp", "draft-mtp", 2)]
    case = Case("mtp-tiny-90", "bigram", (Prompt("bigram", "open", MTP_PROMPT),), tuple(methods),
                n_gen, "tiny", 0.9, interleave=interleave)
    return Matrix("tiny", (case,), reps=reps, check_tokens=16, bench_reps=1)


def override(m: Matrix, *, reps: Optional[int] = None, n_gen: Optional[int] = None) -> Matrix:
    """``m`` with another number of rounds and/or tokens per generation."""
    cases = m.cases if not n_gen else tuple(replace(c, n_gen=n_gen) for c in m.cases)
    return replace(m, cases=cases, reps=reps or m.reps)


def rpc() -> Matrix:
    """``specdec bench --case rpc``: speculation across machines (``_rpc_case``) at the largest
    delay alone, on two grounded prompts (``--full`` sweeps the delays and more prompts)."""
    return Matrix("rpc", (_rpc_case(RPC_DELAYS_MS[-1], _pick(["code-api-head", "repeat-passage"]),
                                    128),), reps=2, check_tokens=48, bench_reps=1)


def structured() -> Matrix:
    """``specdec bench --case structured``: the structured cases alone (``structured_cases``)."""
    return Matrix("structured", structured_cases(), reps=2, check_tokens=48, bench_reps=1)


MATRICES = {"ci": ci, "quick": quick, "full": full, "structured": structured, "rpc": rpc,
            "gpu": gpu,
            "gpu-quick": lambda: gpu(quick=True)}


def get(name: str) -> Matrix:
    try:
        return MATRICES[name]()
    except KeyError:
        raise ValueError(f"unknown matrix {name!r}; choose from {sorted(MATRICES)}") from None


class UnknownCase(ValueError):
    """A ``--case`` that names no case of the matrix; the message lists the valid ones."""


def with_prompts(m: Matrix, prompts: Tuple[Prompt, ...]) -> Matrix:
    """``m``'s gemma3-270m cases on ``prompts`` instead of the bench's own (``--prompt-file``:
    a user's workload, or prompts the suite never saw); the matrix's other cases are left out."""
    cases = tuple(replace(c, prompts=prompts) for c in m.cases
                  if c.model == "gemma" and c.rpc_delay_ms is None)
    if not cases:
        raise UnknownCase(f"the {m.name!r} matrix has no gemma3-270m case to run prompt files in")
    return replace(m, cases=cases)


def select(m: Matrix, case_names: Optional[List[str]]) -> Matrix:
    """The cases of ``m`` whose name starts with one of ``case_names`` (all if none). A name
    that matches nothing is an error that lists the matrix's cases, as is an empty result."""
    if not case_names:
        return m
    valid = ", ".join(c.name for c in m.cases)
    for n in case_names:
        if not any(c.name.startswith(n) for c in m.cases):
            raise UnknownCase(f"no case of the {m.name!r} matrix starts with {n!r}; "
                              f"its cases: {valid}")
    cases = tuple(c for c in m.cases if any(c.name.startswith(n) for n in case_names))
    return replace(m, cases=cases)


__all__ = ["Case", "Matrix", "Method", "UnknownCase", "get", "ci", "quick", "full", "structured",
           "rpc",
           "gpu", "tiny",
           "select", "override", "with_prompts", "QUICK_MINUTES", "QUICK_STEPS",
           "SPECDEC", "LLAMA_CPP", "LCP", "ORACLE_TIMED", "SAMPLED_PLAIN", "RPC_DELAYS_MS",
           "LLAMA_SERVER", "JSON_SCHEMA", "structured_cases"]
