"""The peers specdec is measured against, each in a subprocess of its own.

- llama.cpp's tools from the pinned tree (``llama_tools``): ``llama-bench`` for plain
  decoding, ``llama-speculative-simple`` for its n-gram, draft-model and MTP modes
  (``llama_tools.run_spec_simple``);
- llama-cpp-python built from its pinned sdist into a private venv (``lcp_build``),
  driven through ``lcp_worker.py``: plain, ``LlamaPromptLookupDecoding`` and a
  ``LlamaDraftModel`` adapter around a second GGUF.

Nothing here loads another libllama into this process.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from . import lcp_build, llama_tools
from .matrix import LCP, LLAMA_CPP, LLAMA_SERVER, Case

WORKER = Path(__file__).resolve().parent / "lcp_worker.py"


class PeerUnavailable(RuntimeError):
    """A peer that cannot be built or run here; its rows say why."""


def build_for(cases: Sequence[Case], log: Callable[[str], None]) -> Optional[str]:
    """Build the peers ``cases`` run, up front as named steps: llama.cpp's tools and
    llama-cpp-python (built on first use otherwise, inside the first case's timing: a quick
    run measured on 2026-11-26 spent 262 s of its "oracle recording" building it). A failure
    leaves their rows to say why; returns llama-cpp-python's build error, if any."""
    want = set()
    for c in cases:
        for m in c.methods:
            if m.side == LLAMA_CPP:
                want.add({"plain": "llama-bench", "greedy": "llama-simple"}.get(
                    m.family, "llama-speculative-simple"))
            elif m.side == LLAMA_SERVER:
                want.add("llama-server")
    if want and not llama_tools.built(sorted(want)):
        path = llama_tools.tools_dir() / "build.log"
        log(f"building llama.cpp's {', '.join(sorted(want))} (once, into "
            f"{llama_tools.tools_dir()}; a CPU build takes about 8 minutes on 2 cores, a GPU "
            f"backend's kernels far longer; output in {path})")
        t0 = time.monotonic()
        try:
            llama_tools.ensure_tools(sorted(want), log=path)
            log(f"built llama.cpp's tools in {time.monotonic() - t0:.0f} s")
        except Exception as e:  # noqa: BLE001 - the tools' rows say why
            log(f"building llama.cpp's tools failed: {e}")
    if any(m.side == LCP for c in cases for m in c.methods) and not lcp_build.built():
        log(f"building llama-cpp-python {lcp_build.VERSION} (once, into {lcp_build.peer_dir()}; "
            f"about 5 minutes on 2 cores; output in {lcp_build.peer_dir() / 'build.log'})")
        t0 = time.monotonic()
        try:
            lcp_build.ensure()
            log(f"built llama-cpp-python in {time.monotonic() - t0:.0f} s")
        except Exception as e:  # noqa: BLE001 - its rows say why
            error = f"llama-cpp-python {lcp_build.VERSION} build failed: {e}"
            log(error)
            return error
    return None


def llama_bench(model: str | os.PathLike[str], n_gen: int, *, threads: int = 2,
                reps: int = 2, extra: Sequence[str] = ()) -> float:
    """Plain decode tok/s by ``llama-bench`` (mean over ``reps`` after its own warm-up)."""
    return float(llama_tools.run_bench(model, n_gen=n_gen, threads=threads, reps=reps,
                                       extra=extra)["tok_s_mean"])


class LcpWorker:
    """One long-lived llama-cpp-python process; models stay loaded across runs, as
    specdec's decoders do."""

    def __init__(self, build: bool = True) -> None:
        if not lcp_build.built():
            if not build:
                raise PeerUnavailable(f"llama-cpp-python {lcp_build.VERSION} is not built "
                                      f"(run `specdec bench --build-peers`)")
            try:
                lcp_build.ensure()
            except Exception as e:  # noqa: BLE001
                raise PeerUnavailable(f"llama-cpp-python {lcp_build.VERSION} build failed: {e}")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["OMP_THREAD_LIMIT"] = env.get("OMP_THREAD_LIMIT", "2")
        # cwd: not the repo root, so a source tree named like a package cannot shadow one
        self.proc = subprocess.Popen([str(lcp_build.python()), str(WORKER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env=env, cwd=tempfile.gettempdir())
        self.version = self._call({"op": "version"})["version"]

    def _call(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise PeerUnavailable(f"llama-cpp-python worker died (rc={self.proc.poll()})")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"llama-cpp-python: {reply.get('error')}")
        return reply

    def load(self, key: str, model: str, kind: str, **kw: Any) -> None:
        self._call({"op": "load", "key": key, "model": str(model), "kind": kind, **kw})

    def run(self, key: str, prompt: str, n_gen: int) -> dict[str, Any]:
        return self._call({"op": "run", "key": key, "prompt": prompt, "n_gen": n_gen})

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "LcpWorker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
