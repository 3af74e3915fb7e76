"""The fuzzer's processes: a child loads and uses each mutated file and prints one line per
case; the parent runs batches of cases in children (llama.cpp aborts the whole process on a
failed ``GGML_ASSERT``), notes a child that dies or hangs, and goes on after that case.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .editor import Sparse, header_base
from .mutators import GENERATED, mutate


#: drafter roles a base can be mutated in: ``ROLE:DRAFT@TARGET`` loads each mutated DRAFT
#: as that drafter (``eagle3:PATH``, ...) of the unmutated TARGET
ROLES = ("eagle3", "dflash", "draft")


def _role(p: str) -> Optional[Tuple[str, str, str]]:
    """(role, draft path, target path) of a ``ROLE:DRAFT@TARGET`` base, else None."""
    role, sep, rest = p.partition(":")
    if sep and role in ROLES and "@" in rest:
        draft, _, target = rest.rpartition("@")
        return role, draft, target
    return None


def _abs_base(p: str) -> str:
    r = _role(p)
    if r is not None:
        return f"{r[0]}:{os.path.abspath(r[1])}@{os.path.abspath(r[2])}"
    return "header:" + os.path.abspath(p[7:]) if p.startswith("header:") else os.path.abspath(p)


def _base(p: str):
    """A base as given on the command line: a GGUF path, ``header:PATH`` (its header only,
    the weights zeros), ``ROLE:DRAFT@TARGET`` (a drafter's file) or one of GENERATED."""
    if p in GENERATED:
        return p
    if p.startswith("header:"):
        return header_base(p[len("header:"):])
    r = _role(p)
    return open(r[1] if r is not None else p, "rb").read()


def exercise_drafter(role: str, path: str, target: str) -> str:
    """Load a drafter's file and draft with it for ``target``; returns what worked."""
    from specdec import Decoder

    dec = Decoder(target, n_ctx=128, n_batch=64, drafter=f"{role}:{path}", n_max=3)
    r = dec.generate([1, 2, 3, 1, 2, 3, 1, 2], max_tokens=8)
    dec.generate("hello", max_tokens=4)
    return f"drafted as {role}: generated {len(r.tokens)}, accepted {r.stats.accepted}"


def exercise(path: str, role: Optional[Tuple[str, str, str]] = None) -> str:
    """Load a model and use it the way a user would (as ``role``'s drafter, when given);
    returns what worked."""
    from specdec import Decoder, Model

    if role is not None:
        return exercise_drafter(role[0], path, role[2])
    m = Model(path)
    ids = m.tokenize("Hello, world! \u00e9\u4e2d\0", add_special=True, parse_special=True)
    m.detokenize([t for t in ids if 0 <= t < m.n_vocab])
    for t in range(min(m.n_vocab, 8)):
        m.token_to_piece(t)
    dec = Decoder(m, n_ctx=64, n_batch=32, drafter="ngram", n_max=3)
    prompt = [t % m.n_vocab for t in (1, 2, 3, 1, 2, 3, 1, 2)]
    r = dec.generate(prompt, max_tokens=6)
    dec.generate("hello", max_tokens=4)
    what = f"loaded {m.arch} n_vocab={m.n_vocab}, generated {len(r.tokens)}"
    if m.has_mtp_graph:
        r = Decoder(path, n_ctx=64, n_batch=32, drafter="mtp", n_max=2).generate(prompt, max_tokens=4)
        what += f", mtp {len(r.tokens)}"
    return what


def child_main(bases: Sequence[str], seed: int, start: int, count: int, workdir: str,
               precheck: bool = True, case_timeout: int = 30) -> None:
    import logging
    logging.disable(logging.CRITICAL)
    if not precheck:   # to count what llama.cpp alone would crash on
        import specdec._core
        specdec._core._check_gguf_file = lambda path: None
    datas = [_base(p) for p in bases]
    roles = [_role(p) for p in bases]
    # a mutation may grow a file (a resized tensor, a longer array), never unboundedly
    limit = max([64 << 20] + [2 * getattr(d, "size", len(d)) for d in datas if isinstance(d, bytes)])
    path = os.path.join(workdir, f"case-{os.getpid()}.gguf")
    for i in range(start, start + count):
        data, desc = mutate(datas[i % len(datas)], seed, i)
        with open(path, "wb") as f:
            data.write(f) if isinstance(data, Sparse) else f.write(data)
        print(f"CASE {i} {desc}", flush=True)
        signal.alarm(case_timeout)   # a hang ends the child with SIGALRM: the parent notes it
        if getattr(data, "size", len(data)) > limit:
            raise RuntimeError(f"case {i}: mutated file of {len(data)} bytes")
        try:
            what = exercise(path, roles[i % len(bases)])
            print(f"OK {i} {what}", flush=True)
        except Exception as e:
            msg = str(e).replace("\n", " ")[:300]
            print(f"ERR {i} {type(e).__name__}: {msg}", flush=True)
        signal.alarm(0)
    os.unlink(path) if os.path.exists(path) else None
    print("DONE", flush=True)


# the parent: batches in children, crashes noted and skipped

@dataclass
class Report:
    cases: int = 0
    loaded: int = 0
    errors: Dict[str, int] = field(default_factory=dict)
    crashes: List[Dict[str, Any]] = field(default_factory=list)
    unclear: List[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def hangs(self) -> int:
        """Crashes that were a case running past its time limit (SIGALRM)."""
        return sum(c["exit"] in (-signal.SIGALRM, "timeout") for c in self.crashes)

    def summary(self) -> str:
        return (f"{self.cases} mutated files: {self.loaded} loaded and ran, "
                f"{sum(self.errors.values())} rejected with an exception "
                f"({', '.join(f'{k} {v}' for k, v in sorted(self.errors.items()))}), "
                f"{len(self.crashes) - self.hangs} deaths, {self.hangs} hangs, "
                f"{self.seconds:.0f}s")


def run(bases: Sequence[str], cases: int, *, seed: int = 0, batch: int = 200,
        timeout: Optional[float] = None, save_dir: Optional[str] = None, precheck: bool = True,
        case_timeout: int = 30) -> Report:
    """Run ``cases`` mutated files through children; crashes are recorded, not fatal.

    A case running past ``case_timeout`` seconds is a hang (the child ends itself with
    SIGALRM); ``timeout`` bounds a whole batch (default: each case's limit, plus a minute)."""
    rep = Report()
    t0 = time.perf_counter()
    i = 0
    with tempfile.TemporaryDirectory(prefix="specdec-fuzz-") as work:
        while i < cases:
            n = min(batch, cases - i)
            cmd = [sys.executable, "-m", "specdec.testing.gguf_fuzz", "--child", "--seed", str(seed),
                   "--start", str(i), "--count", str(n), "--workdir", work,
                   *(b if b in GENERATED else _abs_base(b) for b in bases)]
            cmd += ["--case-timeout", str(case_timeout)]
            if not precheck:
                cmd.append("--no-precheck")
            try:
                # run in the work dir: ``-m`` puts the cwd first on sys.path, and a source
                # checkout there (CI runs from the repo root) would shadow the installed package
                limit = timeout if timeout is not None else n * case_timeout + 60
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=work,
                                   errors="replace", env=dict(os.environ, GGML_NO_BACKTRACE="1"))
                out, err, rc = p.stdout, p.stderr, p.returncode
            except subprocess.TimeoutExpired as e:
                out = (e.stdout or b"").decode("utf-8", "replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
                err, rc = "timeout", "timeout"
            last, desc = None, ""
            done = False
            for line in out.splitlines():
                tag, _, rest = line.partition(" ")
                if tag == "CASE":
                    num, _, desc = rest.partition(" ")
                    last = int(num)
                elif tag == "OK":
                    rep.cases += 1
                    rep.loaded += 1
                    last = None
                elif tag == "ERR":
                    rep.cases += 1
                    num, _, msg = rest.partition(" ")
                    kind = msg.split(":", 1)[0]
                    rep.errors[kind] = rep.errors.get(kind, 0) + 1
                    if len(msg.split(":", 1)) < 2 or not msg.split(":", 1)[1].strip():
                        rep.unclear.append(f"case {num}: {msg}")
                    last = None
                elif tag == "DONE":
                    done = True
            if done and rc == 0:
                i += n
                print(f"{i}/{cases}: {rep.summary()}", file=sys.stderr, flush=True)
                continue
            crash_at = last if last is not None else i
            rep.cases += 1
            lines = err.strip().splitlines()
            why = [ln for ln in lines if any(w in ln for w in ("GGML_ASSERT", "GGML_ABORT", "error",
                                                                 "terminate", "Fatal", "fault"))]
            tail = "\n".join((why or lines)[-3:])
            rep.crashes.append({"case": crash_at, "mutation": desc if last is not None else "?",
                                "exit": rc, "stderr": tail})
            if save_dir:
                os.makedirs(save_dir, exist_ok=True)
                data = _base(bases[crash_at % len(bases)])
                with open(os.path.join(save_dir, f"crash-{seed}-{crash_at}.gguf"), "wb") as f:
                    out = mutate(data, seed, crash_at)[0]
                    out.write(f) if isinstance(out, Sparse) else f.write(out)
            i = crash_at + 1
    rep.seconds = time.perf_counter() - t0
    return rep


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.testing.gguf_fuzz",
                                 description="Mutation fuzzing of model loading: mutated GGUF "
                                 "files, each loaded in a child process.")
    ap.add_argument("bases", nargs="+", help="valid GGUF files to mutate")
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--save-dir", help="write each crashing file here")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--case-timeout", type=int, default=30, help="seconds before a case is a hang")
    ap.add_argument("--no-precheck", action="store_true",
                    help="skip specdec's GGUF checks (shows what llama.cpp alone crashes on)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=tempfile.gettempdir(), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child_main(a.bases, a.seed, a.start, a.count, a.workdir, not a.no_precheck, a.case_timeout)
        return 0
    rep = run(a.bases, a.cases, seed=a.seed, batch=a.batch, save_dir=a.save_dir,
              precheck=not a.no_precheck, case_timeout=a.case_timeout)
    if a.json:
        print(json.dumps(rep.__dict__, indent=1))
    else:
        print(rep.summary())
        for c in rep.crashes:
            print(f"CRASH case {c['case']} (exit {c['exit']}): {c['mutation']}\n  {c['stderr']}")
    return 1 if rep.crashes else 0
