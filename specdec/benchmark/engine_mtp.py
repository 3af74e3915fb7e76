"""``specdec bench --case engine-mtp``: MTP drafting under concurrency, an ``Engine`` with
several slots against the same Engine's plain decoding and llama-server's ``draft-mtp``.

One request at a time speculation is easy; once requests share the model, every draft
step's decode and every verify row competes with the other requests' tokens. For each MTP
head accuracy of the mid bigram model (``synthetic.model_for``) and each slot count, the
methods run in passes of ``slots`` requests submitted at once (``n_gen`` greedy tokens
each): the Engine plain, with the head at a fixed ``n_max``, and under the adaptive policy,
and llama-server with ``--spec-type draft-mtp`` and ``-np`` = slots (its own MTP head, the
same file). A pass's aggregate tokens/s is its generated tokens over its wall time. The
methods take turns pass by pass, in rotating order, ``reps`` times each, so that a shared
machine's load falls on all of them alike; each keeps its median pass. Its ratio to plain
is given as the ratio of the medians and paired, pass by pass (:func:`paired_ratio`).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from .matrix import MTP_PROMPT

ACCURACIES = (0.9, 0.7, 0.5)
SLOTS = (4, 8)
#: ``--gpu``: the slot counts of a GPU server (issue 29), on the ~1.4B size (the mid one is
#: launch-bound on a GPU); ``--gpu --quick`` at 90% only
GPU_SLOTS = (1, 4, 8, 16)
GPU_SIZE = "large"
GPU_N_GEN = 128
HEAD = "mtp:q4_0"
N_MAX = 4
N_CTX = 512        # per slot: the prompt and the generation
PLAIN = "engine plain"
FIXED = f"engine {HEAD} n{N_MAX}"
ADAPTIVE = f"engine {HEAD} adaptive"
LLAMA = f"llama-server draft-mtp n{N_MAX}"


def prompts(n: int) -> List[str]:
    """``n`` requests' prompts: the bigram ignores their meaning; each starts differently."""
    return [f"Request {i}: {MTP_PROMPT}" for i in range(n)]


def _engine_pass(eng: Any, texts: Sequence[str], n_gen: int) -> Dict[str, Any]:
    t0 = time.perf_counter()
    res = [h.result(600) for h in [eng.submit(p, max_tokens=n_gen) for p in texts]]
    wall = time.perf_counter() - t0
    n = sum(len(r.tokens) for r in res)
    return {"tok_s": n / wall, "tokens": n, "drafted": sum(r.stats.drafted for r in res),
            "accepted": sum(r.stats.accepted for r in res)}


def _server_pass(port: int, texts: Sequence[str], n_gen: int) -> Dict[str, Any]:
    from .serve_load import run_load
    # the Engines run without prefix reuse or a prompt cache: every pass prefills its prompts
    # again, and so must the server (llama-server keeps a slot's prompt by default)
    r = run_load("127.0.0.1", port, texts, concurrency=len(texts), n_gen=n_gen,
                 n_requests=len(texts), extra={"cache_prompt": False})
    if r.errors:
        raise RuntimeError(r.errors[0])
    return {"tok_s": r.tokens_per_s, "tokens": sum(s.n_tokens for s in r.samples),
            "drafted": 0, "accepted": 0}


def llama_server_argv(binary: Path, model: str, port: int, slots: int, threads: int,
                      n_gpu_layers: int = 0) -> List[str]:
    """llama-server with its own MTP head (``draft-mtp``), ``-np`` = slots, the layers placed
    as on specdec's side."""
    from .gpu import placement_flags
    return [str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(N_CTX * slots), "-t", str(threads), "-tb",
            str(threads), "--no-webui", "--log-disable", "--spec-type", "draft-mtp",
            "--spec-draft-n-max", str(N_MAX), *placement_flags(n_gpu_layers)]


def _llama_server(model: str, slots: int, threads: int, log_path: Path,
                  n_gpu_layers: int = 0) -> Any:
    from .llama_tools import ensure_tools
    from .serve import ServerProcess, free_port
    binary = ensure_tools(("llama-server",))["llama-server"]
    port = free_port()
    return ServerProcess(llama_server_argv(binary, model, port, slots, threads, n_gpu_layers),
                         port, log_path)


def run(out_dir: Path, *, n_gen: int = 48, reps: int = 3, threads: int = 2,
        accuracies: Sequence[float] = ACCURACIES, slots: Sequence[int] = SLOTS,
        peers: bool = True, size: str = "mid", n_gpu_layers: int = 0,
        log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Measure every (accuracy, slots); returns the results (also ``out_dir/engine-mtp.json``,
    rewritten after each slot count, so a run stopped midway leaves what it measured).
    ``size``: the bigram model's ("tiny" for a quick check of the harness); ``n_gpu_layers``:
    the layers on the device on both sides (``--gpu``; llama-server's ``-ngl``)."""
    from .. import Engine
    from .synthetic import model_for

    out_dir.mkdir(parents=True, exist_ok=True)
    rows: List[Dict[str, Any]] = []
    for acc in accuracies:
        model = str(model_for(size, acc, log=log))
        for n in slots:
            texts = prompts(n)
            kw = dict(n_slots=n, n_ctx=N_CTX, n_threads=threads, n_max=N_MAX,
                      prefix_reuse=False, prompt_cache_mib=0, n_gpu_layers=n_gpu_layers)
            engines = {PLAIN: Engine(model, **kw),
                       FIXED: Engine(model, drafters=[HEAD], **kw),
                       ADAPTIVE: Engine(model, drafters=[HEAD], adaptive=True, **kw)}
            server = None
            notes: Dict[str, str] = {}
            if peers:
                try:
                    server = _llama_server(model, n, threads, out_dir / "servers.log",
                                           n_gpu_layers)
                except Exception as e:  # noqa: BLE001 - the row says why
                    notes[LLAMA] = f"{type(e).__name__}: {str(e)[:200]}"
            else:
                notes[LLAMA] = "peers disabled (--no-peers)"
            runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in list(engines) + [LLAMA]}
            try:
                names = list(engines) + ([LLAMA] if server is not None else [])
                # warm-up: the first batch shapes, and the adaptive policy's first learning
                for name in names:
                    if name == LLAMA:
                        _server_pass(server.port, texts, 8)
                    else:
                        _engine_pass(engines[name], texts, n_gen if name == ADAPTIVE else 8)
                for rep in range(reps):
                    for name in names[rep % len(names):] + names[:rep % len(names)]:
                        got = (_server_pass(server.port, texts, n_gen) if name == LLAMA
                               else _engine_pass(engines[name], texts, n_gen))
                        runs[name].append(got)
                        log(f"engine-mtp {acc:.0%} x{n} pass {rep + 1}/{reps}: {name}: "
                            f"{got['tok_s']:.1f} tok/s")
            finally:
                for eng in engines.values():
                    eng.close()
                if server is not None:
                    server.stop()
            plain = statistics.median(r["tok_s"] for r in runs[PLAIN])
            for name, got in runs.items():
                row: Dict[str, Any] = {"accuracy": acc, "slots": n, "method": name,
                                       "note": notes.get(name, "")}
                if got:
                    tok_s = statistics.median(r["tok_s"] for r in got)
                    drafted = sum(r["drafted"] for r in got)
                    row.update(tok_s=tok_s, tok_s_runs=[r["tok_s"] for r in got],
                               vs_plain=tok_s / plain,
                               vs_plain_paired=paired_ratio(got, runs[PLAIN]),
                               acceptance=(sum(r["accepted"] for r in got) / drafted
                                           if drafted else None))
                rows.append(row)
            _write(out_dir, rows, size=size, n_gen=n_gen, reps=reps, threads=threads,
                   n_gpu_layers=n_gpu_layers)
    return _write(out_dir, rows, size=size, n_gen=n_gen, reps=reps, threads=threads,
                  n_gpu_layers=n_gpu_layers)


def paired_ratio(runs: Sequence[Dict[str, Any]], plain: Sequence[Dict[str, Any]]
                 ) -> Optional[float]:
    """The median over passes of a method's tok/s over the plain pass of the same round of
    turns. A machine's speed drifts between rounds (plain passes of one idle run spread over
    25%); paired, each ratio compares passes a few seconds apart, which the ratio of two
    medians does not."""
    pairs = [r["tok_s"] / p["tok_s"] for r, p in zip(runs, plain) if p["tok_s"]]
    return statistics.median(pairs) if pairs else None


def _write(out_dir: Path, rows: List[Dict[str, Any]], **meta: Any) -> Dict[str, Any]:
    """The results so far, with each drafting row's ratio to llama-server's; written to
    ``out_dir/engine-mtp.json``."""
    import json

    from .machine import describe
    results = {"case": "engine-mtp", **meta, "head": HEAD, "n_max": N_MAX,
               "machine": describe(meta["threads"]), "rows": rows}
    if meta.get("n_gpu_layers"):
        from .gpu import device_names
        results["devices"] = device_names()
    for r in rows:
        if r["method"] in (FIXED, ADAPTIVE):
            peer = next((x for x in rows if x["accuracy"] == r["accuracy"]
                         and x["slots"] == r["slots"] and x["method"] == LLAMA), None)
            r["vs_llama_server"] = (r["tok_s"] / peer["tok_s"]
                                    if peer and peer.get("tok_s") and r.get("tok_s") else None)
    (out_dir / "engine-mtp.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def markdown(results: Dict[str, Any]) -> str:
    cpu = results.get("machine", {}).get("cpu")
    where = (f"every layer on {', '.join(results['devices']) or 'the device'}"
             if results.get("n_gpu_layers") else f"{results['threads']} threads"
             + (f" ({cpu})" if cpu else ""))
    lines = [f"## Engine MTP under concurrency: {results['size']} bigram model, {results['head']}, "
             + where
             + f", {results['n_gen']} tokens per request, {results['reps']} passes each", "",
             "| head accuracy | slots | method | tok/s | x plain | x plain, paired | x llama-server"
             " | acceptance | note |", "|---|---|---|---|---|---|---|---|---|"]

    def f(x: Optional[float], fmt: str) -> str:
        return "-" if x is None else format(x, fmt)
    for r in results["rows"]:
        lines.append(f"| {r['accuracy']:.0%} | {r['slots']} | {r['method']} | "
                     f"{f(r.get('tok_s'), '.1f')} | {f(r.get('vs_plain'), '.2f')} | "
                     f"{f(r.get('vs_plain_paired'), '.2f')} | "
                     f"{f(r.get('vs_llama_server'), '.2f')} | "
                     f"{f(r.get('acceptance'), '.2f')} | {r['note']} |")
    return "\n".join(lines) + "\n"
