"""``specdec bench --case serve``: ``specdec serve`` against llama.cpp's ``llama-server``.

Both servers run the same model with the same threads, ``--slots`` / ``-np`` equal to the
concurrency, and take the same greedy streaming completions of the grounded prompts (code,
repeat, records: text a lookup drafter can copy) from :mod:`serve_load`'s client; at each
concurrency all servers are up at once and take turns, so they share the machine's load.
specdec runs plain and with each of its lookup drafters (the suffix drafter also with
``--adaptive``), llama-server without speculation and with each n-gram mode; the report gives
each concurrency's aggregate tokens/s, TTFT and ITL percentiles, and the ratios the issue
tracks: specdec's best drafter over llama-server's best n-gram mode, specdec plain over
llama-server plain, and, at concurrency 1, HTTP streaming over the same requests through
``Decoder.generate`` in this process.

Before the timed passes every server (and the in-process ``Decoder``) takes each prompt
once: both servers keep prompts (specdec's prompt cache, llama-server's ``--cache-ram``), so
the passes time what a server under a steady workload does, decoding against prompts it has
seen. Without it the first server to take a prompt paid its prefill and the rows after it
on the same server (the sampled rows) did not, which made the order of the rows a result.

Every pass sends the same prompts, and a drafter that remembers earlier answers (specdec's
suffix corpus, llama-server's ngram-mod) would recall the last pass's: at concurrency 1,
``specdec serve --drafter suffix`` ran 90, 119 and 133 tok/s in three passes on one server
(plain 73), and llama-server's ngram-mod 64, 66 and 81. So a drafting server is started
afresh, and warmed up as above (8 tokens of each answer), for each timed pass after its
first; the plain servers keep theirs, and the in-process ``Decoder`` forgets its drafters'
text before each pass (``timed_sample.forget_texts``).

Every OpenAI client that sends no ``temperature`` samples at 1.0, so a server's default path
is sampled decoding: the ``SAMPLED`` rows send the same requests at temperature 1.0 (seeded)
to the plain servers and to specdec's adaptive suffix drafter, and the ratios give specdec's
sampled plain over its greedy plain and over llama-server's sampled plain.
"""
from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import machine, prompts as prompt_sets
from .prompts import GROUNDED
from ..prompt_cache import DEFAULT_MIB as PROMPT_CACHE_MIB
from .serve_load import LoadResult, Sample, run_load

CONCURRENCY = (1, 4, 8)
#: ``specdec bench --gpu``: a device serves wider batches
GPU_CONCURRENCY = (1, 4, 8, 16)
#: specdec's drafters measured (its best counts), and llama-server's n-gram modes
SPECDEC_DRAFTERS = ("ngram", "ngram-map", "suffix")
#: of those, the ones also measured with ``--adaptive`` (draft length by measured cost)
SPECDEC_ADAPTIVE = ("suffix",)
LLAMA_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")
N_MAX = 8
N_CTX = 4096      # per slot
#: tokens per warm-up request (each server takes every prompt once before the timed passes)
WARMUP_TOKENS = 8
#: the servers without a drafter: they remember no earlier answer, so their passes share one
#: server (a drafting server is started afresh for each timed pass: ``run``)
PLAIN_SERVERS = ("specdec plain", "llama-server plain")
#: the drafter of the HTTP-streaming-overhead check at concurrency 1
HTTP_VS_DECODER = "ngram"
#: the request fields of the sampled rows: OpenAI's default temperature, seeded
SAMPLED_BODY = {"temperature": 1.0, "seed": 1}
#: sampled rows: their name -> the server (a greedy row's name) that takes their requests
SAMPLED = {"specdec plain t=1": "specdec plain",
           "specdec suffix adaptive t=1": "specdec suffix adaptive",
           "llama-server plain t=1": "llama-server plain"}


def grounded_prompts() -> List[str]:
    return [p.text for p in prompt_sets.all_prompts() if p.category in GROUNDED]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """A server child listening on ``port``, up once its /health answers 200; its output
    is appended to ``log``."""

    def __init__(self, argv: List[str], port: int, log: Path, *, timeout: float = 300) -> None:
        self.port = port
        self.log_path = log
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=tempfile.gettempdir())
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{Path(argv[0]).name} did not start:\n"
                                   f"{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _specdec_argv(model: str, port: int, slots: int, *, drafter: Optional[str],
                  threads: int, adaptive: bool = False, n_gpu_layers: int = 0,
                  n_max: int = N_MAX) -> List[str]:
    argv = [sys.executable, "-m", "specdec", "serve", "-m", model, "--port", str(port),
            "--slots", str(slots), "--n-ctx", str(N_CTX), "--threads", str(threads),
            "--n-max", str(n_max)]
    if n_gpu_layers:
        argv += ["--n-gpu-layers", str(n_gpu_layers)]
    return argv + (["--drafter", drafter] if drafter else []) + (["--adaptive"] if adaptive else [])


def _llama_argv(binary: Path, model: str, port: int, slots: int, *,
                spec_type: Optional[str], threads: int, n_gpu_layers: int = 0,
                n_max: int = N_MAX, extra: Sequence[str] = ()) -> List[str]:
    from .gpu import placement_flags

    argv = [str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(N_CTX * slots), "-t", str(threads), "-tb", str(threads),
            "--no-webui", "--log-disable"]
    argv += placement_flags(n_gpu_layers)
    if spec_type:
        argv += ["--spec-type", spec_type, "--spec-draft-n-max", str(n_max), *extra]
    return argv


def _decoder_pass(dec: Any, prompts: Sequence[str], n_gen: int) -> LoadResult:
    """The requests of one load pass through ``Decoder.generate``, one at a time."""
    res = LoadResult(concurrency=1, wall_s=0.0)
    t0 = time.perf_counter()
    for p in prompts:
        st = dec.generate(p, max_tokens=n_gen).stats
        res.samples.append(Sample(ttft_s=st.t_prompt_s, gaps_s=[], n_tokens=st.n_generated,
                                  latency_s=st.t_prompt_s + st.t_generate_s))
    res.wall_s = time.perf_counter() - t0
    return res


def run(out_dir: Path, *, n_gen: int = 64, reps: int = 2, threads: int = 2,
        concurrency: Sequence[int] = CONCURRENCY, log: Callable[[str], None] = print,
        n_gpu_layers: int = 0) -> Dict[str, Any]:
    """Measure everything; returns the results (also written to ``out_dir/serve.json``).

    At each concurrency every server is started, warmed up, and then the servers take
    turns, ``reps`` load passes each in rotating order, so that they share the machine's
    ups and downs; idle servers use no CPU. At concurrency 1 the same passes also run
    through ``Decoder.generate`` in this process (drafter ``HTTP_VS_DECODER``).
    ``n_gpu_layers``: layers on the device on both sides (``specdec bench --gpu``: -1, all).
    """
    from ..api import Decoder
    from ..models import default_model_path
    from .llama_tools import ensure_tools
    from .timed_sample import forget_texts

    model = str(default_model_path())
    prompts = grounded_prompts()
    binary = ensure_tools(("llama-server",))["llama-server"]
    out_dir.mkdir(parents=True, exist_ok=True)
    logf = out_dir / "servers.log"
    argvs: Dict[str, Callable[[int, int], List[str]]] = {}
    for d in (None,) + SPECDEC_DRAFTERS:
        argvs[f"specdec {d or 'plain'}"] = functools.partial(
            _specdec_argv, model, drafter=d, threads=threads, n_gpu_layers=n_gpu_layers)
    for d in SPECDEC_ADAPTIVE:
        argvs[f"specdec {d} adaptive"] = functools.partial(
            _specdec_argv, model, drafter=d, threads=threads, adaptive=True,
            n_gpu_layers=n_gpu_layers)
    for t in (None,) + LLAMA_SPEC_TYPES:
        argvs[f"llama-server {t or 'plain'}"] = functools.partial(
            _llama_argv, binary, model, spec_type=t, threads=threads, n_gpu_layers=n_gpu_layers)
    rows: Dict[str, Dict[str, Any]] = {name: {} for name in list(argvs) + list(SAMPLED)}
    direct = f"Decoder.generate {HTTP_VS_DECODER}"
    if not concurrency or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                              for c in concurrency):
        raise ValueError(f"concurrency levels must be ints >= 1, got {concurrency!r}")
    for c in concurrency:
        log(f"serve bench: concurrency {c}: starting {len(argvs)} servers")
        servers: Dict[str, ServerProcess] = {}
        dec = None
        served = set()     # the drafting servers that took a timed pass

        def start(name: str) -> None:
            """``name``'s server, started and warmed up: every prompt once, so that its prompt
            cache holds the workload before a pass is timed (see the module's docstring)."""
            port = free_port()
            servers[name] = ServerProcess(argvs[name](port, c), port, logf)
            run_load("127.0.0.1", port, prompts, concurrency=c, n_gen=WARMUP_TOKENS,
                     n_requests=len(prompts))

        try:
            for name in argvs:
                start(name)
            if c == 1:
                # the server's prompt cache too: the same requests, only not through HTTP
                dec = Decoder(model, drafter=HTTP_VS_DECODER, n_max=N_MAX, n_ctx=N_CTX,
                              n_threads=threads, prompt_cache_mib=PROMPT_CACHE_MIB,
                              n_gpu_layers=n_gpu_layers)
                for p in prompts:
                    dec.generate(p, max_tokens=WARMUP_TOKENS)
            merged: Dict[str, LoadResult] = {}
            names = list(servers) + list(SAMPLED) + ([direct] if dec is not None else [])
            for rep in range(reps):
                for name in names[rep % len(names):] + names[:rep % len(names)]:
                    log(f"serve bench: concurrency {c}, pass {rep + 1}/{reps}: {name}")
                    if name == direct:
                        forget_texts(dec)
                        res = _decoder_pass(dec, prompts, n_gen)
                    else:
                        key = SAMPLED.get(name, name)
                        if key in served:      # a drafter must not recall an earlier pass
                            servers[key].stop()
                            start(key)
                        if key not in PLAIN_SERVERS:
                            served.add(key)
                        res = run_load("127.0.0.1", servers[key].port,
                                       prompts, concurrency=c, n_gen=n_gen,
                                       n_requests=max(c, len(prompts)),
                                       extra=SAMPLED_BODY if name in SAMPLED else None)
                    merged[name] = merged[name].merge(res) if name in merged else res
        finally:
            for srv in servers.values():
                srv.stop()
            if dec is not None:
                dec.close()
        for name, res in merged.items():
            rows.setdefault(name, {})[str(c)] = res.summary()
            if res.errors:
                rows[name][str(c)]["error_samples"] = res.errors[:3]
    results: Dict[str, Any] = {"model": Path(model).name, "n_gen": n_gen, "threads": threads,
                               "machine": machine.describe(
                                   threads, _device() if n_gpu_layers else None),
                               "n_gpu_layers": n_gpu_layers,
                               "n_max": N_MAX, "reps": reps, "concurrency": list(concurrency),
                               "rows": rows}
    best_specdec = _best(rows, [f"specdec {d}" for d in SPECDEC_DRAFTERS]
                         + [f"specdec {d} adaptive" for d in SPECDEC_ADAPTIVE], concurrency)
    best_llama = _best(rows, [f"llama-server {t}" for t in LLAMA_SPEC_TYPES], concurrency)
    results["ratios"] = {c: {
        "best_spec": _ratio(rows, best_specdec[c], best_llama[c], c),
        "best_specdec": best_specdec[c], "best_llama_server": best_llama[c],
        "plain": _ratio(rows, "specdec plain", "llama-server plain", c),
        "sampled_plain_vs_greedy": _ratio(rows, "specdec plain t=1", "specdec plain", c),
        "sampled_plain_vs_llama": _ratio(rows, "specdec plain t=1", "llama-server plain t=1", c)}
        for c in map(str, concurrency)}
    if 1 in concurrency:
        results["http_vs_decoder_c1"] = {
            "drafter": HTTP_VS_DECODER, "decoder_tok_s": rows[direct]["1"]["tokens_per_s"],
            "ratio": _ratio(rows, f"specdec {HTTP_VS_DECODER}", direct, "1")}
    (out_dir / "serve.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def _device() -> Optional[str]:
    from .gpu import device_names
    return ",".join(device_names()) or None


def _best(rows: Dict[str, Any], names: Sequence[str], concurrency: Sequence[int]
          ) -> Dict[str, str]:
    return {str(c): max(names, key=lambda n: rows[n][str(c)]["tokens_per_s"])
            for c in concurrency}


def _ratio(rows: Dict[str, Any], a: str, b: str, c: str) -> Optional[float]:
    tb = rows[b][c]["tokens_per_s"]
    return rows[a][c]["tokens_per_s"] / tb if tb else None


def markdown(results: Dict[str, Any]) -> str:
    m = results.get("machine", {})
    cpu = m.get("cpu")
    lines = [f"## Serving: {results['model']}, {results['threads']} threads"
             + (f" ({cpu})" if cpu else "")
             + f", {results['n_gen']} tokens per request, n_max {results['n_max']}", ""]
    if m.get("timing_env"):
        env = ", ".join(f"{k}={v}" for k, v in m["timing_env"].items())
        lines += [f"**Thread environment: {env}.**", ""]
    lines += ["| server | conc. | tok/s | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | "
              "TPOT ms | errors |", "|---|---|---|---|---|---|---|"]

    def ms(d: Dict[str, Optional[float]]) -> str:
        return " / ".join("-" if d[k] is None else f"{d[k]:.0f}" for k in ("p50", "p90", "p99"))
    for name, by_c in results["rows"].items():
        for c, s in by_c.items():
            tpot = "-" if s["tpot_ms_mean"] is None else f"{s['tpot_ms_mean']:.1f}"
            lines.append(f"| {name} | {c} | {s['tokens_per_s']:.1f} | {ms(s['ttft_ms'])} | "
                         f"{ms(s['itl_ms'])} | {tpot} | {s['errors']} |")
    lines += ["", "| conc. | best specdec / best llama-server n-gram | specdec plain / "
              "llama-server plain | specdec plain t=1 / greedy | specdec plain t=1 / "
              "llama-server plain t=1 |", "|---|---|---|---|---|"]

    def x(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:.2f}x"
    for c, r in results["ratios"].items():
        lines.append(f"| {c} | {x(r['best_spec'])} ({r['best_specdec']} / "
                     f"{r['best_llama_server']}) | {x(r['plain'])} | "
                     f"{x(r.get('sampled_plain_vs_greedy'))} | "
                     f"{x(r.get('sampled_plain_vs_llama'))} |")
    h = results.get("http_vs_decoder_c1")
    if h is None:
        return "\n".join(lines) + "\n"
    lines += ["", f"HTTP streaming at concurrency 1 ({h['drafter']}): {h['ratio']:.2f}x the "
              f"tok/s of the same requests through Decoder.generate in-process "
              f"({h['decoder_tok_s']:.1f} tok/s)."]
    return "\n".join(lines) + "\n"
