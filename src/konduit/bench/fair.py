"""The fair-share benchmark: lone executions beside a big map and after a big batch.

One worker process x 8 slots (``konduit.bench.apps:fair_app``). In one fresh database a map of
``map_items`` items (1,000,000 in a full run) runs; a second after its items are being claimed,
``lone`` one-step executions start, one every ``lone_interval`` seconds; each one's start -> finish
time comes from the database's clock. Then, in another fresh database, one ``start_many`` of
``batch`` executions (100,000), and ``lone`` executions after it, the same way. Before migration
0019 the claim was first in, first out by execution: the lone executions waited for the whole
map (over 90 s) or the whole batch.

Not part of the API.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any
from uuid import UUID

import konduit
from konduit.bench import apps
from konduit.bench.fleet import Json, Observer, _check, _r, dist_ms, worker_processes

FAIR_APP = "konduit.bench.apps:fair_app"


def lone_seconds(app: konduit.App, obs: Observer, count: int, interval: float,
                  timeout: float) -> list[float]:
    """Start ``count`` one-step executions, ``interval`` s apart; each one's start -> finish."""
    ids: list[UUID] = []
    for i in range(count):
        if i:
            time.sleep(interval)
        ids.append(app.start("bench-one").id)
    deadline = time.monotonic() + timeout
    while int(obs.one("SELECT count(*) FROM konduit_executions WHERE id = ANY(%s)"
                      " AND finished_at IS NOT NULL", (ids,))) < count:
        _check(time.monotonic() < deadline,
               f"lone executions not finished {timeout:.0f} s after they started")
        time.sleep(0.05)
    rows = obs.rows("SELECT extract(epoch FROM finished_at - created_at)::float8, status"
                    " FROM konduit_executions WHERE id = ANY(%s)", (ids,))
    _check(all(status == "succeeded" for _, status in rows), "a lone execution did not succeed")
    return [float(seconds) for seconds, _ in rows]


def _beside_map(url: str, items: int, lone: int, interval: float) -> Json:
    obs = Observer(url)
    try:
        with konduit.App([*apps.small_workflows(), apps.fair_map_workflow()],
                         database_url=url) as app, \
                worker_processes(url, obs, 1, app_spec=FAIR_APP, label="fair-map"):
            began = time.perf_counter()
            big = app.start("bench-fair-map", items).id
            deadline = time.monotonic() + 600
            # The map runs: its items are made ready (one transaction) and being claimed.
            while not obs.one("SELECT EXISTS (SELECT 1 FROM konduit_tasks WHERE execution_id = %s"
                              " AND step = 'item' AND started_at IS NOT NULL)", (big,)):
                _check(time.monotonic() < deadline, "the map's items were not claimed in 600 s")
                time.sleep(0.1)
            expanded = time.perf_counter() - began
            time.sleep(1.0)
            seconds = lone_seconds(app, obs, lone, interval, timeout=120)
            done, ready = obs.rows(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
                " count(*) FILTER (WHERE status = 'ready')"
                " FROM konduit_tasks WHERE execution_id = %s AND step = 'item'", (big,))[0]
            app.cancel(big)
    finally:
        obs.close()
    _check(int(ready) > 0, "the map ended before the lone executions did: use more items")
    return {"map_items": items, "map_ready_and_claimed_after_s": _r(expanded),
            "lone_start_to_finish": dist_ms(seconds),
            "map_items_done_meanwhile": int(done), "map_items_still_ready": int(ready)}


def _after_batch(url: str, batch: int, lone: int, interval: float) -> Json:
    obs = Observer(url)
    try:
        with konduit.App(apps.small_workflows(), database_url=url) as app:
            began = time.perf_counter()
            app.start_many([{"workflow": "bench-one"}] * batch)  # one batch: one flow of turns
            starting = time.perf_counter() - began
            with worker_processes(url, obs, 1, app_spec=FAIR_APP, label="fair-batch"):
                time.sleep(1.0)
                seconds = lone_seconds(app, obs, lone, interval, timeout=120)
                left = int(obs.one("SELECT count(*) FROM konduit_executions"
                                   " WHERE status = 'running'"))
    finally:
        obs.close()
    _check(left > 0, "the batch ended before the lone executions did: use a bigger batch")
    return {"batch": batch, "start_many_seconds": _r(starting),
            "lone_start_to_finish": dist_ms(seconds), "batch_still_running": left}


def fair_share(fresh: Callable[[], AbstractContextManager[str]], *, map_items: int, batch: int,
               lone: int = 20, lone_interval: float = 0.05) -> Json:
    """Lone executions beside a running ``map_items``-item map, then after a ``batch``-execution
    ``start_many``, through one worker process x 8 slots, each in a fresh database."""
    with fresh() as url:
        beside = _beside_map(url, map_items, lone, lone_interval)
    with fresh() as url:
        after = _after_batch(url, batch, lone, lone_interval)
    worst: Any = max(beside["lone_start_to_finish"]["max_ms"], after["lone_start_to_finish"]["max_ms"])
    return {"parameters": {"map_items": map_items, "batch": batch, "lone_executions": lone,
                           "lone_interval_s": lone_interval, "processes": 1,
                           "concurrency": 8, "lone_workflow": "bench-one (one step)"},
            "results": {"beside_map": beside, "after_batch": after,
                        "lone_worst_ms": worst},
            "ratios": {}}
