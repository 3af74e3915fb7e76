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
from pathlib import Path
from typing import Any, Sequence

from . import lcp_build, llama_tools

WORKER = Path(__file__).resolve().parent / "lcp_worker.py"


class PeerUnavailable(RuntimeError):
    """A peer that cannot be built or run here; its rows say why."""


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
