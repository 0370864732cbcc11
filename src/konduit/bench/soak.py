"""``konduit bench --only soak``: steady load for a long while, with retention on.

One worker process (``python -m konduit.cli worker konduit.bench.apps:soak_app_<s>``, the App of
``bench-soak`` with ``retention=<s>`` seconds, its retention round every few seconds) serves an
open-loop load: ``bench-soak`` executions (root -> 3 branches -> join -> a map of 4 items ->
total, 10 tasks each) started at a fixed rate below saturation by a thread of the bench. The
run is cut into windows; after each one the bench reads, from the database's own timestamps,
what happened in it (tasks finished, join dispatch latency, pickup latency) and what is left
(rows per table, the database's size, executions pruned so far), and it samples the worker's
resident set every few seconds. The first and last ``compare`` seconds are set side by side:
throughput, join-dispatch p99 and worker RSS should be within 10 % of each other.

Throughput under a fixed offered load is the offered load as long as the worker keeps up, so a
separate **capacity** figure is taken too: a burst of executions started at once, with the steady
load paused, after the first span and again at the end, on the database the soak left behind.

With ``history_after`` (``--history-after SECONDS``), the worker's App moves finished
executions into the history (migration 0041) that long after they finished, every
``history_interval`` seconds, and retention drops whole days of it: the hot tables then see only
the moves' deletes. Either way, every window reads ``n_dead_tup`` and ``n_live_tup`` of the hot
tables (``pg_stat_user_tables``): the report's ``dead_tuples`` is that series, its slope, and the
last span's mean against the first's (do dead tuples grow, or does vacuum keep up?).

Not in CI and not in a full ``konduit bench`` run: only when asked for. Not part of the API.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import konduit
from konduit.bench import apps
from konduit.bench.fleet import Observer, WorkerProcess, dist_ms, quantile, ratio
from konduit.errors import BenchError

Json = dict[str, Any]
WORKFLOW = "bench-soak"
TASKS_EACH = 1 + apps.SOAK_BRANCHES + 1 + apps.SOAK_ITEMS + 1
TABLES = ("konduit_executions", "konduit_steps", "konduit_tasks", "konduit_attempts",
          "konduit_outputs")
TOLERANCE = 0.10
"""The issue's criterion: the last figures within 10 % of the first ones."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise BenchError(f"bench: soak: {message}")


def _r(value: float) -> float:
    return round(value, 3)


@dataclass(frozen=True)
class SoakSettings:
    """How long, how much and how it is cut; see :func:`soak`."""

    duration: float = 1800.0
    """Seconds of steady load (the windows fill it; a remainder shorter than a window is not run)."""
    window: float = 30.0
    """Seconds per measured window."""
    rate: float = 10.0
    """Executions started per second (x 10 tasks), below what one worker process can do."""
    retention: int | None = None
    """``App(retention=...)`` in seconds; default max(120, 4 windows). At least two windows, so
    that a window's rows are still there when the bench reads them."""
    retention_interval: float | None = None
    """Seconds between the worker's retention rounds; default retention / 8, at most 15."""
    compare: float = 300.0
    """Seconds at the start and at the end set side by side (at most half the run)."""
    burst: int = 300
    """Executions of each capacity burst (before and after the soak); 0: none."""
    concurrency: int = 8
    sample_every: float = 5.0
    """Seconds between readings of the worker's RSS (at most a third of a window)."""
    history_after: int | None = None
    """``App(history_after=...)`` in seconds (None: no history, retention deletes rows). At least
    two windows, as the retention (a window's rows are read in the hot tables after it ends),
    and shorter than the retention (which would delete them first)."""
    history_interval: float | None = None
    """Seconds between the leader's moves (``KONDUIT_HISTORY_INTERVAL``); default
    history_after / 4, at most 15."""

    def resolved(self) -> SoakSettings:
        window = float(self.window)
        retention = self.retention if self.retention is not None else max(120, int(4 * window))
        interval = self.retention_interval if self.retention_interval is not None else \
            max(0.5, min(15.0, retention / 8))
        after = None if self.history_after is None else int(self.history_after)
        moves = None if after is None else float(
            self.history_interval if self.history_interval is not None
            else max(0.5, min(15.0, after / 4)))
        return SoakSettings(
            duration=float(self.duration), window=window, rate=float(self.rate),
            retention=int(retention), retention_interval=float(interval),
            compare=float(self.compare), burst=int(self.burst), concurrency=self.concurrency,
            sample_every=min(float(self.sample_every), window / 3), history_after=after,
            history_interval=moves)

    def validate(self) -> None:
        _check(self.window > 0 and self.duration >= 2 * self.window,
               f"--duration ({self.duration:g} s) must hold at least two windows of {self.window:g} s")
        _check(self.rate > 0, f"--rate must be > 0, got {self.rate:g}")
        _check(self.retention is not None and self.retention >= 2 * self.window,
               f"the retention ({self.retention} s) must be at least two windows "
               f"({2 * self.window:g} s): a window is read after it ends")
        _check(self.burst >= 0 and self.compare > 0, "--burst must be >= 0 and compare > 0")
        _check(self.history_after is None or self.history_after >= 2 * self.window,
               f"--history-after ({self.history_after} s) must be at least two windows "
               f"({2 * self.window:g} s): a window is read in the hot tables after it ends")
        _check(self.history_after is None or self.retention is None
               or self.history_after < self.retention,
               f"--history-after ({self.history_after} s) must be shorter than the retention "
               f"({self.retention} s): retention would delete the executions before they move")


# -- the load -----------------------------------------------------------------------------------


class Load:
    """A thread starting ``rate`` executions per second on a fixed schedule (open loop: a late
    start is made at once, it does not push the later ones back)."""

    def __init__(self, app: konduit.App, rate: float):
        self.app, self.rate = app, rate
        self.started = 0
        self.most_behind = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="konduit-bench-soak")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        began = time.monotonic()
        try:
            while not self._stop.is_set():
                wait = began + self.started / self.rate - time.monotonic()
                if wait > 0 and self._stop.wait(wait):
                    return
                self.most_behind = max(self.most_behind, -wait)
                self.app.start(WORKFLOW)
                self.started += 1
        except BaseException as exc:  # re-raised on the bench's thread by stop()
            self.error = exc

    def stop(self) -> None:
        """Stop starting (idempotent); re-raises, once, what stopped the thread."""
        self._stop.set()
        self._thread.join(timeout=60)
        error, self.error = self.error, None
        if error is not None:
            raise BenchError(f"bench: soak: the load failed: {error!r}") from error


# -- what the database says -----------------------------------------------------------------------


def window_figures(obs: Observer, lo: datetime, hi: datetime) -> tuple[Json, list[float]]:
    """What happened in [lo, hi) by the database's clock: tasks finished, executions started
    and finished, pickup and join dispatch latencies of the tasks made ready in it. Returns the
    figures and the raw join dispatch latencies (seconds; the spans' p99 is taken over them)."""
    bounds = {"lo": lo, "hi": hi}
    finished, started, ended, failed = obs.rows("""
        SELECT (SELECT count(*) FROM konduit_tasks
                WHERE finished_at >= %(lo)s AND finished_at < %(hi)s),
               count(*) FILTER (WHERE created_at >= %(lo)s AND created_at < %(hi)s),
               count(*) FILTER (WHERE finished_at >= %(lo)s AND finished_at < %(hi)s),
               count(*) FILTER (WHERE finished_at >= %(lo)s AND finished_at < %(hi)s
                                  AND status <> 'succeeded')
        FROM konduit_executions""", bounds)[0]
    rows = obs.rows("""
        SELECT step, extract(epoch FROM started_at - created_at)::float8
        FROM konduit_tasks
        WHERE created_at >= %(lo)s AND created_at < %(hi)s AND started_at IS NOT NULL""", bounds)
    joins = [s for step, s in rows if step == "join"]
    seconds = (hi - lo).total_seconds()
    return {"tasks_finished": int(finished), "tasks_per_second": _r(finished / seconds),
            "executions_started": int(started), "executions_finished": int(ended),
            "executions_not_succeeded": int(failed),
            # The join task is made ready by the transaction that records the last branch: its
            # created_at -> started_at is "last branch recorded -> join running" (as fleet.py).
            "join_dispatch_latency": dist_ms(joins),
            "map_join_dispatch_latency": dist_ms([s for step, s in rows if step == "total"]),
            "pickup_latency": dist_ms([s for _, s in rows])}, joins


def state(obs: Observer) -> Json:
    """Rows per table, the database's size, and the work not yet done, now."""
    counts = obs.rows("SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES))[0]
    size, ready, running, unfinished = obs.rows("""
        SELECT pg_database_size(current_database()),
               (SELECT count(*) FROM konduit_tasks WHERE status = 'ready'),
               (SELECT count(*) FROM konduit_tasks WHERE status = 'running'),
               (SELECT count(*) FROM konduit_executions WHERE finished_at IS NULL)""")[0]
    tuples = {name: (int(dead), int(live), int(vacuums)) for name, dead, live, vacuums in obs.rows("""
        SELECT relname::text, n_dead_tup, n_live_tup, autovacuum_count + vacuum_count
        FROM pg_stat_user_tables WHERE relname = ANY(%s)""", (list(TABLES),))}
    history = int(obs.one("SELECT count(*) FROM konduit_history_executions"))
    return {"rows": {t.removeprefix("konduit_"): int(n) for t, n in zip(TABLES, counts, strict=True)},
            "executions_in_history": history,
            "database_mb": _r(int(size) / 2**20),
            "dead_rows": sum(d for d, _, _ in tuples.values()),
            "live_rows": sum(live for _, live, _ in tuples.values()),
            "dead_tuples": {t.removeprefix("konduit_"): d for t, (d, _, _) in tuples.items()},
            "live_tuples": {t.removeprefix("konduit_"): live for t, (_, live, _) in tuples.items()},
            "autovacuums": sum(v for _, _, v in tuples.values()), "tasks_ready": int(ready),
            "tasks_running": int(running), "executions_unfinished": int(unfinished)}


def wait_drained(obs: Observer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while int(obs.one("SELECT count(*) FROM konduit_executions WHERE finished_at IS NULL")):
        _check(time.monotonic() < deadline, f"executions still unfinished {timeout:.0f} s "
               "after the load stopped")
        time.sleep(0.1)


def capacity_burst(app: konduit.App, obs: Observer, executions: int) -> Json:
    """``executions`` started in one ``start_many`` on an otherwise idle worker: tasks/s from
    the first one's created_at to the last one's finished_at (database clock)."""
    before = obs.rows("SELECT count(*), pg_database_size(current_database())"
                      " FROM konduit_executions")[0]
    since = obs.now()
    ids = [h.id for h in app.start_many([{"workflow": WORKFLOW}] * executions)]
    deadline = time.monotonic() + max(120.0, executions * TASKS_EACH / 20)
    # Each execution is read once it has finished, and kept: the soak's retention deletes an
    # execution `retention` seconds after it finished, so a burst that lasts longer than that
    # (a busy machine: 20 executions took more than 4 s) never has all of them in the tables
    # at once. Read every 0.05 s, each one is seen for `retention` seconds before it goes.
    ended: dict[Any, tuple[Any, Any, str, int]] = {}
    while True:
        for eid, created, finished, status, count in obs.rows("""
                SELECT e.id, e.created_at, e.finished_at, e.status, count(t.id)
                FROM konduit_executions e JOIN konduit_tasks t ON t.execution_id = e.id
                WHERE e.id = ANY(%s) AND e.finished_at IS NOT NULL GROUP BY e.id""",
                ([i for i in ids if i not in ended],)):
            ended[eid] = (created, finished, status, int(count))
        if len(ended) == executions:
            break
        _check(time.monotonic() < deadline,
               f"{len(ended)} of {executions} burst executions finished")
        time.sleep(0.05)
    span = (max(f for _, f, _, _ in ended.values())
            - min(c for c, _, _, _ in ended.values())).total_seconds()
    tasks = sum(n for _, _, _, n in ended.values())
    failed = sum(status != "succeeded" for _, _, status, _ in ended.values())
    _check(failed == 0 and tasks == executions * TASKS_EACH,
           f"burst: {failed} executions did not succeed, {tasks} tasks ran")
    return {"executions": executions, "tasks": int(tasks), "seconds": _r(span),
            "tasks_per_second": _r(tasks / span), "started_at": since.isoformat(),
            "executions_in_database_before": int(before[0]),
            "database_mb_before": _r(int(before[1]) / 2**20)}


# -- comparing the start with the end ---------------------------------------------------------------


def span_figures(windows: list[Json], joins: list[list[float]]) -> Json:
    """Throughput, join dispatch p99 (over every join of the span) and worker RSS of windows."""
    seconds = sum(w["seconds"] for w in windows)
    every_join = [s for js in joins for s in js]
    rss = [mb for w in windows for mb in w["worker_rss_mb_samples"]]
    return {"windows": [w["index"] for w in windows], "seconds": _r(seconds),
            "tasks_per_second": _r(sum(w["tasks_finished"] for w in windows) / seconds),
            "join_dispatch_p99_ms": _r(quantile(every_join, 0.99) * 1000) if every_join else None,
            "join_dispatch_p50_ms": _r(statistics.median(every_join) * 1000) if every_join else None,
            "joins": len(every_join),
            "worker_rss_mb_mean": _r(statistics.fmean(rss)) if rss else None,
            "worker_rss_mb_max": max(rss) if rss else None,
            "executions_rows_max": max(w["state"]["rows"]["executions"] for w in windows),
            "database_mb_max": max(w["state"]["database_mb"] for w in windows)}


def verdict(value: float | None) -> Json:
    """A last/first ratio against the 10 % of the issue: ``within`` (either way, the issue's
    words) and ``no_worse`` (only a rise of latency or memory, a fall of throughput, counts)."""
    return {"ratio": value,
            "within_10_percent": None if value is None else abs(value - 1) <= TOLERANCE}


def compare(windows: list[Json], joins: list[list[float]], count: int) -> Json:
    first, last = (span_figures(windows[:count], joins[:count]),
                   span_figures(windows[-count:], joins[-count:]))
    checks = {
        "tasks_per_second": verdict(ratio(last["tasks_per_second"], first["tasks_per_second"])),
        "join_dispatch_p99": verdict(ratio(last["join_dispatch_p99_ms"],
                                           first["join_dispatch_p99_ms"])),
        "worker_rss": verdict(ratio(last["worker_rss_mb_mean"], first["worker_rss_mb_mean"])),
    }
    worse = {"tasks_per_second": lambda r: r >= 1 - TOLERANCE,
             "join_dispatch_p99": lambda r: r <= 1 + TOLERANCE,
             "worker_rss": lambda r: r <= 1 + TOLERANCE}
    for key, check in checks.items():
        check["no_worse_than_10_percent"] = (None if check["ratio"] is None
                                             else worse[key](check["ratio"]))
    return {"first": first, "last": last, "checks": checks,
            "passed": all(c["within_10_percent"] is True for c in checks.values()),
            "passed_no_worse": all(c["no_worse_than_10_percent"] is True for c in checks.values())}


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of (seconds, value) points, per minute (None under two)."""
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    if den == 0:
        return None
    return _r(60 * sum((x - mx) * (y - my) for x, y in points) / den)


def dead_tuple_trend(windows: list[Json], count: int) -> Json:
    """The hot tables' dead tuples window by window (read at each window's end), their slope
    over the run and over its second half, the last ``count`` windows' mean against the first
    ``count``'s and the peak of the second half against the first's. Vacuum makes a sawtooth
    of it, and the first span starts from an empty database (its mean is low for that alone),
    so ``grows`` asks for both: the last mean more than 10 % above the first (and by more than
    a hundred tuples) and the second half's peak more than 10 % above the first half's."""
    series = [{"from_s": w["from_s"], "dead": w["state"]["dead_rows"],
               "live": w["state"]["live_rows"],
               "dead_fraction": _r(w["state"]["dead_rows"] / max(
                   1, w["state"]["dead_rows"] + w["state"]["live_rows"])),
               "by_table": w["state"]["dead_tuples"]} for w in windows]
    points = [(float(w["from_s"]), float(w["dead"])) for w in series]
    first = statistics.fmean(p["dead"] for p in series[:count]) if series else 0.0
    last = statistics.fmean(p["dead"] for p in series[-count:]) if series else 0.0
    half = len(series) // 2
    peaks = (max((p["dead"] for p in series[:half]), default=0),
             max((p["dead"] for p in series[half:]), default=0))
    return {"series": series,
            "slope_per_minute": slope_per_minute(points),
            "second_half_slope_per_minute": slope_per_minute(points[half:]),
            "first_mean": _r(first), "last_mean": _r(last),
            "max": max((p["dead"] for p in series), default=0),
            "first_half_max": peaks[0], "second_half_max": peaks[1],
            "last_over_first": ratio(last, first),
            "grows": (last > (1 + TOLERANCE) * first and last - first > 100
                      and peaks[1] > (1 + TOLERANCE) * peaks[0])}


# -- the run -----------------------------------------------------------------------------------------


class Run:
    """The soak's state while it runs: the worker, the observer, and the windows so far."""

    def __init__(self, s: SoakSettings, obs: Observer, worker: WorkerProcess, app: konduit.App,
                 progress: Callable[[str], None], total: int):
        self.s, self.obs, self.worker, self.app = s, obs, worker, app
        self.progress, self.total = progress, total
        self.lag = min(2.0, s.window / 4)  # a window is read this long after it ends (joins ran)
        self.windows: list[Json] = []
        self.joins: list[list[float]] = []
        self.started = 0  # executions the bench started, all told
        self.most_behind = 0.0
        self.steady_seconds = 0.0

    def segment(self, count: int) -> None:
        """``count`` windows of steady load, from a load started now to a load stopped at the
        last window's end; each window read ``lag`` seconds after it ends."""
        s, worker = self.s, self.worker
        load = Load(self.app, s.rate)
        t0, mono0 = self.obs.now(), time.monotonic()
        load.start()
        samples: list[list[float]] = [[] for _ in range(count)]
        next_sample, end = mono0, mono0 + count * s.window
        try:
            for k in range(count):
                read_at = mono0 + (k + 1) * s.window + self.lag
                while (now := time.monotonic()) < read_at:
                    if now >= next_sample:
                        _check(worker.proc.poll() is None,
                               f"the worker exited with {worker.proc.returncode}")
                        worker.sample_memory()
                        if worker.rss_kib is not None and now < end:
                            samples[int((now - mono0) // s.window)].append(
                                _r(worker.rss_kib / 1024))
                        next_sample += s.sample_every
                    if now >= end:
                        load.stop()  # the last window is over: no more starts
                    time.sleep(max(0.0, min(read_at, next_sample) - time.monotonic()))
                lo = t0 + timedelta(seconds=k * s.window)
                figures, joins = window_figures(self.obs, lo, lo + timedelta(seconds=s.window))
                # Read before the rows: an execution started in between is not counted pruned.
                started = self.started + load.started
                now_state = state(self.obs)
                self.windows.append({
                    "index": len(self.windows), "from_s": _r(self.steady_seconds + k * s.window),
                    "at": lo.isoformat(), "seconds": s.window, **figures,
                    "worker_rss_mb_samples": samples[k],
                    "worker_rss_mb": _r(statistics.fmean(samples[k])) if samples[k] else None,
                    "state": now_state,
                    "executions_pruned_so_far": started - now_state["rows"]["executions"]
                    - now_state["executions_in_history"],
                    "executions_moved_so_far": now_state["executions_in_history"]})
                self.joins.append(joins)
                w = self.windows[-1]
                self.progress(
                    f"bench: soak: window {len(self.windows)}/{self.total}: "
                    f"{w['tasks_per_second']} tasks/s, join dispatch p99 "
                    f"{w['join_dispatch_latency'].get('p99_ms')} ms, worker RSS "
                    f"{w['worker_rss_mb']} MB, {now_state['rows']['executions']} executions "
                    f"in the tables ({w['executions_pruned_so_far']} pruned, "
                    f"{w['executions_moved_so_far']} in the history so far), "
                    f"{now_state['dead_rows']} dead tuples in the hot tables, "
                    f"{now_state['database_mb']} MB")
        finally:
            load.stop()
            self.started += load.started
            self.most_behind = max(self.most_behind, load.most_behind)
        self.steady_seconds += count * s.window

    def burst(self) -> Json:
        """A capacity burst once the load's last executions are done."""
        wait_drained(self.obs, timeout=120)
        self.started += self.s.burst
        return capacity_burst(self.app, self.obs, self.s.burst)


def soak(url: str, settings: SoakSettings | None = None, *,
         progress: Callable[[str], None] = lambda _: None) -> Json:
    """The soak on the (migrated, scratch) database of ``url``; the JSON report. ``progress``
    gets a line after each window."""
    s = (settings or SoakSettings()).resolved()
    s.validate()
    assert s.retention is not None and s.retention_interval is not None
    count = int(s.duration // s.window)
    per_span = max(1, min(count // 2, round(s.compare / s.window)))
    env = {"KONDUIT_RETENTION_INTERVAL": str(s.retention_interval),
           "KONDUIT_MAINTENANCE_INTERVAL": str(min(2.0, s.retention_interval))}
    app_spec = f"konduit.bench.apps:soak_app_{s.retention}"
    if s.history_after is not None:
        assert s.history_interval is not None
        env["KONDUIT_HISTORY_INTERVAL"] = str(s.history_interval)
        env["KONDUIT_MAINTENANCE_INTERVAL"] = str(min(2.0, s.retention_interval,
                                                      s.history_interval))
        app_spec = f"konduit.bench.apps:soak_history_app_{s.retention}_{s.history_after}"
    obs = Observer(url)
    bursts: Json = {}
    worker = WorkerProcess(url, concurrency=s.concurrency, label="soak", env=env,
                           app_spec=app_spec)
    try:
        with konduit.App([apps.soak_workflow()], database_url=url) as app:
            worker.wait_ready(obs)
            run = Run(s, obs, worker, app, progress, count)
            for _ in range(3):  # warm-up, not measured
                app.start(WORKFLOW).wait(timeout=60)
            run.started += 3
            if s.burst:
                # Capacity is measured with the load paused: after the first span (the tables
                # filled, retention going) and after the last, on what the soak left behind.
                run.segment(per_span)
                bursts["after_first_span"] = run.burst()
                run.segment(count - per_span)
                bursts["end"] = run.burst()
            else:
                run.segment(count)
            wait_drained(obs, timeout=120)
            worker.sample_memory()
            final = state(obs)
    finally:
        code = worker.stop()
        obs.close()
    _check(code == 0, f"the worker exited with {code}")
    windows, joins = run.windows, run.joins
    comparison = compare(windows, joins, per_span)
    trend = dead_tuple_trend(windows, per_span)
    every_join = [x for js in joins for x in js]
    capacity = ratio(bursts["end"]["tasks_per_second"],
                     bursts["after_first_span"]["tasks_per_second"]) if bursts else None
    return {
        "parameters": {**asdict(s), "windows": count, "windows_compared": per_span,
                       "read_lag_s": run.lag, "maintenance_interval": float(env[
                           "KONDUIT_MAINTENANCE_INTERVAL"]),
                       "workflow": "bench-soak: root -> 3 branches -> join -> map of 4 items -> "
                                   f"total ({TASKS_EACH} tasks an execution)",
                       "offered_tasks_per_second": _r(s.rate * TASKS_EACH), "processes": 1,
                       "worker": f"python -m konduit.cli worker {app_spec} "
                                 f"--concurrency {s.concurrency}",
                       "capacity": "a burst of `burst` executions in one start_many with the "
                                   "steady load paused, after the first span and at the end"},
        "results": {
            "windows": windows, "first": comparison["first"], "last": comparison["last"],
            "checks": comparison["checks"], "passed": comparison["passed"],
            "passed_no_worse": comparison["passed_no_worse"],
            "executions_started": run.started,
            "executions_pruned": run.started - final["rows"]["executions"]
            - final["executions_in_history"],
            "executions_moved": final["executions_in_history"],
            "dead_tuples": trend,
            "executions_not_succeeded": sum(w["executions_not_succeeded"] for w in windows),
            "most_behind_schedule_s": _r(run.most_behind),
            "join_dispatch_latency": dist_ms(every_join),
            "capacity": bursts, "final_state": final,
            "worker_peak_rss_mb": _r(worker.peak_rss_kib / 1024) if worker.peak_rss_kib else None},
        "ratios": {k: v for k, v in {
            "tasks_per_second_last_over_first": comparison["checks"]["tasks_per_second"]["ratio"],
            "join_dispatch_p99_last_over_first":
                comparison["checks"]["join_dispatch_p99"]["ratio"],
            "worker_rss_last_over_first": comparison["checks"]["worker_rss"]["ratio"],
            "capacity_end_over_first_span": capacity}.items() if v is not None},
    }
