"""A worker's own Prometheus endpoint (``konduit worker --metrics-port``): the distributions.

``konduit metrics`` reads the database: counts and window quantiles any exporter can serve. A
Prometheus *histogram* is another thing: cumulative bucket counters observed where the event
happens, so that ``histogram_quantile(0.95, sum by (le, step) (rate(..._bucket[5m])))`` is the
fleet's p95 over any range. Attempts end in workers, so each worker observes its own:

- ``konduit_attempt_duration_seconds{workflow, step, ending}``: how long each attempt's handler
  ran, by how it ended (``returned``, ``raised``, ``non_retryable``, ``invalid_output``,
  ``deadline_passed``);
- ``konduit_worker_attempts_running``: the attempts this worker runs now.

Only a worker started with a metrics port observes anything: without one, nothing is measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
           300.0, 600.0, 1800.0, 3600.0)
"""Seconds: from a quick branch to an hour-long one (a task's budget rarely goes beyond)."""


class WorkerMetrics:
    """The histograms of one worker process, on a registry of their own (not the process's
    default one, which a test or an embedding application may use for something else)."""

    def __init__(self, running: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.attempt_seconds = Histogram(
            "konduit_attempt_duration_seconds",
            "How long each attempt's handler ran in this worker, by how it ended.",
            ("workflow", "step", "ending"), buckets=BUCKETS, registry=self.registry)
        self.running = Gauge("konduit_worker_attempts_running",
                             "Attempts this worker runs now.", registry=self.registry)
        if running is not None:
            self.running.set_function(lambda: float(running()))
        self._server: Any = None

    def attempt(self, workflow: str, step: str, ending: str, seconds: float) -> None:
        self.attempt_seconds.labels(workflow, step, ending).observe(max(seconds, 0.0))

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns the bound port (a
        ``port`` of 0 takes a free one)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
