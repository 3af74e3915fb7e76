"""Load for OpenAI-compatible servers: concurrent streaming completions, timed per chunk.

The same client measures ``specdec serve`` and llama.cpp's ``llama-server``: ``concurrency``
workers each send one streaming ``/v1/completions`` request at a time, taking prompts in turn.
Per request: time to first token (TTFT: the first chunk with text) and the gaps between
chunks with text (inter-token latency, ITL; a speculative round's chunk holds several tokens,
so TPOT, the mean time per output token after the first, is reported beside it). Aggregate
tokens/s is every request's completion tokens (``usage``) over the wall time of the run.
Stdlib only (http.client), so the client costs the same against both servers.
"""
from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence


@dataclass
class Sample:
    ttft_s: float
    gaps_s: List[float]
    n_tokens: int
    latency_s: float


@dataclass
class LoadResult:
    concurrency: int
    wall_s: float
    samples: List[Sample] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)

    def merge(self, other: "LoadResult") -> "LoadResult":
        """Two passes as one: their samples and errors, their wall times added."""
        return LoadResult(self.concurrency, self.wall_s + other.wall_s,
                          self.samples + other.samples, self.errors + other.errors)

    @property
    def tokens_per_s(self) -> float:
        return sum(s.n_tokens for s in self.samples) / self.wall_s if self.wall_s else 0.0

    def summary(self) -> Dict[str, Any]:
        ttft = [s.ttft_s for s in self.samples]
        gaps = [g for s in self.samples for g in s.gaps_s]
        tpot = [(s.latency_s - s.ttft_s) / (s.n_tokens - 1) for s in self.samples if s.n_tokens > 1]
        return {"concurrency": self.concurrency, "requests": len(self.samples),
                "errors": len(self.errors), "tokens": sum(s.n_tokens for s in self.samples),
                "wall_s": self.wall_s, "tokens_per_s": self.tokens_per_s,
                "ttft_ms": _percentiles(ttft), "itl_ms": _percentiles(gaps),
                "tpot_ms_mean": 1e3 * statistics.fmean(tpot) if tpot else None}


def _percentiles(xs: Sequence[float]) -> Dict[str, Optional[float]]:
    if not xs:
        return {"p50": None, "p90": None, "p99": None}
    s = sorted(xs)

    def at(q: float) -> float:
        return 1e3 * s[min(len(s) - 1, int(q * len(s)))]
    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99)}


def stream_completion(host: str, port: int, body: Dict[str, Any], *,
                      timeout: float = 600.0) -> Sample:
    """One streaming completion; raises on an HTTP error or an error event."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        payload = json.dumps(dict(body, stream=True, stream_options={"include_usage": True}))
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        first: Optional[float] = None
        last = t0
        gaps: List[float] = []
        n_tokens: Optional[int] = None
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            now = time.perf_counter()
            obj = json.loads(data)
            if "error" in obj:
                raise RuntimeError(f"error event: {obj['error']}")
            if obj.get("usage"):
                n_tokens = obj["usage"]["completion_tokens"]
            choices = obj.get("choices") or []
            if choices and choices[0].get("text"):
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
        if first is None or n_tokens is None:
            raise RuntimeError("the stream ended without text or usage")
        return Sample(ttft_s=first - t0, gaps_s=gaps, n_tokens=n_tokens, latency_s=last - t0)
    finally:
        conn.close()


def run_concurrently(n: int, concurrency: int, task: Callable[[int], None]) -> float:
    """Tasks ``0 .. n-1``, ``concurrency`` at a time (each worker takes the next task in
    turn); returns the wall time of them all."""
    todo = list(range(n))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            task(i)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def run_load(host: str, port: int, prompts: Sequence[str], *, concurrency: int, n_gen: int,
             n_requests: Optional[int] = None, extra: Optional[Dict[str, Any]] = None
             ) -> LoadResult:
    """``n_requests`` (default ``2 * concurrency``, at least one per prompt) streaming
    completions of ``n_gen`` tokens, ``concurrency`` at a time, prompts in turn; greedy unless
    ``extra`` (more body fields) sets another ``temperature``."""
    lock = threading.Lock()
    res = LoadResult(concurrency=concurrency, wall_s=0.0)

    def one(i: int) -> None:
        body = dict({"temperature": 0}, prompt=prompts[i % len(prompts)], max_tokens=n_gen)
        body.update(extra or {})
        try:
            s = stream_completion(host, port, body)
            with lock:
                res.samples.append(s)
        except Exception as e:   # counted, and reported beside the numbers
            with lock:
                res.errors.append(f"{type(e).__name__}: {e}")

    res.wall_s = run_concurrently(n_requests or max(2 * concurrency, len(prompts)), concurrency,
                                  one)
    return res
