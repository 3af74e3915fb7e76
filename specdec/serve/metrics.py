"""``/metrics``: the server's counters in Prometheus text format (prometheus_client)."""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Deque, List, Tuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..results import Stats

#: seconds over which ``specdec_tokens_per_second`` averages
RATE_WINDOW_S = 10.0


class Metrics:
    """Counters the handlers feed; gauges read from the backend when scraped."""

    def __init__(self, backend: Any) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specdec_requests", "Requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("specdec_prompt_tokens", "Prompt tokens processed",
                                     registry=r)
        self.generated = Counter("specdec_generated_tokens", "Tokens generated", registry=r)
        self.drafted = Counter("specdec_drafted_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter("specdec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.drafted_at = Counter("specdec_drafted_tokens_by_position",
                                  "Draft tokens proposed, by position in the draft (1 = first)",
                                  ["position"], registry=r)
        self.accepted_at = Counter("specdec_accepted_tokens_by_position",
                                   "Draft tokens accepted, by position in the draft",
                                   ["position"], registry=r)
        self.acceptance_at = Gauge("specdec_acceptance_rate_by_position",
                                   "P(draft token accepted | proposed), by position, since start",
                                   ["position"], registry=r)
        self.ttft = Histogram("specdec_time_to_first_token_seconds",
                              "From a request's arrival to its first generated text",
                              registry=r, buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        Gauge("specdec_tokens_per_second", f"Tokens generated per second over the last "
              f"{RATE_WINDOW_S:g} s, all requests together", registry=r).set_function(self.rate)
        Gauge("specdec_queue_depth", "Requests waiting for a slot",
              registry=r).set_function(lambda: backend.queued)
        Gauge("specdec_requests_running", "Requests being generated",
              registry=r).set_function(lambda: backend.active)
        Gauge("specdec_slots", "Requests that can run at once",
              registry=r).set_function(lambda: backend.slots)
        self._lock = threading.Lock()
        self._recent: Deque[Tuple[float, int]] = collections.deque()
        self._drafted_at: List[int] = []
        self._accepted_at: List[int] = []

    def tokens(self, n: int) -> None:
        """``n`` more tokens generated just now (for the rate)."""
        if n > 0:
            with self._lock:
                self._recent.append((time.monotonic(), n))

    def rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / RATE_WINDOW_S

    def finished(self, st: Stats) -> None:
        """A request's totals, once it ends (finished or cut off)."""
        self.prompt_tokens.inc(st.n_prompt)
        self.generated.inc(st.n_generated)
        self.drafted.inc(st.drafted)
        self.accepted.inc(st.accepted)
        with self._lock:
            for i, (d, a) in enumerate(zip(st.drafted_per_position, st.accepted_per_position)):
                if i >= len(self._drafted_at):
                    self._drafted_at.append(0)
                    self._accepted_at.append(0)
                self._drafted_at[i] += d
                self._accepted_at[i] += a
                pos = str(i + 1)
                self.drafted_at.labels(pos).inc(d)
                self.accepted_at.labels(pos).inc(a)
                if self._drafted_at[i]:
                    self.acceptance_at.labels(pos).set(self._accepted_at[i] / self._drafted_at[i])

    def render(self) -> bytes:
        return generate_latest(self.registry)
