"""``konduit bench``: measure what the fan-in protocol costs.

The execution-row lock is the price of an exactly-once join; these benchmarks measure it. Each one
runs in its own fresh database (created, migrated and dropped here) on the embedded server or on
the server of ``--database-url``, so user data is never touched. Machines are noisy: compare the
ratios, which are taken within one run, rather than absolute numbers across machines.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg import sql

import konduit
from konduit.bench import dbcost, fair, fleet, idle, maps, prune, search, shapes
from konduit.bench.harness import (
    LoopThread,
    completion_for,
    finish_join,
    leased_branches,
    opened,
    record_each,
)
from konduit.bench.history_load import history_load
from konduit.bench.soak import SoakSettings
from konduit.bench.soak import soak as run_soak
from konduit.core.model import Completion, Recorded, TaskAttempt
from konduit.db.database import Database
from konduit.db.embedded import server_url, with_database
from konduit.db.migrate import migrate
from konduit.engine.completer import record, record_ended
from konduit.engine.registry import Registry
from konduit.errors import BenchError as BenchError
from konduit.settings import settings, variable

T = TypeVar("T")
Json = dict[str, Any]


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise BenchError(f"bench: {message}")


# -- statistics ---------------------------------------------------------------------------------


def _r(value: float) -> float:
    return round(value, 3)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def summary_ms(seconds: list[float]) -> Json:
    """Distribution of durations given in seconds, reported in milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "median_ms": _r(statistics.median(ms)), "p95_ms": _r(_p95(ms)),
            "mean_ms": _r(statistics.fmean(ms)), "min_ms": _r(min(ms)), "max_ms": _r(max(ms))}


def median_ms(seconds: list[float]) -> float:
    return _r(statistics.median(seconds) * 1000)


def each_ms(seconds: list[float]) -> list[float]:
    return [_r(s * 1000) for s in seconds]


def ratio(numerator: float, denominator: float) -> float | None:
    return _r(numerator / denominator) if denominator > 0 else None


# -- workflows ----------------------------------------------------------------------------------


def _returning(value: int) -> Callable[[konduit.Context], Coroutine[Any, Any, int]]:
    """A fresh trivial handler (a function can back only one step)."""

    async def handler(ctx: konduit.Context) -> int:
        return value

    return handler


def fan_in_workflow(width: int, *, final: bool = False) -> konduit.Workflow:
    """root -> b0..b{width-1} -> join (-> final)."""
    wf = konduit.Workflow(f"bench-fan-in-{width}" + ("-final" if final else ""), version=1)
    root = wf.step(name="root")(_returning(0))
    branches = [wf.step(name=f"b{i}", after=[root])(_returning(1)) for i in range(width)]
    join = wf.step(name="join", after=branches)(_returning(width))
    if final:
        wf.step(name="final", after=[join])(_returning(0))
    return wf


def map_workflow() -> konduit.Workflow:
    """source -> map over range(input) -> total."""
    wf = konduit.Workflow("bench-map", version=1)

    @wf.step()
    async def source(ctx: konduit.Context) -> int:
        return int(ctx.input)

    @wf.map(after=[source], over=range)
    async def item(ctx: konduit.Context) -> int:
        return int(ctx.item)

    @wf.step(after=[item])
    async def total(ctx: konduit.Context) -> int:
        return len(ctx.upstream["item"])

    return wf


# -- databases ----------------------------------------------------------------------------------


class Server:
    """The PostgreSQL server the benchmarks create their databases on."""

    def __init__(self, database_url: str | None):
        url = database_url or settings().database_url
        self.embedded = not url
        # Only used to create and drop the benchmark databases.
        self.admin_url = url or server_url("postgres")
        self._numbers = itertools.count()

    def describe(self) -> Json:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('server_version'),"
                               " current_setting('max_connections')").fetchone()
        if row is None:
            raise BenchError("bench: the server did not report its version")
        return {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                "platform": platform.platform(), "konduit": konduit.__version__,
                "postgres": row[0], "postgres_max_connections": int(row[1]),
                "embedded": self.embedded}

    @contextmanager
    def fresh_database(self) -> Iterator[str]:
        """A new migrated database for one benchmark, dropped afterwards."""
        name = f"konduit_bench_{os.getpid()}_{next(self._numbers)}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            url = with_database(self.admin_url, name)
            asyncio.run(_migrate(url))
            yield url
        finally:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                             .format(sql.Identifier(name)))


    @contextmanager
    def copy_of(self, url: str) -> Iterator[str]:
        """A copy of the database of ``url`` (no session may be connected to it), dropped
        afterwards: a file copy of a filled database, quicker than filling another."""
        name = f"konduit_bench_{os.getpid()}_{next(self._numbers)}"
        source = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            version = int(conn.execute("SHOW server_version_num").fetchone()[0])  # type: ignore[index]
            # FILE_COPY (PostgreSQL 15+; before, the only way): a checkpoint and a copy of the
            # files, not every block through the WAL.
            strategy = sql.SQL(" STRATEGY FILE_COPY") if version >= 150000 else sql.SQL("")
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}{}").format(
                sql.Identifier(name), sql.Identifier(str(source)), strategy))
        try:
            yield with_database(self.admin_url, name)
        finally:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                             .format(sql.Identifier(name)))


async def _migrate(url: str) -> None:
    async with opened(url, 1) as db:
        await migrate(db)


# -- 1. fan-in cost by width --------------------------------------------------------------------


async def fan_in_cost_by_width(url: str, widths: list[int], widest_executions: int = 3) -> Json:
    """Time each un-batched completion of joins of several widths (O(1): flat in width).

    The widths take turns, one completion each, so that the machine's noise hits them alike;
    a width whose join fired starts its next execution, until the widest has run
    ``widest_executions`` times."""
    workflows = {w: fan_in_workflow(w) for w in widths}
    registry = Registry(workflows.values())
    pending: dict[int, list[Completion]] = {w: [] for w in widths}
    took: dict[int, dict[str, list[float]]] = {
        w: {"all": [], "first_tenth": [], "last_tenth": [], "final": []} for w in widths}
    async with opened(url, 2) as db:
        for _ in range(widest_executions * max(widths)):
            for width in widths:
                if not pending[width]:
                    branches = await leased_branches(db, registry, workflows[width].name, width)
                    pending[width] = [completion_for(b) for b in branches]
                position = width - len(pending[width])  # 0 for the first branch to finish
                completion = pending[width].pop(0)
                began = time.perf_counter()
                outcome, advanced = await record(db, registry, completion)
                seconds = time.perf_counter() - began
                fired = advanced is not None and "join" in advanced.fired
                _check(outcome is Recorded.ENDED and fired == (not pending[width]),
                       f"width {width}: the join did not fire exactly once, at the last branch")
                tenth = max(1, (width - 1) // 10)
                kinds = ["final"] if fired else ["all"] + (
                    ["first_tenth"] if position < tenth else []) + (
                    ["last_tenth"] if position >= width - 1 - tenth else [])
                for kind in kinds:
                    took[width][kind].append(seconds)
                if fired:
                    await finish_join(db, registry)
    per_width: dict[int, Json] = {
        w: {"width": w, "executions": len(took[w]["final"]),
            "per_completion": summary_ms(took[w]["all"]),
            "final_completion": summary_ms(took[w]["final"]),
            "first_tenth_median_ms": median_ms(took[w]["first_tenth"]),
            "last_tenth_median_ms": median_ms(took[w]["last_tenth"])}
        for w in widths}
    low, high = per_width[min(widths)], per_width[max(widths)]
    tag = f"{max(widths)}_over_{min(widths)}"
    ratios = {f"{label}_{tag}": ratio(high[part][stat], low[part][stat])
              for label, part, stat in (("median", "per_completion", "median_ms"),
                                        ("p95", "per_completion", "p95_ms"),
                                        ("final_median", "final_completion", "median_ms"))}
    # Does a completion get dearer as more of its siblings have finished? (O(1): no.)
    ratios[f"last_over_first_tenth_{max(widths)}"] = ratio(high["last_tenth_median_ms"],
                                                           high["first_tenth_median_ms"])
    return {
        "parameters": {"widths": widths, "executions_of_widest": widest_executions,
                       "path": "record() per completion, sequential, one connection, "
                               "the widths taking turns"},
        "results": list(per_width.values()),
        "ratios": ratios,
    }


# -- 2. simultaneous finish ---------------------------------------------------------------------


async def finish_together(db: Database, registry: Registry, task: TaskAttempt,
                          barrier: threading.Barrier) -> tuple[float, float, bool]:
    """Wait for the others at the barrier, then record; (start, end, fired a join)."""
    completion = completion_for(task)
    barrier.wait(timeout=60)  # blocks this thread's own loop, so all leave it at once
    began = time.perf_counter()
    outcome, advanced = await record(db, registry, completion)
    _check(outcome is Recorded.ENDED, f"completion was {outcome.value}")
    return began, time.perf_counter(), advanced is not None and "join" in advanced.fired


def released_together(threads: list[LoopThread], registry: Registry,
                      tasks: list[TaskAttempt]) -> tuple[float, float, int]:
    """Record ``tasks`` from their own threads at once: (wall seconds from the release to the
    last commit, seconds of the slowest completion, how many of them fired a join)."""
    barrier = threading.Barrier(len(tasks))
    futures = [t.submit(finish_together(t.db, registry, task, barrier))
               for t, task in zip(threads, tasks, strict=True)]
    spans = [f.result(timeout=120) for f in futures]
    return (max(e for _, e, _ in spans) - min(b for b, _, _ in spans),
            max(e - b for b, e, _ in spans), sum(fired for _, _, fired in spans))


def simultaneous_finish(url: str, width: int, trials: int) -> Json:
    """All branches of one join finishing at once (serialized on the execution lock) vs one
    by one; the control releases as many completions of *different* executions at once, so
    the machine's own concurrency overhead is separated from the lock's."""
    wf, pair = fan_in_workflow(width), fan_in_workflow(2)
    registry = Registry([wf, pair])
    threads: list[LoopThread] = []
    times: dict[str, list[float]] = {
        k: [] for k in ("concurrent_wall", "concurrent_slowest_completion",
                        "independent_concurrent_wall", "sequential_wall")}
    try:
        for _ in range(width):
            threads.append(LoopThread(url))
        main = threads[0]
        for _ in range(trials):
            branches = main.run(leased_branches(main.db, registry, wf.name, width))
            wall, slowest, fired = released_together(threads, registry, branches)
            _check(fired == 1, f"the join fired {fired} times, not once")
            times["concurrent_wall"].append(wall)
            times["concurrent_slowest_completion"].append(slowest)
            main.run(finish_join(main.db, registry))

            # Control: the first branch of each of `width` executions (left unfinished after).
            firsts = [main.run(leased_branches(main.db, registry, pair.name, 2))[0]
                      for _ in range(width)]
            wall, _, fired = released_together(threads, registry, firsts)
            _check(fired == 0, "a half-finished join fired")
            times["independent_concurrent_wall"].append(wall)

            branches = main.run(leased_branches(main.db, registry, wf.name, width))
            times["sequential_wall"].append(sum(main.run(record_each(main.db, registry, branches))))
            main.run(finish_join(main.db, registry))
    finally:
        for t in threads:
            t.close()
    shared, independent, sequential = (
        median_ms(times[k]) for k in ("concurrent_wall", "independent_concurrent_wall", "sequential_wall"))
    return {
        "parameters": {
            "width": width, "trials": trials,
            "concurrent": f"{width} sibling completions from {width} threads (a connection "
                          "each) released by a barrier",
            "independent": f"{width} completions of {width} different executions, released alike",
            "sequential": "the same sibling completions recorded one by one on one connection"},
        "results": {
            "concurrent_wall_ms": shared, "independent_concurrent_wall_ms": independent,
            "sequential_wall_ms": sequential,
            "concurrent_slowest_completion_ms": median_ms(times["concurrent_slowest_completion"]),
            "sequential_per_completion_ms": _r(sequential / width),
            "raw": {f"{k}_ms": each_ms(v) for k, v in times.items()},
        },
        "ratios": {"concurrent_over_sequential": ratio(shared, sequential),
                   "independent_over_sequential": ratio(independent, sequential),
                   "lock_cost_concurrent_over_independent": ratio(shared, independent)},
    }


# -- 3. batching --------------------------------------------------------------------------------


async def batching(url: str, size: int, trials: int) -> Json:
    """One execution's completions as one ``record_ended`` batch vs as single ``record`` calls."""
    wf = fan_in_workflow(size)
    registry = Registry([wf])
    batched: list[float] = []
    single: list[float] = []
    async with opened(url, 2) as db:
        for _ in range(trials):
            completions = [completion_for(t)
                           for t in await leased_branches(db, registry, wf.name, size)]
            began = time.perf_counter()
            results = await record_ended(db, registry, completions)
            batched.append(time.perf_counter() - began)
            _check(all(r is Recorded.ENDED for r, _ in results), "a batched completion was refused")
            await finish_join(db, registry)

            single.append(sum(await record_each(
                db, registry, await leased_branches(db, registry, wf.name, size))))
            await finish_join(db, registry)
    batched_ms, single_ms = median_ms(batched), median_ms(single)
    return {
        "parameters": {"completions": size, "trials": trials,
                       "batched": "one record_ended() call", "single": f"{size} record() calls"},
        "results": {"batched_total_ms": _r(batched_ms), "single_total_ms": _r(single_ms),
                    "batched_per_completion_ms": _r(batched_ms / size),
                    "single_per_completion_ms": _r(single_ms / size),
                    "raw": {"batched_total_ms": each_ms(batched), "single_total_ms": each_ms(single)}},
        "ratios": {"speedup": ratio(single_ms, batched_ms)},
    }


# -- 4 and 5: end to end with a real worker -----------------------------------------------------


@contextmanager
def running_worker(app: konduit.App, concurrency: int) -> Iterator[None]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            app.run_worker(concurrency=concurrency, stop_event=stop, poll_interval=0.1,
                           shutdown_grace=2.0)
        except BaseException as exc:  # re-raised below, on the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True, name="konduit-bench-worker")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
    if errors:
        raise errors[0]


def map_fan_out(url: str, items: int, concurrency: int = 32) -> Json:
    """One execution whose map step fans out to ``items`` tasks, through a real worker."""
    wf = map_workflow()
    with konduit.App([wf], database_url=url) as app, running_worker(app, concurrency):
        app.start(wf.name, input=1).wait(timeout=60)  # warm-up
        began = time.perf_counter()
        result = app.start(wf.name, input=items).wait(timeout=1800)
        wall = time.perf_counter() - began
    _check(result.output == items, f"the map's join saw {result.output} items, not {items}")
    _check(result.created_at is not None and result.finished_at is not None,
           "the execution has no start or finish time")
    assert result.created_at is not None and result.finished_at is not None
    seconds = (result.finished_at - result.created_at).total_seconds()
    return {
        "parameters": {"items": items, "workflow": "source -> map(items) -> total",
                       "worker_concurrency": concurrency, "handlers": "async, trivial"},
        "results": {"seconds": _r(seconds), "client_wall_seconds": _r(wall),
                    "tasks_per_second": _r((items + 2) / seconds)},
        "ratios": {},
    }


# -- collisions ----------------------------------------------------------------------------------


def collide(url: str, widths: list[int], trials: int, worker_trials: int) -> Json:
    """All branches of a join finishing at the same instant: through the completer directly
    (a thread and a connection per branch, released by a barrier) at several widths, and
    through a real worker process. Counts stalls (the join never fired) and duplicate joins
    (it fired twice) instead of stopping at the first, so every setting reports both."""
    settings = []
    threads: list[LoopThread] = []
    try:
        for _ in range(max(widths)):
            threads.append(LoopThread(url))
        main = threads[0]
        for width in widths:
            wf = fan_in_workflow(width)
            registry = Registry([wf])
            stalls = duplicates = 0
            for _ in range(trials):
                branches = main.run(leased_branches(main.db, registry, wf.name, width))
                _, _, fired = released_together(threads[:width], registry, branches)
                stalls += fired == 0
                duplicates += fired > 1
                if fired == 1:
                    main.run(finish_join(main.db, registry))
            settings.append({"width": width, "trials": trials, "stalls": stalls,
                             "duplicate_joins": duplicates})
    finally:
        for t in threads:
            t.close()
    worker = fleet.collide_worker(url, trials=worker_trials)
    every = settings + worker["settings"]
    return {
        "parameters": {"completer": f"widths {widths}: every branch's completion from its own "
                                    "thread and connection, released by a barrier",
                       "worker": "one worker process x 32 slots; the branches sleep until one "
                                 "shared instant (8 wide x 4 executions, 32 wide x 1)"},
        "results": {"completer": settings, "worker": worker["settings"],
                    "stalls": sum(s["stalls"] for s in every),
                    "duplicate_joins": sum(s["duplicate_joins"] for s in every),
                    "worker_peak_rss_mb": worker["worker_peak_rss_mb"]},
        "ratios": {},
    }


# -- the whole run ------------------------------------------------------------------------------

BENCHMARKS = ("commit_probe", "throughput", "db_cost", "workers", "latency", "start", "wide",
              "collide", "backlog", "history", "fan_in_cost_by_width", "simultaneous_finish",
              "batching", "map_10k", "fair_share", "wide_map", "search", "shapes", "idle_fleet",
              "prune_day", "map_1m", "fan_out_1m", "history_load", "search_history", "soak")
"""Every benchmark, in the order they run (``history``, ``idle_fleet`` and ``prune_day`` only in
a full run; ``map_1m``, ``fan_out_1m``, ``history_load``, ``search_history`` and ``soak``,
minutes each, only when named with ``--only``)."""

CODECS = ("none", "zlib", "encrypted", "aesgcm")
"""What ``konduit bench --codec`` takes: the values of ``KONDUIT_CODEC``."""


def use_codec(kind: str) -> str | None:
    """Make ``kind`` (one of :data:`CODECS`) the payload codec of this process and of the worker
    processes it starts, which inherit its environment: ``KONDUIT_CODEC``, and for an encrypting
    codec without ``KONDUIT_CODEC_KEYS`` a key made for this run. The codec's name, or None."""
    import base64

    chosen = kind.strip().lower()
    if chosen not in CODECS:
        raise BenchError(f"bench: --codec {kind!r}: one of {', '.join(CODECS)}")
    os.environ[variable("codec")] = chosen
    if chosen in ("encrypted", "aesgcm") and not settings().codec_keys:
        os.environ[variable("codec_keys")] = "bench:" + base64.b64encode(os.urandom(32)).decode()
    return codec_name()


WITHOUT_CODEC = {
    "commit_probe": "no payloads: plain commits",
    "search": "its million executions are written plain by SQL, and a search by input is "
              "refused under a codec: it searches without one",
    "search_history": "its million executions are written plain by SQL, and a search by "
                      "input is refused under a codec: it searches without one",
    "history": "the finished history is written plain by SQL; what it then runs is sealed",
    "prune_day": "the day it prunes is written plain by SQL (a prune reads no payload)",
    "history_load": "the finished history is written plain by SQL; what it then runs is sealed",
}
"""Benchmarks whose payloads do not go through ``konduit bench --codec``'s codec, and why: the
report says so beside their results (``payload_codec`` null, ``payload_codec_note``). Every
other benchmark's processes, in-process Apps and completions seal theirs."""


def codec_name() -> str | None:
    """The name of the payload codec the environment configures (None without one)."""
    from konduit import codecs

    codec = codecs.from_settings()
    return None if codec is None else str(codec.name)


FULL_ONLY = ("history", "idle_fleet", "prune_day")
"""Benchmarks left out of a quick run."""

ON_REQUEST = ("map_1m", "fan_out_1m", "history_load", "search_history", "soak")
"""Benchmarks that run only when named (``--only soak``): 30 minutes is no part of a full run."""


def run_bench(database_url: str | None = None, *, quick: bool = False,
              workers: list[int] | None = None, only: list[str] | None = None,
              soak: SoakSettings | None = None, history_executions: int = 1_000_000,
              prune_executions: int = 100_000,
              progress: Callable[[str], None] = lambda _: None) -> Json:
    """Run the benchmarks (``only`` some of them), each in its own fresh database; returns the
    JSON report. ``workers`` is the process counts of the ``workers`` curve; ``soak`` the
    settings of the soak (when ``only`` names it); ``history_executions`` the finished
    executions of ``history_load``'s history, ``prune_executions`` those of ``prune_day``'s
    day."""
    server = Server(database_url)
    unknown = sorted(set(only or ()) - set(BENCHMARKS))
    if unknown:
        raise BenchError(f"bench: no benchmark named {', '.join(unknown)} "
                         f"(there are {', '.join(BENCHMARKS)})")
    curve = workers or ([1, 2] if quick else [1, 2, 4])
    executions = 50 if quick else 200
    report: Json = {"started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "quick": quick, "machine": server.describe(),
                    # The processes the benchmarks start (workers, Apps) take it from the
                    # environment: KONDUIT_CODEC..., or konduit bench --codec.
                    "payload_codec": codec_name(), "benchmarks": {}}

    def probe() -> float:
        found = report["benchmarks"].get("commit_probe")
        return float(found["results"]["commits_per_second"]) if found else 0.0

    def in_fresh(bench: Callable[[str], Json]) -> Callable[[], Json]:
        def go() -> Json:
            with server.fresh_database() as url:
                return bench(url)
        return go

    plan: list[tuple[str, Callable[[], Json]]] = [
        ("commit_probe", in_fresh(lambda u: fleet.commit_probe(u, 1.0 if quick else 3.0))),
        ("throughput", lambda: fleet.throughput(
            server.fresh_database, executions=executions, repeats=1 if quick else 3,
            probe=probe(), idle=1.0 if quick else 3.0)),
        ("db_cost", lambda: dbcost.db_cost(
            server.fresh_database, executions=20 if quick else 50, repeats=1 if quick else 3,
            warm=10 if quick else 30)),
        ("workers", lambda: fleet.workers_curve(
            server.fresh_database, processes=curve, executions=executions, probe=probe(),
            one=_get(report, "benchmarks", "throughput", "results"))),
        ("latency", in_fresh(lambda u: fleet.latency(u, 10 if quick else 50))),
        ("start", in_fresh(lambda u: fleet.start(
            u, roots=500, repeats=3 if quick else 10, many=200 if quick else 5_000))),
        ("wide", in_fresh(lambda u: fleet.wide(
            u, widths=[10, 200] if quick else [10, 500, 10_000],
            small_repeats=2 if quick else 5))),
        ("collide", in_fresh(lambda u: collide(u, [2, 8, 50], 2 if quick else 10,
                                               1 if quick else 5))),
        ("backlog", in_fresh(lambda u: fleet.backlog(
            u, executions=300 if quick else 10_000, window=3.0 if quick else 60.0))),
        ("history", in_fresh(lambda u: fleet.history(
            u, tasks=1_000_000, executions=executions))),
        ("fan_in_cost_by_width", in_fresh(lambda u: asyncio.run(fan_in_cost_by_width(
            u, [10, 100] if quick else [10, 100, 1000], 2 if quick else 3)))),
        ("simultaneous_finish", in_fresh(lambda u: simultaneous_finish(u, 50, 2 if quick else 10))),
        ("batching", in_fresh(lambda u: asyncio.run(batching(u, 200, 2 if quick else 5)))),
        ("map_10k", in_fresh(lambda u: map_fan_out(u, 1_000 if quick else 10_000))),
        ("fair_share", lambda: fair.fair_share(
            server.fresh_database, map_items=20_000 if quick else 1_000_000,
            batch=5_000 if quick else 100_000, keyed_backlog=3_000 if quick else 10_000,
            keyed_lone=10 if quick else 20)),
        ("wide_map", lambda: maps.wide_map(
            server.fresh_database, items=2_000 if quick else 100_000, executions=executions)),
        ("search", in_fresh(lambda u: search.search(
            u, executions=20_000 if quick else 1_000_000, repeats=10 if quick else 200))),
        ("shapes", lambda: shapes.shapes(
            server.fresh_database, executions=10 if quick else executions,
            map_items=200 if quick else 20_000)),
        ("idle_fleet", lambda: idle.idle_cost(server.fresh_database, fleet=10, window=15.0)),
        ("prune_day", in_fresh(lambda u: prune.prune_day(u, executions=prune_executions))),
        ("map_1m", lambda: maps.wide_map(
            server.fresh_database, items=1_000_000, executions=executions)),
        ("fan_out_1m", in_fresh(lambda u: maps.fan_out_run(u, 1_000_000))),
        ("history_load", lambda: history_load(
            server.fresh_database, server.copy_of, history=history_executions,
            executions=50, repeats=3 if quick else 5, progress=progress)),
        ("search_history", in_fresh(lambda u: search.search(
            u, executions=20_000 if quick else 1_000_000, repeats=10 if quick else 200,
            history_fraction=0.5))),
        ("soak", in_fresh(lambda u: run_soak(u, soak, progress=progress))),
    ]
    began = time.perf_counter()
    for name, bench in plan:
        if (only and name not in only) or (not only and (
                name in ON_REQUEST or (quick and name in FULL_ONLY))):
            continue
        progress(f"bench: {name} ...")
        step_began = time.perf_counter()
        report["benchmarks"][name] = bench()
        report["benchmarks"][name]["seconds"] = _r(time.perf_counter() - step_began)
        if report["payload_codec"] is not None:
            codec = None if name in WITHOUT_CODEC else report["payload_codec"]
            report["benchmarks"][name]["payload_codec"] = codec
            if codec is None:
                report["benchmarks"][name]["payload_codec_note"] = WITHOUT_CODEC[name]
    if "commit_probe" in report["benchmarks"]:
        # The storage may drift during a long run: probe again at the end, report both.
        with server.fresh_database() as url:
            again = fleet.commit_probe(url, 1.0 if quick else 3.0)["results"]
        report["benchmarks"]["commit_probe"]["results"]["commits_per_second_at_end"] = \
            again["commits_per_second"]
    report["total_seconds"] = _r(time.perf_counter() - began)
    report["summary"] = headline(report["benchmarks"])
    return report


def _get(b: Json, *path: str | int) -> Any:
    """``b[path0][path1]...``, or None where a part is missing."""
    value: Any = b
    for part in path:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def _width(b: Json, width: int, key: str) -> Any:
    return next((w[key] for w in _get(b, "wide", "results", "widths") or []
                 if w["width"] == width), None)


def headline(b: Json) -> Json:
    """The numbers to read first, each beside its issue-8 target, and the ratios to the
    commit probe."""
    probe = _get(b, "commit_probe", "results", "commits_per_second")
    tput = _get(b, "throughput", "results") or {}
    widths = [w["width"] for w in _get(b, "wide", "results", "widths") or []]
    widest = max(widths) if widths else None

    def target(value: Any, limit: float, at_least: bool) -> Json:
        met = None if value is None else (value >= limit if at_least else value <= limit)
        return {"value": value, "target": f"{'>=' if at_least else '<='} {limit}", "met": met}

    backlog = _get(b, "backlog", "results") or {}
    targets = {
        "throughput_branch_tasks_per_second": target(tput.get("branch_tasks_per_second"),
                                                     2000, True),
        "throughput_over_commit_probe": target(
            _get(b, "throughput", "ratios", "branch_tasks_per_second_over_commit_probe"), 1.5, True),
        "commits_per_task": target(tput.get("commits_per_task"), 0.3, False),
        "start_500_roots_ms": target(_get(b, "start", "results", "start_500_roots", "p50_ms"),
                                     10, False),
        "start_many_executions_per_second": target(
            _get(b, "start", "results", "start_many_executions_per_second"), 5000, True),
        "wide_500_join_done_s": target(_width(b, 500, "join_done_after_start_s"), 0.4, False),
        f"wide_{widest}_over_10_tasks_per_second": target(
            _get(b, "wide", "ratios", f"tasks_per_second_{widest}_over_10"), 0.5, True),
        "idle_join_dispatch_p99_ms": target(
            _get(b, "latency", "results", "join_dispatch_latency", "p99_ms"), 10, False),
        "idle_pickup_p50_ms": target(_get(b, "latency", "results", "pickup_latency", "p50_ms"),
                                     5, False),
        # What the database pays per branch task, beside the bare fan-in protocol.
        "db_cost_wal_per_task_over_bare": target(
            _get(b, "db_cost", "ratios", "wal_per_task_over_bare"), 1.5, False),
        "db_cost_server_cpu_per_task_over_bare": target(
            _get(b, "db_cost", "ratios", "server_cpu_per_task_over_bare"), 1.0, False),
        "collide_stalls": target(_get(b, "collide", "results", "stalls"), 0, False),
        "collide_duplicate_joins": target(_get(b, "collide", "results", "duplicate_joins"), 0,
                                          False),
        "worker_peak_rss_mb": target(max((v for v in (
            _get(b, k, "results", "worker_peak_rss_mb") for k in ("throughput", "collide",
                                                                   "wide", "backlog"))
            if v is not None), default=None), 200, False),
        "backlog_first_finish_s": target(backlog.get("first_finish_after_first_claim_s"), 2,
                                         False),
        "fair_share_lone_worst_ms": target(
            _get(b, "fair_share", "results", "lone_worst_ms"), 2000, False),
        # One customer's 10,000 executions waiting: another customer's finishes within 2 s.
        "fair_keys_customer_b_worst_ms": target(
            _get(b, "fair_share", "results", "customer_b_worst_ms"), 2000, False),
        # The search target: a tag or key search among 1,000,000 executions under 100 ms at p95.
        "search_tag_p95_ms": target(
            _get(b, "search", "results", "searches", "tag", "p95_ms"), 100, False),
        "search_key_p95_ms": target(
            _get(b, "search", "results", "searches", "key", "p95_ms"), 100, False),
        "search_worst_p95_ms": target(_get(b, "search", "ratios", "worst_p95_ms"), 100, False),
        "history_over_empty": target(_get(b, "history", "ratios", "history_over_empty"), 0.8,
                                     True),
        # Branch tasks/s by worker shape, map items/s beside them, CPU per task.
        "shapes_1x8_branch_tasks_per_second": target(
            _get(b, "shapes", "results", "runs", 0, "branch_tasks_per_second"), 1500, True),
        "shapes_peak_branch_tasks_per_second": target(
            _get(b, "shapes", "results", "peak_branch_tasks_per_second"), 2000, True),
        "shapes_map_items_over_1x8_branches": target(
            _get(b, "shapes", "ratios", "map_items_over_one_by_eight_branches"), 1.0, True),
        "shapes_1x8_cpu_ms_per_task": target(
            _get(b, "shapes", "results", "runs", 0, "cpu_ms_per_task"), 0.4, False),
        # The soak's last minutes against its first (no worse than 10 %).
        "soak_tasks_per_second_last_over_first": target(
            _get(b, "soak", "ratios", "tasks_per_second_last_over_first"), 0.9, True),
        "soak_join_dispatch_p99_last_over_first": target(
            _get(b, "soak", "ratios", "join_dispatch_p99_last_over_first"), 1.1, False),
        "soak_worker_rss_last_over_first": target(
            _get(b, "soak", "ratios", "worker_rss_last_over_first"), 1.1, False),
    }
    over_probe = {
        "throughput_branch_tasks": ratio(tput.get("branch_tasks_per_second") or 0, probe or 0),
        "start_many_executions": ratio(
            _get(b, "start", "results", "start_many_executions_per_second") or 0, probe or 0),
        **{f"workers_p{c['processes']}_branch_tasks": ratio(c["branch_tasks_per_second"],
                                                             probe or 0)
           for c in _get(b, "workers", "results", "curve") or []},
        **{f"wide_{w}_tasks": ratio(_width(b, w, "tasks_per_second") or 0, probe or 0)
           for w in widths},
        "backlog_steady_tasks": ratio(9 * (backlog.get("steady_finishes_per_second_mean") or 0),
                                      probe or 0),
    }
    return {"commit_probe_commits_per_second": probe,
            "targets": {k: v for k, v in targets.items() if v["value"] is not None},
            "ratios_to_commit_probe": {k: v for k, v in over_probe.items() if v is not None}}
