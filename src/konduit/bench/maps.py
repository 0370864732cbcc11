"""Wide maps at production shape: a warm worker process, a map of 100,000 or 1,000,000 items and
the join that reads them all (``konduit bench --only wide_map``, ``--only map_1m``).

The worker first runs small maps, so its statements are prepared while the tables are tiny (the
shape that once made a 10,000-item join take minutes), then the wide one. Measured: the map's
items per second beside the static branches per second of a throughput run in the same
benchmark (the target: map items at least as fast), the join's own duration and its dispatch
(last item finished -> join claimed), and the worker's peak memory while it reads the items."""

from __future__ import annotations

import threading
import time
from typing import Any

import konduit
from konduit.bench.apps import one_workflow, wide_map_workflow
from konduit.bench.fair import lone_seconds
from konduit.bench.fleet import (
    Json,
    Observer,
    _check,
    _r,
    cpu_ms_per_task,
    dist_ms,
    peak_rss_mb,
    ratio,
    throughput_run,
    worker_processes,
)

APP_SPEC = "konduit.bench.apps:wide_map_app"
WORKFLOW = "bench-wide-map"
LONE = 10
"""One-step executions started a second apart while the map runs (their start -> finish)."""


def wide_map_run(url: str, items: int, *, warm: int = 8, concurrency: int = 8) -> Json:
    obs = Observer(url)
    try:
        with konduit.App([wide_map_workflow(), one_workflow()], database_url=url) as app, \
                worker_processes(url, obs, 1, concurrency=concurrency, app_spec=APP_SPEC,
                                 label="wide-map") as workers:
            for _ in range(warm):
                app.start(WORKFLOW, input=5).wait(timeout=120)
            stop = threading.Event()

            def sample() -> None:  # VmHWM is the peak; sampled so a dead process still reports
                while not stop.wait(1.0):
                    for w in workers:
                        w.sample_memory()

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            cpu_before = [w.cpu_seconds() for w in workers]
            began = time.perf_counter()
            handle = app.start(WORKFLOW, input=items)
            while not obs.one("SELECT EXISTS (SELECT 1 FROM konduit_tasks WHERE execution_id = %s"
                              " AND step = 'item' AND started_at IS NOT NULL)", (handle.id,)):
                time.sleep(0.05)
            # One-step executions started while the map's items run: each gets its share.
            lone = lone_seconds(app, obs, LONE, 1.0, timeout=120)
            result = handle.wait(timeout=max(600.0, items / 50))
            wall = time.perf_counter() - began
            # The lone executions' few tasks are counted in, not out: under 0.01 % of a map's.
            cpu = cpu_ms_per_task(cpu_before, workers, items + 2 + LONE)
            stop.set()
            sampler.join()
        _check(result.output == items, f"the join saw {result.output} items, not {items}")
        row: Any = obs.rows("""
            SELECT extract(epoch FROM max(a.finished_at) FILTER (WHERE t.step = 'item')
                                    - min(a.started_at) FILTER (WHERE t.step = 'item'))::float8,
                   count(*) FILTER (WHERE t.step = 'item'),
                   extract(epoch FROM max(a.finished_at) FILTER (WHERE t.step = 'join')
                                    - max(a.started_at) FILTER (WHERE t.step = 'join'))::float8,
                   extract(epoch FROM min(a.started_at) FILTER (WHERE t.step = 'join')
                                    - max(a.finished_at) FILTER (WHERE t.step = 'item'))::float8,
                   count(*) FILTER (WHERE t.step = 'join'),
                   extract(epoch FROM max(e.finished_at) - min(e.created_at))::float8
            FROM konduit_tasks t JOIN konduit_attempts a ON a.task_id = t.id
            JOIN konduit_executions e ON e.id = t.execution_id
            WHERE t.execution_id = %s""", (handle.id,))[0]
    finally:
        obs.close()
    item_span, item_attempts, join_seconds, dispatch, join_attempts, total = row
    return {
        "items": items, "warm_small_maps": warm, "concurrency": concurrency,
        "seconds": _r(total), "client_wall_seconds": _r(wall),
        "item_attempts": item_attempts, "join_attempts": join_attempts,
        "items_per_second": _r(items / item_span) if item_span else None,
        "join_seconds": _r(join_seconds), "join_dispatch_seconds": _r(dispatch),
        "worker_cpu_ms_per_task": cpu,
        "worker_peak_rss_mb": peak_rss_mb(workers),
        "lone_beside_map": dist_ms(lone),
    }


def wide_map(fresh: Any, *, items: int, executions: int) -> Json:
    """The wide map, and a static throughput run (``executions`` x 20 branches) beside it."""
    with fresh() as url:
        static = throughput_run(url, executions=executions, label="static")
    with fresh() as url:
        wide = wide_map_run(url, items)
    return {
        "parameters": {"workflow": f"{WORKFLOW}: seed -> map(range(items)) -> join reading "
                                   "every item", "items": items, "processes": 1,
                       "concurrency": 8, "warm_up": "8 maps of 5 items first, same process",
                       "static": f"{executions} x bench-roots-20 in its own database, same run"},
        "results": {**wide, "static_branch_tasks_per_second":
                    static["branch_tasks_per_second"],
                    "static_worker_cpu_ms_per_task": static["worker_cpu_ms_per_task"]},
        "ratios": {"map_items_over_static_branches":
                   ratio(wide["items_per_second"], static["branch_tasks_per_second"]),
                   # The load-proof form of the same question: worker CPU per task, static
                   # over map (at least 1 when an item costs the worker no more than a branch).
                   "static_cpu_over_map_cpu_per_task":
                   ratio(static["worker_cpu_ms_per_task"], wide["worker_cpu_ms_per_task"])},
    }


FAN_OUT_LONE = 10
"""One-step executions started together while a big map's items are being created."""
FAN_OUT_TARGET_SECONDS = 5.0
"""The target: each of them finishes within this, however big the fan-out beside it."""


def fan_out_run(url: str, items: int, *, after: float = 1.0, lone: int = FAN_OUT_LONE,
                concurrency: int = 8) -> Json:
    """Start a map of ``items`` items, and ``after`` seconds later ``lone`` one-step executions
    together: their start -> finish, and whether they finished before the map's last item
    existed (the fan-out did not hold the worker's claims). The map is cancelled once its items
    all exist: running them is :func:`wide_map`'s measure, not this one's."""
    obs = Observer(url)
    try:
        with konduit.App([wide_map_workflow(), one_workflow()], database_url=url) as app, \
                worker_processes(url, obs, 1, concurrency=concurrency, app_spec=APP_SPEC,
                                 label="fan-out"):
            for _ in range(2):  # statements prepared while the tables are tiny
                app.start(WORKFLOW, input=5).wait(timeout=120)
            began = time.perf_counter()
            big = app.start(WORKFLOW, input=items)
            time.sleep(after)
            lone_ids = [app.start("bench-one").id for _ in range(lone)]
            lone_done_at: float | None = None
            created_at: float | None = None
            deadline = time.monotonic() + max(600.0, items / 1_000)
            while lone_done_at is None or created_at is None:
                _check(time.monotonic() < deadline, "the fan-out or the executions beside it "
                       "did not end in time")
                if lone_done_at is None and int(obs.one(
                        "SELECT count(*) FROM konduit_executions WHERE id = ANY(%s)"
                        " AND finished_at IS NOT NULL", (lone_ids,))) == lone:
                    lone_done_at = time.perf_counter() - began
                if created_at is None and int(obs.one(
                        "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s"
                        " AND step = 'item'", (big.id,))) == items:
                    created_at = time.perf_counter() - began
                time.sleep(0.05)
            rows = obs.rows("SELECT extract(epoch FROM finished_at - created_at)::float8, status"
                            " FROM konduit_executions WHERE id = ANY(%s)", (lone_ids,))
            _check(all(status == "succeeded" for _, status in rows),
                   "an execution beside the fan-out did not succeed")
            big.cancel("the fan-out benchmark measured its creation")
    finally:
        obs.close()
    seconds = [float(s) for s, _ in rows]
    return {
        "parameters": {"workflow": f"{WORKFLOW}: seed -> map(range(items)) -> join",
                       "items": items, "lone_executions": lone, "lone_started_after_s": after,
                       "processes": 1, "concurrency": concurrency},
        "results": {"lone": dist_ms(seconds),
                    "lone_all_within_target": max(seconds) <= FAN_OUT_TARGET_SECONDS,
                    "lone_done_after_start_s": _r(lone_done_at),
                    "items_all_created_after_start_s": _r(created_at),
                    "lone_done_before_items_created": lone_done_at < created_at},
        "ratios": {},
    }
