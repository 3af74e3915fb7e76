"""The peers specdec is measured against, each in a subprocess of its own.

- llama.cpp's tools from the pinned tree (``llama_tools``): ``llama-bench`` for plain
  decoding, ``llama-speculative-simple`` for its n-gram, draft-model and MTP modes;
- llama-cpp-python 0.3.36 built from its sdist into a private venv (``lcp_build``),
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
                reps: int = 2) -> float:
    """Plain decode tok/s by ``llama-bench`` (mean over ``reps`` after its own warm-up)."""
    return float(llama_tools.run_bench(model, n_gen=n_gen, threads=threads, reps=reps)["tok_s_mean"])


def llama_spec(model: str | os.PathLike[str], prompt: str, echo: str, n_gen: int, *,
               spec_type: str, n_max: int, extra: Sequence[str] = (), draft: str | None = None,
               n_ctx: int = 4096, threads: int = 2, tries: int = 3) -> dict[str, Any]:
    """Greedy ``llama-speculative-simple --spec-type spec_type``.

    ``echo`` is the prompt's token pieces as the tool prints them (computed by the
    caller from the tokenizer): the generated text is what follows it, whatever the
    vocabulary prints. llama.cpp's logger thread is never joined, so on a busy
    machine the timing summary can be lost at exit; such a run is repeated. ``n_ctx``
    replaces the tool's default (the training length: 32k cells to allocate per run).
    """
    cmd = [str(llama_tools._tool("llama-speculative-simple")), "-m", str(model),
           "-n", str(n_gen - 1), "-c", str(n_ctx), "-t", str(threads), "--temp", "0",
           "--log-colors", "off", "--spec-type", spec_type, "--spec-draft-n-max", str(n_max)]
    if spec_type in llama_tools._DRAFT_LEN_FLAG:
        cmd += [llama_tools._DRAFT_LEN_FLAG[spec_type], str(n_max)]
    if draft is not None:
        cmd += ["-md", str(draft), "-td", str(threads)]
    err = ""
    for _ in range(tries):
        with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
            f.write(prompt.encode() + b"\n")     # the tool drops one trailing newline
            f.flush()
            res = subprocess.run(cmd + ["-f", f.name, *extra], capture_output=True)
        llama_tools._check(res, cmd)
        err = res.stderr.decode(errors="replace")
        out = res.stdout.decode(errors="replace")
        dec = llama_tools._RE_DECODED.search(err)
        i = out.find(echo)
        if dec is not None and i >= 0:
            text = out[i + len(echo):]
            text = text[:-4] if text.endswith("\n\n\n\n") else text
            return {"text": text, "tok_s": float(dec.group(3)), "n": int(dec.group(1)),
                    "drafted": llama_tools._stat(err, "n_drafted"),
                    "accepted": llama_tools._stat(err, "n_accept")}
    raise RuntimeError(f"llama-speculative-simple: no timing summary or prompt echo in {tries} "
                       f"runs; stderr ends:\n{err[-1500:]}")


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
