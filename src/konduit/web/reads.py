"""Which database served the dashboard's and the API's reads, shown where people look: a
response header, a line at the foot of every page and three Prometheus metrics
(docs/read-replicas.md). The routing itself is :class:`konduit.db.replica.Reads`'s."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from konduit.db.replica import REPLICA, Reads, recording

READ_FROM = b"x-konduit-read-from"
"""``replica`` or ``primary`` (both, comma-separated, when a request's reads were split)."""
REPLICA_LAG = b"x-konduit-replica-lag"
"""The replica's last measured lag in seconds, when a replica is configured and answers."""

ReadsOf = Callable[[], Reads | None]


class ReadSourceHeaders:
    """Tell each response which database served its reads (no header when it read nothing)."""

    def __init__(self, app: ASGIApp, reads: ReadsOf):
        self.app = app
        self.reads = reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with recording() as seen:

            async def send_with_source(message: Message) -> None:
                if message["type"] == "http.response.start" and seen.sources:
                    headers = list(message.get("headers", []))
                    headers.append((READ_FROM, ", ".join(sorted(set(seen.sources))).encode()))
                    reads = self.reads()
                    if reads is not None and reads.configured and reads.state.lag is not None:
                        headers.append((REPLICA_LAG, f"{reads.state.lag:.3f}".encode()))
                    message["headers"] = headers
                await send(message)

            await self.app(scope, receive, send_with_source)


def footer_line(reads: Reads | None) -> str | None:
    """``reads: replica, 0.2 s behind`` for the foot of the pages; None without a replica."""
    if reads is None or not reads.configured:
        return None
    return reads.state.describe()


class ReadsCollector(Collector):
    """``konduit_read_replica_lag_seconds`` (NaN when the replica does not answer),
    ``konduit_read_replica_serving`` (1 while reads go to it) and
    ``konduit_read_fallbacks_total`` (times reads went to the primary instead), for the
    dashboard's ``/metrics``; nothing without a replica."""

    def __init__(self, reads: ReadsOf):
        self.reads = reads

    def collect(self) -> Iterator[Metric]:
        reads = self.reads()
        if reads is None or not reads.configured:
            return
        state = reads.state
        yield GaugeMetricFamily("konduit_read_replica_lag_seconds",
                                "How far the read replica trails the primary, last measured "
                                "(NaN: it does not answer).",
                                value=math.nan if state.lag is None else state.lag)
        yield GaugeMetricFamily("konduit_read_replica_serving",
                                "1 while the dashboard's and the API's reads go to the replica, "
                                "0 while the primary serves them.",
                                value=1.0 if state.source == REPLICA else 0.0)
        yield CounterMetricFamily("konduit_read_fallbacks",
                                  "Times the reads went to the primary because the replica "
                                  "was too far behind or did not answer.",
                                  value=reads.fallbacks)
