"""Prometheus metrics (``konduit metrics``): the numbers of ``konduit stats`` on ``/metrics``.

Each scrape reads the history through :func:`konduit.observe.stats.load_stats` (same queries, same alert
rule, same ``--history`` window) plus one count of executions by status and the stored alerts
(``konduit_alerts_open`` per kind, one ``konduit_alert_open_since_seconds`` per open alert; see
docs/alerts.md) and the steps with flow limits (``konduit_step_throttled_seconds_total`` and the
like, since the limit was first registered: they never go down; see docs/flow-control.md), the
webhook deliveries by status (``konduit_webhook_deliveries``; see docs/webhooks.md), the stalls
the watchdog found (``konduit_stalls_total``, a counter kept in the database), on
one connection pool kept for the process. A scrape never hangs and never
fails: it is bounded by ``timeout``, and when the database cannot be read it answers with
``konduit_scrape_error 1`` (and no stale data).

Counters are the numbers that only ever grow, and only they end in ``_total``:
``konduit_stalls_total`` and the flow limits' ``konduit_step_throttled_seconds_total`` and
``konduit_step_throttled_claims_total`` (kept in the database, so any exporter reads the same
count). Every other metric is a **gauge**: the step counts (``konduit_step_attempts``,
``konduit_step_retries``, ...) count tries and outcomes over the sliding ``--history`` window,
so they go down as old executions leave it, which a counter must never do (``rate()`` would
read that as a reset); read them as they are, or ``delta()`` them. Step durations and fan-in
waits are quantiles of that window (a ``quantile`` label); a Prometheus histogram's buckets are
counters, which a window that forgets cannot give: the histograms are each worker's own
(``konduit worker --metrics-port``, :mod:`konduit.worker.metrics`), observed as attempts end.
Durations are in seconds; a value that does
not exist yet (no successful attempt, a join that never fired) is left out rather than reported
as 0. The metrics to scale workers on are per queue (:mod:`konduit.observe.queue_metrics`).

Renamed (CHANGELOG): the window gauges ``konduit_step_attempts_total``,
``konduit_step_retries_total`` and ``konduit_step_lost_attempts_total`` are
``konduit_step_attempts``, ``konduit_step_retries`` and ``konduit_step_lost_attempts``;
``konduit_step_hedges_total`` and ``konduit_step_hedges_won_total``, which docs/hedging.md named,
are still exported beside their new names ``konduit_step_hedges`` and ``konduit_step_hedges_won``
for one release.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from konduit.core.alerts import KINDS
from konduit.core.durations import Duration
from konduit.core.shares import DEGRADED_WINDOW, degraded_share
from konduit.db.connect import open_database
from konduit.db.database import Database, Row, resolve_url
from konduit.errors import MetricsError as MetricsError
from konduit.errors import StatsError, blamed
from konduit.loop_thread import LoopThread
from konduit.observe.queue_metrics import QueueSeries
from konduit.observe.stats import (
    DEFAULT_CONSECUTIVE,
    DEFAULT_FAN_IN_ALERT,
    DEFAULT_HISTORY,
    OUTCOMES,
    Stats,
    load_stats,
    seconds_option,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464
SCRAPE_TIMEOUT = 5.0
"""Seconds a scrape may spend reading the database (Prometheus gives up after 10 by default)."""
MAX_ALERT_SAMPLES = 1000
"""Open alerts one scrape reports one by one (newest first); the per-kind counts count them all."""
EXECUTION_STATUSES = ("pending", "scheduled", "running", "succeeded", "failed", "timed_out", "cancelled")
DELIVERY_STATUSES = ("pending", "delivered", "failed", "refused")

log = logging.getLogger(__name__)


def _gauge(name: str, doc: str, labels: Sequence[str],
           samples: Iterable[tuple[Sequence[str], float | None]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in samples:
        if value is not None:
            family.add_metric(values, value)
    return family


def _counter(name: str, doc: str, labels: Sequence[str],
             samples: Iterable[tuple[Sequence[str], float | None]]) -> CounterMetricFamily:
    """A counter: ``name`` ends in ``_total``, and its value only ever grows."""
    assert name.endswith("_total"), name
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, value in samples:
        if value is not None:
            family.add_metric(values, value)
    return family


def metric_families(stats: Stats, executions: Sequence[Row],
                    workers: Sequence[Row] = (), alerts: Sequence[Row] = (),
                    alert_counts: Sequence[Row] | None = None) -> list[Metric]:
    """The families of one scrape, from the stats, the rows of ``execution_count_by_status``,
    of ``worker_list_live``, of the open alerts (``alert_list_recent``) and of
    ``alert_count_open_by_kind`` (no I/O). Every known status of a workflow, and every alert
    kind, is reported, 0 when it has none."""
    b, j = stats.branches, stats.joins
    step, join = ("workflow", "step"), ("workflow", "join")
    alerting = {(a.workflow, a.join) for a in stats.alerts}
    counts: dict[str, dict[str, int]] = {}
    for r in executions:
        counts.setdefault(r["workflow_name"], dict.fromkeys(EXECUTION_STATUSES, 0))[r["status"]] = \
            int(r["executions"])
    return [
        _gauge("konduit_step_duration_seconds", "Duration of a step's successful attempts.",
               (*step, "quantile"), (((s.workflow, s.step, q), v) for s in b
                                     for q, v in (("0.5", s.p50), ("0.95", s.p95), ("0.99", s.p99)))),
        _gauge("konduit_step_attempts", "Tries of a step over the history window.",
               step, (((s.workflow, s.step), s.attempts) for s in b)),
        _gauge("konduit_step_retries", "Tries of a step that failed and were retried, over the "
               "history window.", step, (((s.workflow, s.step), s.retries) for s in b)),
        _gauge("konduit_step_lost_attempts", "Tries of a step whose worker vanished, over the "
               "history window.", step, (((s.workflow, s.step), s.lost) for s in b)),
        _gauge("konduit_step_hedges", "Hedge attempts of a step started beside a straggler "
               "(hedge=), over the history window.",
               step, (((s.workflow, s.step), s.hedges) for s in b)),
        _gauge("konduit_step_hedges_won", "Hedge attempts of a step that finished first and "
               "ended their task, over the history window.",
               step, (((s.workflow, s.step), s.hedges_won) for s in b)),
        # The names docs/hedging.md gave them, kept one release (a gauge, despite _total).
        _gauge("konduit_step_hedges_total", "Deprecated: konduit_step_hedges.",
               step, (((s.workflow, s.step), s.hedges) for s in b)),
        _gauge("konduit_step_hedges_won_total", "Deprecated: konduit_step_hedges_won.",
               step, (((s.workflow, s.step), s.hedges_won) for s in b)),
        _gauge("konduit_step_outcomes", "Executions of a step by how the step ended.",
               (*step, "outcome"), (((s.workflow, s.step, o), s.outcomes.get(o, 0)) for s in b
                                    for o in OUTCOMES)),
        _gauge("konduit_step_seconds_since_success", "Seconds since a step last succeeded.",
               step, (((s.workflow, s.step), s.since_last_success) for s in b)),
        _gauge("konduit_join_fan_in_wait_seconds", "Fan-in wait: first branch ended -> join fired.",
               (*join, "quantile"), (((x.workflow, x.join, q), v) for x in j
                                     for q, v in (("0.5", x.wait_p50), ("0.95", x.wait_p95)))),
        _gauge("konduit_join_fan_in_wait_seconds_max", "Longest fan-in wait of a join.",
               join, (((x.workflow, x.join), x.wait_max) for x in j)),
        _gauge("konduit_join_dispatch_latency_seconds", "Last branch ended -> join fired.",
               (*join, "quantile"), (((x.workflow, x.join, q), v) for x in j
                                     for q, v in (("0.5", x.dispatch_p50), ("0.95", x.dispatch_p95)))),
        _gauge("konduit_join_straggler_count", "Executions in which a branch ended last at a join.",
               (*join, "branch"), (((x.workflow, x.join, s), n) for x in j
                                   for s, n in x.stragglers.items())),
        _gauge("konduit_join_fan_in_alert",
               f"1 when the fan-in wait exceeded {stats.threshold:g}s in each of the join's last "
               f"{stats.consecutive} execution(s), else 0.",
               join, ((key, float(key in alerting))
                      for key in sorted({(x.workflow, x.join) for x in j} | alerting))),
        _gauge("konduit_executions", "Executions created within the history window, by status.",
               ("workflow", "status"), (((w, s), n) for w, by in sorted(counts.items())
                                        for s, n in by.items())),
        _gauge("konduit_workers_live", "Workers heard from within their lease.", (),
               [((), len(workers))]),
        _gauge("konduit_worker_running_tasks", "Tasks a live worker is running.",
               ("worker", "host"), (((w["id"], w["hostname"]), w["running"]) for w in workers)),
        _gauge("konduit_worker_leader",
               "1 for the live worker that runs its deployment's maintenance (the passes needed "
               "once per cluster: rescue, deadline sweep, schedules, alerts...), else 0.",
               ("worker", "host"), (((w["id"], w["hostname"]), int(bool(w.get("leader"))))
                                    for w in workers)),
        _gauge("konduit_worker_abandoned_threads",
               "Handler threads a live worker gave up on (deadline passed) that still run: a "
               "sync handler ignoring its deadline. Past the worker's limit it restarts.",
               ("worker", "host"), (((w["id"], w["hostname"]), w["abandoned"]) for w in workers)),
        *alert_families(alerts, alert_counts),
        *flow_families(stats),
    ]


def alert_families(alerts: Sequence[Row], counts: Sequence[Row] | None = None) -> list[Metric]:
    """``konduit_alerts_open`` per kind (every kind, 0 when none; from ``counts``, else counted
    in ``alerts``) and one ``konduit_alert_open_since_seconds`` sample per open alert."""
    open_ = [a for a in alerts if a["resolved_at"] is None]
    by_kind = {k: sum(a["kind"] == k for a in open_) for k in KINDS}
    if counts is not None:
        by_kind = dict.fromkeys(KINDS, 0) | {r["kind"]: int(r["open"]) for r in counts}
    return [
        _gauge("konduit_alerts_open", "Open alerts (konduit alerts), by kind.", ("kind",),
               (((k,), n) for k, n in by_kind.items())),
        _gauge("konduit_alert_open_since_seconds",
               "An open alert: Unix time it was raised (one sample per alert).",
               ("kind", "subject", "workflow", "severity"),
               (((a["kind"], a["subject"], a["workflow"], a["severity"]), a["raised_at"].timestamp())
                for a in open_)),
    ]


def webhook_family(counts: Sequence[Row]) -> Metric:
    """``konduit_webhook_deliveries`` by status (every status, 0 when none), from the rows of
    ``webhook_delivery_count_by_status``: a growing ``failed`` or ``pending`` count is a receiver
    that does not answer (docs/webhooks.md)."""
    found = {r["status"]: int(r["deliveries"]) for r in counts}
    return _gauge("konduit_webhook_deliveries", "Webhook deliveries in the outbox, by status "
                  "(pending, delivered, failed, refused).", ("status",),
                  (((s,), found.get(s, 0)) for s in DELIVERY_STATUSES))


def stall_family(rows: Sequence[Row]) -> Metric:
    """``konduit_stalls_total`` per workflow and ``healed`` (``true`` when the watchdog's re-run
    fan-in decision moved the execution, ``false`` when it left an open ``execution_stalled``
    alert), from the rows of ``execution_stall_count_by_workflow``. It only ever grows: a real
    counter, kept in the database however many workers found the stalls."""
    return _counter("konduit_stalls_total", "Stalled executions the watchdog found (running, "
                  "nothing can run), by workflow and whether its fan-in decision healed them.",
                  ("workflow", "healed"),
                  (((r["workflow"], "true" if r["healed"] else "false"), float(r["stalls"]))
                   for r in rows))

def degraded_families(rows: Sequence[Row]) -> list[Metric]:
    """Per workflow, over the last day (rows of ``workflow_degraded_share_for_names``): the
    share of finished executions that went out degraded, and the two counts it comes from. The
    ``degraded_budget`` alert fires past ``Workflow(degraded_budget=...)`` (docs/alerts.md)."""
    by = [((r["name"],), r) for r in rows]
    return [
        _gauge("konduit_workflow_degraded_share", "Share (0-1) of a workflow's executions "
               "finished in the last day that went out degraded (a fallback's payload).",
               ("workflow",), ((k, degraded_share(r["finished"], r["degraded"])) for k, r in by)),
        _gauge("konduit_workflow_degraded_executions", "Executions of a workflow finished in "
               "the last day that went out degraded.", ("workflow",),
               ((k, r["degraded"]) for k, r in by)),
        _gauge("konduit_workflow_finished_executions", "Executions of a workflow finished in "
               "the last day (succeeded, failed or timed out).", ("workflow",),
               ((k, r["finished"]) for k, r in by)),
    ]


WAIT_KINDS = ("event", "timer", "child")


def waiting_family(rows: Sequence[Row]) -> Metric:
    """Waiting tasks (durable waits: they hold no worker slot), by what they wait for; every
    kind is reported, zero included, so a rate or an alert on it never sees a gap."""
    found = {row["kind"]: float(row["tasks"]) for row in rows}
    return _gauge("konduit_tasks_waiting", "Tasks waiting for an event, a timer or a child "
                  "workflow (no worker slot held), by kind.", ("kind",),
                  [((kind,), found.get(kind, 0.0)) for kind in WAIT_KINDS])


def stored_events_family(stats: Stats) -> Metric:
    """Events sent before any step waited for them, kept for one to come, by event name (the
    names steps wait for: bounded by the workflows, not by the keys)."""
    return _gauge("konduit_events_stored", "Events kept for a step that has yet to wait for "
                  "them (not consumed, not expired), by event name.", ("event",),
                  [((e.name,), float(e.events)) for e in stats.stored_events])


def flow_families(stats: Stats) -> list[Metric]:
    """Flow limits (``step(concurrency=, rate=)``): running and ready tasks of each limited
    step, and the time and claims in which its limit held ready tasks back."""
    labels = ("workflow", "version", "step")
    rows = [((f.workflow, str(f.version), f.step), f) for f in stats.flow]
    return [
        _gauge("konduit_step_flow_running", "Running tasks of a step with a concurrency or rate "
               "limit (fleet-wide).", labels, ((k, f.running) for k, f in rows)),
        _gauge("konduit_step_flow_ready", "Ready tasks of a limited step.", labels,
               ((k, f.ready) for k, f in rows)),
        _counter("konduit_step_throttled_seconds_total", "Seconds during which claims left ready "
               "tasks of the step for its limit (an ongoing stretch counts up to now).", labels,
               ((k, f.throttled_seconds) for k, f in rows)),
        _gauge("konduit_step_throttled", "1 while the step's limit holds ready tasks back.",
               labels, ((k, float(f.throttled_now)) for k, f in rows)),
        _counter("konduit_step_throttled_claims_total", "Claims that left ready tasks of the step "
               "for its limit.", labels, ((k, f.throttled_claims) for k, f in rows)),
        # Limits per key: labelled by the limit (its step), never by key (a million keys would
        # be a million series); the keys themselves are in `konduit stats` and the dashboard.
        _gauge("konduit_step_flow_keys", "Keys with recent work of a step limited per key.",
               labels, ((k, f.keys) for k, f in rows if f.keyed)),
        _gauge("konduit_step_flow_keys_throttled", "Keys of a step limited per key whose limit "
               "holds ready tasks back now.", labels,
               ((k, f.keys_throttled) for k, f in rows if f.keyed)),
    ]


class KonduitCollector(Collector):
    """Reads the stats on every :meth:`collect`, on its own event-loop thread and pool."""

    def __init__(self, database_url: str | None = None, *, history: Duration = DEFAULT_HISTORY,
                 fan_in_alert: Duration = DEFAULT_FAN_IN_ALERT,
                 consecutive: int = DEFAULT_CONSECUTIVE, timeout: float = SCRAPE_TIMEOUT):
        seconds_option(history, "--history")  # bad options fail here, not on every scrape
        seconds_option(fan_in_alert, "--fan-in-alert")
        if consecutive < 1:
            raise blamed(StatsError(f"--consecutive must be at least 1, got {consecutive}"),
                         "consecutive")
        self.options: dict[str, Any] = {"history": history, "fan_in_alert": fan_in_alert,
                                        "consecutive": consecutive}
        self.timeout = timeout
        self.database_url = database_url
        self.url = resolve_url(database_url)  # starts the embedded server when it is the one
        self._db: Database | None = None
        self._lock = asyncio.Lock()
        self._failing: str | None = ""  # the last error logged; "" before the first scrape
        self._waiting: list[Row] = []  # waiting tasks by kind, read with the stats
        self._stalls: list[Row] = []  # stalls found per workflow, read with the stats
        self._degraded: list[Row] = []  # the day's degraded share per workflow, likewise
        self._queues: list[Row] = []  # ready, delayed and running tasks per queue, likewise
        self._queue_series = QueueSeries()
        self._loop = LoopThread("konduit-metrics")

    async def _open(self) -> Database:
        # The configured URL, not the resolved one: the embedded server is migrated on open.
        return await open_database(self.database_url, max_size=2, name="konduit-metrics",
                                   connect_timeout=self.timeout)

    async def _read(self) -> tuple[Stats, list[Row], list[Row], tuple[list[Row], list[Row]], list[Row]]:
        async with self._lock:
            try:
                if self._db is None:
                    self._db = await self._open()
                stats = await load_stats(self._db, **self.options)
                rows = await self._db.all("execution_count_by_status",
                                          history_seconds=stats.history_seconds)
                workers = await self._db.all("worker_list_live", stale_seconds=None)
                alerts = await self._db.all("alert_list_recent", include_resolved=False, kind=None,
                                            workflow=None, limit=MAX_ALERT_SAMPLES)
                counts = await self._db.all("alert_count_open_by_kind")
                deliveries = await self._db.all("webhook_delivery_count_by_status")
                self._waiting = await self._db.all("task_count_waiting")
                self._stalls = await self._db.all("execution_stall_count_by_workflow")
                self._degraded = await self._db.all("workflow_degraded_share_for_names",
                                                    names=None, window_seconds=DEGRADED_WINDOW)
                self._queues = await self._db.all("task_count_live_by_queue")
                return stats, rows, workers, (alerts, counts), deliveries
            except BaseException:  # a fresh pool next time: no waiting out a broken one's retries
                db, self._db = self._db, None
                if db is not None:
                    await db.close()
                raise

    def read(self) -> tuple[Stats, list[Row], list[Row], tuple[list[Row], list[Row]], list[Row]]:
        """The stats, execution counts, live workers and open alerts now, within ``timeout``
        seconds (or an exception)."""
        future = self._loop.submit(asyncio.wait_for(self._read(), self.timeout))
        try:
            return future.result(self.timeout + 10)  # wait_for also waits out the cleanup
        finally:
            future.cancel()

    def collect(self) -> Iterator[Metric]:
        began = time.perf_counter()
        try:
            stats, rows, workers, (alerts, counts), deliveries = self.read()
        except Exception as exc:
            error = " ".join(str(exc).split()) or f"no answer within {self.timeout:g}s"
            if error != self._failing:
                log.warning("cannot read the stats: %s", error)
            self._failing, families = error, []
        else:
            if self._failing:
                log.warning("reading the stats again")
            self._failing, families = None, [
                *metric_families(stats, rows, workers, alerts, counts),
                webhook_family(deliveries), waiting_family(self._waiting),
                stored_events_family(stats),
                stall_family(self._stalls),
                *degraded_families(self._degraded),
                *self._queue_series.families(self._queues)]
        yield from families
        yield GaugeMetricFamily("konduit_scrape_error", "1 when this scrape could not read the "
                                "database, else 0.", value=float(self._failing is not None))
        yield GaugeMetricFamily("konduit_scrape_duration_seconds", "Seconds this scrape took.",
                                value=time.perf_counter() - began)

    def close(self) -> None:
        async def shut() -> None:
            async with self._lock:
                if self._db is not None:
                    await self._db.close()
                    self._db = None

        if not self._loop.closed:
            self._loop.run(shut(), self.timeout + 10)
            self._loop.close()


class Exporter:
    """A running ``/metrics`` server (a daemon thread); ``close()`` stops it."""

    def __init__(self, collector: KonduitCollector, host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT):
        self.collector = collector
        registry = CollectorRegistry()
        registry.register(collector)
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            collector.close()
            raise MetricsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.host, self.port = host, int(self.server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.collector.close()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def serve(database_url: str | None = None, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          **options: Any) -> Exporter:
    """Serve the metrics of ``database_url`` on ``http://host:port/metrics`` (port 0: any free
    one, see :attr:`Exporter.port`); ``options`` are :class:`KonduitCollector`'s."""
    return Exporter(KonduitCollector(database_url, **options), host, port)


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM (the main thread's way to keep an exporter serving)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1):
        pass
