"""The fleet benchmarks: real worker processes, measured from the database.

Each scenario runs in its own scratch database (see :class:`konduit.bench.suite.Server`). Worker
processes are ``python -m konduit.cli worker konduit.bench.apps:app`` — the same command a user
runs. Times come from the database's own timestamps (``created_at``, ``started_at``,
``finished_at``), so the bench process's polling does not shape them; the bench polls on one
counted connection, and its own statements are subtracted from the transaction counts.

Not part of the API.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psycopg

import konduit
from konduit.bench import apps
from konduit.errors import BenchError
from konduit.settings import settings

Json = dict[str, Any]
APP_SPEC = "konduit.bench.apps:app"
PROFILE_ENV = "KONDUIT_BENCH_PROFILE"
"""A directory: when set, every worker process runs under cProfile and writes its profile there."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise BenchError(f"bench: {message}")


def _r(value: float) -> float:
    return round(value, 3)


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile (p99 of 100 values is the 99th)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def dist_ms(seconds: Sequence[float]) -> Json:
    """p50/p95/p99/max of durations in seconds, in milliseconds."""
    if not seconds:
        return {"n": 0}
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50_ms": _r(statistics.median(ms)), "p95_ms": _r(quantile(ms, 0.95)),
            "p99_ms": _r(quantile(ms, 0.99)), "max_ms": _r(max(ms))}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return _r(numerator / denominator)


# -- the bench's own connection -----------------------------------------------------------------


class Observer:
    """One autocommit connection that counts its statements: each is one committed transaction
    in ``pg_stat_database.xact_commit``, which the bench subtracts from what it measures."""

    def __init__(self, url: str):
        self.conn = psycopg.connect(url, autocommit=True)
        self.statements = 0
        version = self.one("SELECT current_setting('server_version_num')::int")
        self.server_version = int(version)

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        self.statements += 1
        return self.conn.execute(query, params).fetchall()

    def one(self, query: str, params: Any = None) -> Any:
        rows = self.rows(query, params)
        return rows[0][0] if rows else None

    def close(self) -> None:
        self.conn.close()

    def others(self) -> int:
        """Other sessions on this database."""
        return int(self.one("SELECT count(*) FROM pg_stat_activity"
                            " WHERE datname = current_database() AND pid <> pg_backend_pid()"))

    def commits(self) -> tuple[int, int]:
        """(xact_commit of this database, own statements so far) once other sessions are gone
        and their statistics flushed (a backend flushes them as it exits, a moment after it
        leaves pg_stat_activity, so the count is read until it stops moving)."""
        deadline = time.monotonic() + 30
        while self.others() and time.monotonic() < deadline:
            time.sleep(0.05)
        last = -1
        while time.monotonic() < deadline:
            if self.server_version >= 150000:
                # This session's own counts are flushed before its next statement runs.
                self.one("SELECT pg_stat_force_next_flush()")
            value = int(self.one("SELECT xact_commit FROM pg_stat_database"
                                 " WHERE datname = current_database()"))
            # Own statements move the count too: compare what the others committed.
            if value - self.statements == last:
                return value, self.statements
            last = value - self.statements
            time.sleep(0.2)
        raise BenchError("bench: the database's commit count did not settle within 30 s")

    def now(self) -> Any:
        return self.one("SELECT clock_timestamp()")

    def finished(self, since: Any = None) -> int:
        """Executions finished (of those created at or after ``since``, when given: a count
        that stays cheap beside a large history of finished executions)."""
        if since is None:
            return int(self.one(
                "SELECT count(*) FROM konduit_executions WHERE finished_at IS NOT NULL"))
        return int(self.one("SELECT count(*) FROM konduit_executions"
                            " WHERE created_at >= %s AND finished_at IS NOT NULL", (since,)))

    def wait_finished(self, executions: int, timeout: float, interval: float = 0.05,
                      since: Any = None) -> None:
        """Until ``executions`` executions have finished in all (of those created at or after
        ``since``, when given; bounded by ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.finished(since)
            if done >= executions:
                return
            _check(time.monotonic() < deadline,
                   f"only {done} of {executions} executions finished within {timeout:.0f} s")
            time.sleep(interval)


def commits_between(before: tuple[int, int], after: tuple[int, int]) -> int:
    """Commits of everyone but the observer between two :meth:`Observer.commits` readings
    (the observer's statements between the two readings are its own commits)."""
    return (after[0] - before[0]) - (after[1] - before[1])


# -- worker processes ---------------------------------------------------------------------------


def _kib(status: str, field: str) -> int | None:
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


class WorkerProcess:
    """``python -m konduit.cli worker`` as a child process."""

    def __init__(self, url: str, *, concurrency: int = 8, app_spec: str = APP_SPEC,
                 label: str = "worker", log: Path | None = None,
                 env: dict[str, str] | None = None):
        command = [sys.executable]
        profile_dir = settings().bench_profile  # PROFILE_ENV
        self.profile: Path | None = None
        arguments = ["worker", app_spec, "--concurrency", str(concurrency), "--database-url", url,
                     "--log-level", "WARNING", "--shutdown-grace", "10"]
        if profile_dir:
            self.profile = Path(profile_dir) / f"{label}-{os.getpid()}-{time.monotonic_ns()}.prof"
            command += ["-m", "konduit.cli.profiled", str(self.profile), *arguments]
        else:
            command += ["-m", "konduit.cli", *arguments]
        self.log = log
        err = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err,
                                         env=None if env is None else {**os.environ, **env})
        finally:
            if log is not None:
                err.close()  # type: ignore[union-attr]
        self.peak_rss_kib: int | None = None
        self.rss_kib: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, observer: Observer, timeout: float = 60) -> None:
        """Until the worker registered itself (it claims from then on)."""
        deadline = time.monotonic() + timeout
        while not observer.one("SELECT EXISTS (SELECT 1 FROM konduit_workers"
                               " WHERE pid = %s AND stopped_at IS NULL)", (self.pid,)):
            _check(self.proc.poll() is None,
                   f"worker process {self.pid} exited with {self.proc.returncode} at start"
                   + (f" (log: {self.log})" if self.log else ""))
            _check(time.monotonic() < deadline, f"worker process {self.pid} not up in {timeout} s")
            time.sleep(0.05)

    def sample_memory(self) -> None:
        """Read VmRSS (now) and VmHWM (the peak so far) of the worker process."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return
        self.rss_kib = _kib(status, "VmRSS")
        peak = _kib(status, "VmHWM")
        if peak is not None:
            self.peak_rss_kib = max(self.peak_rss_kib or 0, peak)

    def cpu_seconds(self) -> float | None:
        """User + system CPU the worker process has used so far (None once it is gone). Unlike
        tasks/s, barely moved by other load on the machine: the figure to compare across runs."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (a graceful stop) and wait; the exit status."""
        self.sample_memory()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise BenchError(f"bench: worker process {self.pid} did not stop in {timeout} s") from None


@contextmanager
def worker_processes(url: str, observer: Observer, count: int, *, concurrency: int = 8,
                     app_spec: str = APP_SPEC, label: str = "worker",
                     ready: bool = True,
                     env: dict[str, str] | None = None) -> Iterator[list[WorkerProcess]]:
    """``count`` worker processes, registered before the block runs (unless ``ready`` is
    false), stopped gracefully after it."""
    workers: list[WorkerProcess] = []
    try:
        for i in range(count):
            workers.append(WorkerProcess(url, concurrency=concurrency, app_spec=app_spec,
                                         label=f"{label}{i}", env=env))
        if ready:
            for w in workers:
                w.wait_ready(observer)
        yield workers
    finally:
        codes = [w.stop() for w in workers]
    _check(all(c == 0 for c in codes), f"a worker process exited with {codes}")


def cpu_ms_per_task(before: Sequence[float | None], workers: Sequence[WorkerProcess],
                    tasks: int) -> float | None:
    """The workers' CPU between ``before`` (their :meth:`WorkerProcess.cpu_seconds` then) and
    now, in milliseconds per task."""
    now = [w.cpu_seconds() for w in workers]
    pairs = [(b, n) for b, n in zip(before, now, strict=True) if b is not None and n is not None]
    if not tasks or len(pairs) != len(workers):
        return None
    return _r(1000 * sum(n - b for b, n in pairs) / tasks)


def peak_rss_mb(workers: Sequence[WorkerProcess]) -> float | None:
    peaks = [w.peak_rss_kib for w in workers if w.peak_rss_kib is not None]
    return _r(max(peaks) / 1024) if peaks else None


# -- starting executions ------------------------------------------------------------------------


def start_all(app: konduit.App, requests: list[Json], chunk: int = 5_000) -> bool:
    """Start the executions of ``requests`` (dicts of start arguments) with ``start_many``, in
    calls of ``chunk`` (each one transaction). Returns True: the report says how they started."""
    for i in range(0, len(requests), chunk):
        app.start_many(requests[i:i + chunk])
    return True


# -- commit probe -------------------------------------------------------------------------------


def commit_probe(url: str, seconds: float) -> Json:
    """Durable one-row UPDATE transactions back to back on one autocommit connection: what
    this machine's storage allows one session to commit per second. The other figures are
    reported as ratios to it."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS konduit_bench_probe (id int PRIMARY KEY, n bigint)")
        conn.execute("INSERT INTO konduit_bench_probe VALUES (1, 0) ON CONFLICT DO NOTHING")
        settings: dict[str, str] = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN"
            " ('fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes')").fetchall())
        update = "UPDATE konduit_bench_probe SET n = n + 1 WHERE id = 1"
        # Warm-up: a scratch database was just created, whose WAL is still being written out.
        warm = time.perf_counter() + min(1.0, seconds / 2)
        while time.perf_counter() < warm:
            conn.execute(update)
        commits = 0
        began = time.perf_counter()
        while (elapsed := time.perf_counter() - began) < seconds:
            conn.execute(update)
            commits += 1
    _check(settings.get("fsync") == "on" and settings.get("synchronous_commit") != "off",
           f"the server is not durable ({settings}): the probe would measure nothing")
    return {"parameters": {"seconds": seconds, "statement": update, "server": settings},
            "results": {"commits": commits, "commits_per_second": _r(commits / elapsed)},
            "ratios": {}}


# -- throughput ---------------------------------------------------------------------------------


def _task_figures(obs: Observer, since: Any = None) -> Json:
    """Latencies from the task rows (of tasks created at or after ``since``): pickup
    (ready -> running) and join dispatch."""
    rows = obs.rows("""
        SELECT step, extract(epoch FROM started_at - created_at)::float8
        FROM konduit_tasks WHERE started_at IS NOT NULL
          AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)""", {"since": since})
    pickup = [s for _, s in rows]
    joins = [s for step, s in rows if step == "join"]
    last_branch = obs.rows("""
        SELECT extract(epoch FROM j.started_at - max(b.finished_at))::float8
        FROM konduit_tasks j JOIN konduit_tasks b
          ON b.execution_id = j.execution_id AND b.step <> 'join'
        WHERE j.step = 'join' AND j.started_at IS NOT NULL
          AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s)
        GROUP BY j.id, j.started_at""", {"since": since})
    return {"pickup_latency": dist_ms(pickup),
            # The join task is created by the transaction that records the last branch:
            # created_at -> started_at is "last branch recorded -> join running".
            "join_dispatch_latency": dist_ms(joins),
            "last_branch_done_to_join_running": dist_ms([s for (s,) in last_branch])}


def throughput_run(url: str, *, executions: int, width: int = 20, processes: int = 1,
                   concurrency: int = 8, label: str = "throughput",
                   work_span: Callable[[], AbstractContextManager[Any]] | None = None,
                   warm: int = 0) -> Json:
    """``executions`` x (``width`` no-op root branches + a join) through ``processes`` worker
    processes of ``concurrency`` slots, started together once the workers are up. ``work_span``
    (a context manager factory) wraps the work alone: from the start of the executions to the
    last one finished, the workers up and idle before it (a meter of the database's cost).
    ``warm``: executions run to the end first, outside the span and the figures, as a
    long-running worker's statements are prepared and its caches full (production shape:
    PostgreSQL plans a prepared statement 5 times per connection before it keeps a plan)."""
    workflow = f"bench-roots-{width}"
    obs = Observer(url)
    try:
        with konduit.App(apps.small_workflows(), database_url=url) as app:
            app.migrate()  # registers nothing, opens the pool: the start below is warm
            before = obs.commits()
            with worker_processes(url, obs, processes, concurrency=concurrency,
                                  label=label) as workers:
                # The waits count the executions started since (a database holding a
                # large history is not counted whole every 50 ms).
                if warm:
                    warm_since = obs.now()
                    start_all(app, [{"workflow": workflow}] * warm)
                    obs.wait_finished(warm, timeout=max(120, warm * width / 20),
                                      since=warm_since)
                since = obs.now()
                cpu_before = [w.cpu_seconds() for w in workers]
                with work_span() if work_span is not None else nullcontext():
                    began = time.perf_counter()
                    used_start_many = start_all(app, [{"workflow": workflow}] * executions)
                    starting = time.perf_counter() - began
                    obs.wait_finished(executions, timeout=max(120, executions * width / 20),
                                      since=since)
                    wall = time.perf_counter() - began
                cpu = cpu_ms_per_task(cpu_before, workers, executions * (width + 1))
                for w in workers:
                    w.sample_memory()
        after = obs.commits()
        span, branches, tasks, failed = obs.rows("""
            SELECT extract(epoch FROM max(e.finished_at) - min(e.created_at))::float8,
                   count(t.id) FILTER (WHERE t.step <> 'join'), count(t.id),
                   count(DISTINCT e.id) FILTER (WHERE e.status <> 'succeeded')
            FROM konduit_executions e JOIN konduit_tasks t ON t.execution_id = e.id
            WHERE e.created_at >= %s""", (since,))[0]
        _check(failed == 0 and branches == executions * width,
               f"{failed} executions did not succeed, {branches} branch tasks ran")
        figures = _task_figures(obs, since)
    finally:
        obs.close()
    commits = commits_between(before, after)
    return {
        "executions": executions, "width": width, "processes": processes,
        "concurrency": concurrency, "start_many": used_start_many,
        "seconds": _r(span), "client_wall_seconds": _r(wall),
        "client_seconds_to_start_all": _r(starting),
        "branch_tasks_per_second": _r(branches / span), "tasks_per_second": _r(tasks / span),
        "executions_per_second": _r(executions / span),
        "committed_transactions": commits, "commits_per_task": _r(commits / tasks),
        "worker_cpu_ms_per_task": cpu,
        "worker_peak_rss_mb": peak_rss_mb(workers),
        **figures,
    }


def idle_worker_commits(url: str, seconds: float) -> Json:
    """Commits of one worker process that starts, idles ``seconds`` and stops: the fixed cost
    inside every run's count."""
    obs = Observer(url)
    try:
        before = obs.commits()
        with worker_processes(url, obs, 1):
            time.sleep(seconds)  # the idle time is what is measured, not waited on
        after = obs.commits()
    finally:
        obs.close()
    return {"idle_seconds": seconds, "committed_transactions": commits_between(before, after)}


def median_run(runs: list[Json], key: str) -> Json:
    """The run whose ``key`` is the median (the middle one of an odd count)."""
    ordered = sorted(runs, key=lambda r: float(r[key]))
    return ordered[(len(ordered) - 1) // 2]


def throughput(fresh: Callable[[], Any], *, executions: int, repeats: int,
               probe: float, idle: float = 2.0) -> Json:
    """The headline: ≥ 50 executions x 20 no-op branches + a join, one worker process
    x 8 slots, started with ``start_many``; the median of ``repeats`` runs, each in its own
    database."""
    runs = []
    for _ in range(repeats):
        with fresh() as url:
            runs.append(throughput_run(url, executions=executions))
    with fresh() as url:
        idle_run = idle_worker_commits(url, idle)
    best = median_run(runs, "branch_tasks_per_second")
    tasks = best["executions"] * (best["width"] + 1)
    net = best["committed_transactions"] - idle_run["committed_transactions"]
    return {
        "parameters": {"executions": executions, "workflow": "bench-roots-20: 20 no-op root "
                       "branches + a join", "processes": 1, "concurrency": 8, "repeats": repeats,
                       "reported": "the median run by branch tasks/s",
                       "commits": "pg_stat_database.xact_commit of the scratch database from "
                       "before the worker process started to after it and the client stopped, "
                       "less the bench's own statements"},
        "results": {**best, "idle_worker_lifecycle": idle_run,
                    "commits_per_task_less_idle_lifecycle": _r(net / tasks),
                    "runs_branch_tasks_per_second": [r["branch_tasks_per_second"] for r in runs]},
        "ratios": {"branch_tasks_per_second_over_commit_probe":
                   ratio(best["branch_tasks_per_second"], probe)},
    }


def workers_curve(fresh: Callable[[], Any], *, processes: Sequence[int], executions: int,
                  probe: float, one: Json | None = None) -> Json:
    """The throughput load through P worker processes (8 slots each) for each P; ``one`` is a
    run of the same load with P = 1 already made (the throughput benchmark's), reused."""
    curve = []
    for p in processes:
        if p == 1 and one is not None and one["executions"] == executions:
            run = one
        else:
            with fresh() as url:
                run = throughput_run(url, executions=executions, processes=p, label=f"p{p}")
        curve.append({"processes": p, "branch_tasks_per_second": run["branch_tasks_per_second"],
                      "tasks_per_second": run["tasks_per_second"],
                      "commits_per_task": run["commits_per_task"],
                      "join_dispatch_p99_ms": run["join_dispatch_latency"].get("p99_ms"),
                      "worker_peak_rss_mb": run["worker_peak_rss_mb"]})
    first = curve[0]["branch_tasks_per_second"]
    return {"parameters": {"processes": list(processes), "executions": executions,
                           "workflow": "bench-roots-20", "concurrency_each": 8,
                           "p1": "the throughput benchmark's median run, when it ran"},
            "results": {"curve": curve},
            "ratios": {**{f"p{c['processes']}_over_p{processes[0]}":
                          ratio(c["branch_tasks_per_second"], first) for c in curve[1:]},
                       **{f"p{c['processes']}_over_commit_probe":
                          ratio(c["branch_tasks_per_second"], probe) for c in curve}}}


# -- idle-worker latency ------------------------------------------------------------------------


def latency(url: str, executions: int) -> Json:
    """One execution at a time (root -> 4 branches -> join) on an idle worker process x 8
    slots: pickup (ready -> running) and join dispatch without a queue in front of them."""
    obs = Observer(url)
    try:
        with konduit.App(apps.small_workflows(), database_url=url) as app, \
                worker_processes(url, obs, 1):
            app.start("bench-latency").wait(timeout=60)  # warm-up, not measured
            since = obs.now()
            for _ in range(executions):
                app.start("bench-latency").wait(timeout=60)
        figures = _task_figures(obs, since)
    finally:
        obs.close()
    return {"parameters": {"executions": executions, "workflow": "bench-latency: root -> "
                           f"{apps.LATENCY_BRANCHES} branches -> join, one at a time",
                           "processes": 1, "concurrency": 8,
                           "wake": "LISTEN/NOTIFY (poll fallback at the worker's default)"},
            "results": figures, "ratios": {}}


# -- start --------------------------------------------------------------------------------------


def start(url: str, *, roots: int, repeats: int, many: int) -> Json:
    """Client-side time to start one ``roots``-root execution, and ``start_many`` rates."""
    one_root: list[float] = []
    with konduit.App(apps.small_workflows(), database_url=url) as app:
        app.start(f"bench-roots-{roots}")  # registers the workflow and opens the pool
        for _ in range(repeats):
            began = time.perf_counter()
            app.start(f"bench-roots-{roots}")
            one_root.append(time.perf_counter() - began)
        start_all(app, [{"workflow": "bench-one"}] * 10)  # warm-up
        began = time.perf_counter()
        used = start_all(app, [{"workflow": "bench-one"}] * many)
        one_step = time.perf_counter() - began
        began = time.perf_counter()
        start_all(app, [{"workflow": "bench-roots-20"}] * (many // 10))
        twenty = time.perf_counter() - began
    return {"parameters": {"roots": roots, "repeats": repeats, "start_many_executions": many,
                           "start_many": used,
                           "start_many_of": "bench-one (one step); bench-roots-20 (20 roots + "
                           "join) with a tenth as many"},
            "results": {f"start_{roots}_roots": dist_ms(one_root),
                        "start_many_executions_per_second": _r(many / one_step),
                        "start_many_roots_20_executions_per_second": _r((many // 10) / twenty)},
            "ratios": {}}


# -- wide joins ---------------------------------------------------------------------------------


def wide(url: str, *, widths: Sequence[int], small_repeats: int) -> Json:
    """One execution of ``w`` root branches + a join at a time, one worker process x 8 slots
    (a fresh one per width): how long until the join is done, and tasks per second against
    the narrowest."""
    results = []
    peaks: list[float] = []
    for width in widths:
        runs: list[tuple[float, float]] = []
        obs = Observer(url)
        try:
            with konduit.App(apps.wide_workflows(width), database_url=url) as app, \
                    worker_processes(url, obs, 1, app_spec=f"konduit.bench.apps:wide_app_{width}",
                                     label=f"wide{width}") as workers:
                app.migrate()
                for _ in range(small_repeats if width <= 500 else 1):
                    already = obs.finished()
                    handle = app.start(f"bench-roots-{width}")
                    obs.wait_finished(already + 1, timeout=600, interval=0.01)
                    done, seconds = obs.rows("""
                        SELECT extract(epoch FROM j.finished_at - e.created_at)::float8,
                               extract(epoch FROM e.finished_at - e.created_at)::float8
                        FROM konduit_executions e JOIN konduit_tasks j
                          ON j.execution_id = e.id AND j.step = 'join'
                        WHERE e.id = %s AND e.status = 'succeeded'""", (handle.id,))[0]
                    runs.append((done, seconds))
                for w in workers:
                    w.sample_memory()
        finally:
            obs.close()
        peaks += [p for p in [peak_rss_mb(workers)] if p is not None]
        results.append({"width": width, "runs": len(runs),
                        "join_done_after_start_s": _r(statistics.median(d for d, _ in runs)),
                        "tasks_per_second": _r((width + 1) / statistics.median(s for _, s in runs))})
    narrow = results[0]["tasks_per_second"]
    return {"parameters": {"widths": list(widths), "workflow": "bench-roots-{w}: w no-op root "
                           "branches + a join, one execution at a time (median of runs)",
                           "processes": 1, "concurrency": 8,
                           "clock": "database: the execution's created_at (start) to its join "
                           "task's finished_at"},
            "results": {"widths": results, "worker_peak_rss_mb": max(peaks) if peaks else None},
            "ratios": {f"tasks_per_second_{r['width']}_over_{widths[0]}":
                       ratio(r["tasks_per_second"], narrow) for r in results[1:]}}


# -- collisions through a real worker ------------------------------------------------------------


def collide_worker(url: str, *, trials: int) -> Json:
    """Branches of one join (or of several) released at the same instant in a worker process
    x 32 slots: the completions arrive together. Counts executions whose join never ran
    (stalls) and joins that ran twice (duplicates), and the worker's peak RSS."""
    settings = [(8, 4), (32, 1)]  # (width, executions at once): 32 branches either way
    out = []
    obs = Observer(url)
    try:
        with konduit.App(apps.small_workflows(), database_url=url) as app, \
                worker_processes(url, obs, 1, concurrency=32, label="collide") as workers:
            for width, together in settings:
                stalls = duplicates = 0
                for _ in range(trials):
                    release = time.time() + 0.5
                    handles = [app.start(f"bench-collide-{width}", {"release_at": release})
                               for _ in range(together)]
                    for h in handles:
                        try:
                            h.wait(timeout=30)
                        except (TimeoutError, konduit.ExecutionFailed):
                            stalls += 1
                    joins = obs.rows("""
                        SELECT count(DISTINCT t.id), count(a.id)
                        FROM konduit_tasks t LEFT JOIN konduit_attempts a ON a.task_id = t.id
                        WHERE t.step = 'join' AND t.execution_id = ANY(%s)
                        GROUP BY t.execution_id""", ([h.id for h in handles],))
                    stalls += together - len(joins)
                    duplicates += sum(1 for tasks, attempts in joins
                                      if tasks > 1 or attempts > 1)
                out.append({"width": width, "executions_at_once": together, "trials": trials,
                            "stalls": stalls, "duplicate_joins": duplicates})
                for w in workers:
                    w.sample_memory()
    finally:
        obs.close()
    return {"settings": out, "worker_peak_rss_mb": peak_rss_mb(workers)}


# -- backlog ------------------------------------------------------------------------------------


def backlog(url: str, *, executions: int, window: float, processes: int = 2) -> Json:
    """``executions`` x 9 tasks queued before ``processes`` worker processes start: when does
    the first execution finish, and do they then finish at a steady rate? Observed for
    ``window`` seconds after the first claim (or until all are done)."""
    obs = Observer(url)
    try:
        with konduit.App(apps.small_workflows(), database_url=url) as app:
            began = time.perf_counter()
            used = start_all(app, [{"workflow": "bench-backlog"}] * executions)
            starting = time.perf_counter() - began
        launched = obs.now()
        with worker_processes(url, obs, processes, ready=False, label="backlog") as workers:
            deadline = time.monotonic() + window + 60
            first_claim = None
            while first_claim is None:
                first_claim = obs.one("SELECT min(started_at) FROM konduit_tasks")
                _check(time.monotonic() < deadline, "no worker claimed a task")
                time.sleep(0.05)
            until = time.monotonic() + window
            while time.monotonic() < until and int(obs.one(
                    "SELECT count(*) FROM konduit_executions WHERE finished_at IS NULL")):
                time.sleep(0.1)
            for w in workers:
                w.sample_memory()
        (ready_at, first_finish, finished, tasks_done, observed) = obs.rows("""
            SELECT extract(epoch FROM %(first)s - %(launched)s)::float8,
                   extract(epoch FROM min(finished_at) - %(first)s)::float8,
                   count(finished_at),
                   (SELECT count(*) FROM konduit_tasks WHERE finished_at IS NOT NULL),
                   extract(epoch FROM max(finished_at) - %(first)s)::float8
            FROM konduit_executions""", {"first": first_claim, "launched": launched})[0]
        per_second = [int(n) for (n,) in obs.rows("""
            SELECT count(e.finished_at)
            FROM generate_series(0, %(span)s - 1) s
            LEFT JOIN konduit_executions e
              ON e.finished_at >= %(first)s + make_interval(secs => s)
             AND e.finished_at < %(first)s + make_interval(secs => s + 1)
            GROUP BY s ORDER BY s""", {"first": first_claim,
                                        "span": max(1, math.floor(observed or 0))})]
    finally:
        obs.close()
    _check(first_finish is not None, f"no execution finished within {window} s")
    # Steady: the per-second finishes after the first full second that had any.
    start_at = next((i for i, n in enumerate(per_second) if n), len(per_second))
    steady = per_second[start_at + 1:] or per_second[start_at:]
    mean = statistics.fmean(steady) if steady else 0.0
    cv = statistics.pstdev(steady) / mean if steady and mean else None
    return {"parameters": {"executions": executions, "tasks_each": 9,
                           "workflow": "bench-backlog: root -> 7 branches -> join",
                           "processes": processes, "concurrency_each": 8,
                           "window_seconds": window, "start_many": used},
            "results": {"client_seconds_to_queue": _r(starting),
                        "launch_to_first_claim_s": _r(ready_at),
                        "first_finish_after_first_claim_s": _r(first_finish),
                        "executions_finished": int(finished), "tasks_finished": int(tasks_done),
                        "finishes_per_second": per_second,
                        "steady_finishes_per_second_mean": _r(mean),
                        "steady_finishes_per_second_min": min(steady) if steady else 0,
                        "steady_coefficient_of_variation": None if cv is None else _r(cv),
                        "worker_peak_rss_mb": peak_rss_mb(workers)},
            "ratios": {}}


# -- history ------------------------------------------------------------------------------------


def fill_history(url: str, tasks: int, width: int = 20) -> float:
    """``tasks`` finished tasks (and their executions and attempts), older than anything the
    bench starts afterwards; seconds it took (with VACUUM ANALYZE)."""
    began = time.perf_counter()
    executions = tasks // width
    with psycopg.connect(url, autocommit=True) as conn:
        version = int(conn.execute("SHOW server_version_num").fetchone()[0])  # type: ignore[index]
        # Execution ids sort by creation time (UUIDv7): history gets ids from the past.
        make_id = ("uuidv7(- make_interval(secs => 86400 + g))" if version >= 180000
                   else "gen_random_uuid()")
        with conn.transaction():
            conn.execute(f"""
                INSERT INTO konduit_executions (id, workflow_name, workflow_version, status,
                    input_hash, steps_pending, output, created_at, finished_at)
                SELECT {make_id}, 'bench-roots-{width}', 1, 'succeeded', 'history', 0,
                       '{width}', now() - make_interval(secs => 86400 + g),
                       now() - make_interval(secs => 86400 + g - 1)
                FROM generate_series(1, %s) g""", (executions,))
            conn.execute(f"""
                INSERT INTO konduit_tasks (execution_id, workflow, step, status, attempt,
                    max_attempts, output_hash, created_at, started_at, finished_at, worker_id)
                SELECT e.id, 'bench-roots-{width}@1', s.step, 'succeeded', 1, 3, 'history',
                       e.created_at, e.created_at, e.finished_at, 'history'
                FROM konduit_executions e,
                     (SELECT 'b' || i AS step FROM generate_series(0, {width - 2}) i
                      UNION ALL SELECT 'join') s
                WHERE e.input_hash = 'history'""")
            conn.execute("""
                INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token,
                    started_at, finished_at, outcome)
                SELECT id, 1, 'history', gen_random_uuid(), started_at, finished_at, 'succeeded'
                FROM konduit_tasks WHERE worker_id = 'history'""")
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - began


def claim_plan(url: str, analyze: bool = False) -> list[str]:
    """EXPLAIN of the worker's claim statement as shipped (its named query); with ``analyze``,
    run once and rolled back, so nothing is claimed."""
    import re

    from konduit.db.queries import all_queries

    names = sorted(n for n in all_queries() if n.startswith("task_claim"))
    _check(bool(names), "no task_claim* query found")
    text = all_queries()[names[0]].sql
    known: Json = {"queues": ["default"], "workflows": ["bench-roots-20@1"], "limit": 8,
                   "lease_seconds": 15.0, "worker_id": "konduit-bench"}
    params = {n: known.get(n) for n in re.findall(r"%\((\w+)\)s", text)}
    explain = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " if analyze else "EXPLAIN "
    with psycopg.connect(url) as conn:  # not autocommit: rolled back below
        rows = conn.execute(explain + text, params).fetchall()
        conn.rollback()
    return [f"-- {names[0]}" + (" (run once, rolled back)" if analyze else "")] + [
        str(r[0]) for r in rows]


def history(url: str, *, tasks: int, executions: int) -> Json:
    """Throughput with ``tasks`` finished tasks in the tables against the same load on the
    same database before they were added."""
    empty = throughput_run(url, executions=executions, label="history-empty")
    filled_in = fill_history(url, tasks)
    plan = claim_plan(url)
    full = throughput_run(url, executions=executions, label="history-full")
    # The claim as a worker runs it, with 1,000 ready tasks queued beside the history.
    with konduit.App(apps.small_workflows(), database_url=url) as app:
        start_all(app, [{"workflow": "bench-roots-20"}] * 50)
    analyzed = claim_plan(url, analyze=True)
    return {"parameters": {"finished_tasks": tasks, "executions": executions,
                           "workflow": "bench-roots-20", "processes": 1, "concurrency": 8},
            "results": {"empty_branch_tasks_per_second": empty["branch_tasks_per_second"],
                        "history_branch_tasks_per_second": full["branch_tasks_per_second"],
                        "history_commits_per_task": full["commits_per_task"],
                        "seconds_to_fill": _r(filled_in), "claim_plan": plan,
                        "claim_plan_analyzed": analyzed},
            "ratios": {"history_over_empty": ratio(full["branch_tasks_per_second"],
                                                   empty["branch_tasks_per_second"])}}
