"""``/metrics``: the server's counters in Prometheus text format (prometheus_client).

Token and speculation totals are read from the backend's ``stats()`` when scraped (the
backend counts every request that ends, cut short or not); request counts by status, time to
first token and the recent token rate are counted by the HTTP layer.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Deque, Iterator, Tuple

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: seconds over which ``specdec_tokens_per_second`` averages
RATE_WINDOW_S = 10.0


class _Totals(Collector):
    """The backend's totals and live counts, read at scrape time."""

    def __init__(self, backend: Any, rate: Any) -> None:
        self.backend = backend
        self.rate = rate

    def collect(self) -> Iterator[Metric]:
        st = self.backend.stats()
        for key, name, doc in (
                ("requests", "specdec_requests_ended", "Requests that ended (finished or cut short)"),
                ("n_prompt", "specdec_prompt_tokens", "Prompt tokens of the requests"),
                ("n_generated", "specdec_generated_tokens", "Tokens generated"),
                ("drafted", "specdec_drafted_tokens", "Draft tokens proposed"),
                ("accepted", "specdec_accepted_tokens", "Draft tokens accepted")):
            yield CounterMetricFamily(name, doc, value=st[key])
        drafted = CounterMetricFamily("specdec_drafted_tokens_by_position", "Draft tokens "
                                      "proposed, by position in the draft (1 = first)",
                                      labels=["position"])
        accepted = CounterMetricFamily("specdec_accepted_tokens_by_position",
                                       "Draft tokens accepted, by position in the draft",
                                       labels=["position"])
        rate = GaugeMetricFamily("specdec_acceptance_rate_by_position", "P(draft token accepted "
                                 "| proposed), by position, since start", labels=["position"])
        for i, (d, a) in enumerate(zip(st["drafted_per_position"], st["accepted_per_position"])):
            pos = [str(i + 1)]
            drafted.add_metric(pos, d)
            accepted.add_metric(pos, a)
            rate.add_metric(pos, a / d if d else 0.0)
        yield from (drafted, accepted, rate)
        yield GaugeMetricFamily("specdec_tokens_per_second", f"Tokens generated per second over "
                                f"the last {RATE_WINDOW_S:g} s, all requests together",
                                value=self.rate())
        yield GaugeMetricFamily("specdec_queue_depth", "Requests waiting for a slot",
                                value=st["queued"])
        yield GaugeMetricFamily("specdec_requests_running", "Requests being generated",
                                value=st["running"])
        yield GaugeMetricFamily("specdec_slots", "Requests that can run at once",
                                value=st["slots"])


class Metrics:
    """What the handlers count, and the registry ``/metrics`` renders."""

    def __init__(self, backend: Any) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specdec_requests", "Requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.ttft = Histogram("specdec_time_to_first_token_seconds",
                              "From a request's arrival to its first generated text",
                              registry=r, buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        r.register(_Totals(backend, self.rate))
        self._lock = threading.Lock()
        self._recent: Deque[Tuple[float, int]] = collections.deque()

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

    def render(self) -> bytes:
        return generate_latest(self.registry)
