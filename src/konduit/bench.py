"""``konduit bench``: measure what the fan-in protocol costs (DESIGN.md, seed 000).

Seed 000 says the execution-row lock was never measured; these benchmarks measure it. Each one
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
from konduit.bench_harness import (
    LoopThread,
    completion_for,
    finish_join,
    leased_branches,
    opened,
    record_each,
)
from konduit.db.database import Database
from konduit.db.embedded import server_url, with_database
from konduit.db.migrate import migrate
from konduit.engine.client import ExecutionResult
from konduit.engine.completer import Completion, Recorded, record, record_ended
from konduit.engine.registry import Registry
from konduit.errors import BenchError as BenchError
from konduit.worker.executor import Claimed

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
        url = database_url or os.environ.get("KONDUIT_DATABASE_URL")
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


async def finish_together(db: Database, registry: Registry, task: Claimed,
                          barrier: threading.Barrier) -> tuple[float, float, bool]:
    """Wait for the others at the barrier, then record; (start, end, fired a join)."""
    completion = completion_for(task)
    barrier.wait(timeout=60)  # blocks this thread's own loop, so all leave it at once
    began = time.perf_counter()
    outcome, advanced = await record(db, registry, completion)
    _check(outcome is Recorded.ENDED, f"completion was {outcome.value}")
    return began, time.perf_counter(), advanced is not None and "join" in advanced.fired


def released_together(threads: list[LoopThread], registry: Registry,
                      tasks: list[Claimed]) -> tuple[float, float, int]:
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


def _span(results: list[ExecutionResult]) -> float:
    """Seconds from the first execution's start to the last one's finish (database clock)."""
    starts = [r.created_at for r in results if r.created_at is not None]
    ends = [r.finished_at for r in results if r.finished_at is not None]
    _check(len(starts) == len(ends) == len(results), "an execution has no start or finish time")
    return (max(ends) - min(starts)).total_seconds()


def throughput(url: str, executions: int, width: int = 8, concurrency: int = 16) -> Json:
    """A burst of fan-out/fan-in executions through a real worker: rates and join latencies."""
    wf = fan_in_workflow(width, final=True)
    tasks_each = width + 3
    with konduit.App([wf], database_url=url) as app, running_worker(app, concurrency):
        app.start(wf.name).wait(timeout=60)  # warm-up: the worker is up and everything loaded
        began = time.perf_counter()
        handles = [app.start(wf.name) for _ in range(executions)]
        starting = time.perf_counter() - began
        results = [h.wait(timeout=600) for h in handles]
        wall = time.perf_counter() - began
        joins = [s for h in handles for s in app.steps(h.id) if s["step"] == "join"]
    span = _span(results)
    _check(len(joins) == executions and all(j["fired_at"] is not None for j in joins),
           "a join never fired")
    waits = [(j["fired_at"] - j["first_upstream_at"]).total_seconds() for j in joins]
    dispatch = [(j["fired_at"] - j["last_upstream_at"]).total_seconds() for j in joins]
    dispatch_ms = summary_ms(dispatch)
    return {
        "parameters": {"executions": executions, "workflow": f"root -> {width} branches -> join -> final",
                       "tasks_per_execution": tasks_each, "worker_concurrency": concurrency,
                       "handlers": "async, trivial", "poll_interval_s": 0.1},
        "results": {"seconds": _r(span), "client_wall_seconds": _r(wall),
                    "client_seconds_to_start_all": _r(starting),
                    "executions_per_second": _r(executions / span),
                    "tasks_per_second": _r(executions * tasks_each / span),
                    "join_fan_in_wait": summary_ms(waits),
                    "join_dispatch_latency": dispatch_ms},
        "ratios": {"join_dispatch_p95_over_p50": ratio(dispatch_ms["p95_ms"], dispatch_ms["median_ms"])},
    }


def map_fan_out(url: str, items: int, concurrency: int = 32) -> Json:
    """One execution whose map step fans out to ``items`` tasks, through a real worker."""
    wf = map_workflow()
    with konduit.App([wf], database_url=url) as app, running_worker(app, concurrency):
        app.start(wf.name, input=1).wait(timeout=60)  # warm-up
        began = time.perf_counter()
        result = app.start(wf.name, input=items).wait(timeout=1800)
        wall = time.perf_counter() - began
    _check(result.output == items, f"the map's join saw {result.output} items, not {items}")
    seconds = _span([result])
    return {
        "parameters": {"items": items, "workflow": "source -> map(items) -> total",
                       "worker_concurrency": concurrency, "handlers": "async, trivial"},
        "results": {"seconds": _r(seconds), "client_wall_seconds": _r(wall),
                    "tasks_per_second": _r((items + 2) / seconds)},
        "ratios": {},
    }


# -- the whole run ------------------------------------------------------------------------------


def run_bench(database_url: str | None = None, *, quick: bool = False,
              progress: Callable[[str], None] = lambda _: None) -> Json:
    """Run every benchmark, each in its own fresh database; returns the JSON report."""
    server = Server(database_url)
    plan: list[tuple[str, Callable[[str], Json]]] = [
        ("fan_in_cost_by_width",
         lambda u: asyncio.run(fan_in_cost_by_width(u, [10, 100] if quick else [10, 100, 1000]))),
        ("simultaneous_finish", lambda u: simultaneous_finish(u, 50, 3 if quick else 10)),
        ("batching", lambda u: asyncio.run(batching(u, 200, 2 if quick else 5))),
        ("throughput", lambda u: throughput(u, 20 if quick else 100)),
        ("map_10k", lambda u: map_fan_out(u, 1_000 if quick else 10_000)),
    ]
    report: Json = {"started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "quick": quick, "machine": server.describe(), "benchmarks": {}}
    began = time.perf_counter()
    for name, bench in plan:
        progress(f"bench: {name} ...")
        step_began = time.perf_counter()
        with server.fresh_database() as url:
            report["benchmarks"][name] = bench(url)
        report["benchmarks"][name]["seconds"] = _r(time.perf_counter() - step_began)
    report["total_seconds"] = _r(time.perf_counter() - began)
    report["summary"] = headline(report["benchmarks"])
    return report


def headline(b: Json) -> Json:
    """The numbers to read first."""
    fan_in = b["fan_in_cost_by_width"]
    tput = b["throughput"]["results"]
    return {
        "fan_in_cost_widest_over_narrowest": next(
            v for k, v in fan_in["ratios"].items() if k.startswith("median_")),
        "simultaneous_over_sequential": b["simultaneous_finish"]["ratios"]["concurrent_over_sequential"],
        "batching_speedup": b["batching"]["ratios"]["speedup"],
        "executions_per_second": tput["executions_per_second"],
        "tasks_per_second": tput["tasks_per_second"],
        "join_dispatch_p95_ms": tput["join_dispatch_latency"]["p95_ms"],
        "map_tasks_per_second": b["map_10k"]["results"]["tasks_per_second"],
    }
