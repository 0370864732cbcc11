"""The fair-share benchmark: lone executions beside a big map and after a big batch.

One worker process x 8 slots (``konduit.bench.apps:fair_app``). In one fresh database a map of
``map_items`` items (1,000,000 in a full run) runs; a second after its items are being claimed,
``lone`` one-step executions start, one every ``lone_interval`` seconds; each one's start -> finish
time comes from the database's clock. Then, in another fresh database, one ``start_many`` of
``batch`` executions (100,000), and ``lone`` executions after it, the same way. Before migration
0019 the claim was first in, first out by execution: the lone executions waited for the whole
map (over 90 s) or the whole batch.

Then fairness between keys (``Workflow(fair_by=)``, migration 0027): in a fresh database a backlog
of ``keyed_backlog`` executions (10,000) of customer "a", started by separate calls from 8 threads
(each a flow of its own without a key: the shape migration 0019 alone does not help), and, in
another, by
``start_many`` calls of 100; then ``lone`` executions of customer "b", one at a time, each timed
start -> finish, and the tasks of "a" made ready before it that were claimed after its start and
before it (a round is 8).

Not part of the API.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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


KEYED = "bench-fair-key"


def _customer_b(app: konduit.App, obs: Observer, count: int, interval: float) -> Json:
    """``count`` executions of customer b, one at a time: each one's start -> finish seconds,
    and how many of customer a's tasks ready before its start were claimed ahead of it."""
    seconds: list[float] = []
    ahead: list[int] = []
    for _ in range(count):
        b = app.start(KEYED, {"customer": "b"}).id
        result = app.wait(b, timeout=120)
        _check(result.status == "succeeded", "an execution of customer b did not succeed")
        took, overtaken = obs.rows(
            "SELECT extract(epoch FROM e.finished_at - e.created_at)::float8,"
            " (SELECT count(*) FROM konduit_tasks a JOIN konduit_executions x"
            "   ON x.id = a.execution_id"
            "  WHERE x.fair_key = 'a' AND a.created_at < e.created_at"
            "    AND a.started_at >= e.created_at AND a.started_at < t.started_at)"
            " FROM konduit_executions e JOIN konduit_tasks t ON t.execution_id = e.id"
            " WHERE e.id = %s", (b,))[0]
        seconds.append(float(took))
        ahead.append(int(overtaken))
        time.sleep(interval)
    return {"b_start_to_finish": dist_ms(seconds), "a_tasks_claimed_ahead_max": max(ahead)}


def _keyed_backlog(url: str, backlog: int, shape: str, lone: int, interval: float) -> Json:
    obs = Observer(url)
    try:
        with konduit.App([apps.fair_key_workflow()], database_url=url) as app:
            began = time.perf_counter()
            if shape == "separate starts":  # from 8 threads, as many callers would
                app.start(KEYED, {"customer": "a"})  # the App's pool, opened once
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda _: app.start(KEYED, {"customer": "a"}),
                                  range(backlog - 1)))
            else:
                for first in range(0, backlog, 100):
                    app.start_many([{"workflow": KEYED, "input": {"customer": "a"}}]
                                   * min(100, backlog - first))
            starting = time.perf_counter() - began
            with worker_processes(url, obs, 1, app_spec=FAIR_APP, label="fair-key"):
                deadline = time.monotonic() + 120
                while int(obs.one("SELECT count(*) FROM konduit_executions"
                                  " WHERE status = 'succeeded'")) < 200:
                    _check(time.monotonic() < deadline, "customer a's backlog did not run")
                    time.sleep(0.1)
                b = _customer_b(app, obs, lone, interval)
                left = int(obs.one("SELECT count(*) FROM konduit_executions"
                                   " WHERE status = 'running'"))
    finally:
        obs.close()
    _check(left > 0, "customer a's backlog ended before customer b's executions: make it bigger")
    return {"backlog": backlog, "started_by": shape, "start_seconds": _r(starting), **b,
            "a_still_running": left}


def fair_share(fresh: Callable[[], AbstractContextManager[str]], *, map_items: int, batch: int,
               keyed_backlog: int = 10_000, keyed_lone: int = 20, lone: int = 20,
               lone_interval: float = 0.05) -> Json:
    """Lone executions beside a running ``map_items``-item map, then after a ``batch``-execution
    ``start_many``, then customer b's executions after customer a's ``keyed_backlog``
    (separate starts, then start_many calls of 100), through one worker process x 8 slots, each
    in a fresh database."""
    with fresh() as url:
        beside = _beside_map(url, map_items, lone, lone_interval)
    with fresh() as url:
        after = _after_batch(url, batch, lone, lone_interval)
    keyed: list[Json] = []
    for shape in ("separate starts", "start_many of 100"):
        with fresh() as url:
            keyed.append(_keyed_backlog(url, keyed_backlog, shape, keyed_lone, 0.1))
    worst: Any = max(beside["lone_start_to_finish"]["max_ms"], after["lone_start_to_finish"]["max_ms"])
    return {"parameters": {"map_items": map_items, "batch": batch, "lone_executions": lone,
                           "lone_interval_s": lone_interval, "processes": 1,
                           "concurrency": 8, "lone_workflow": "bench-one (one step)",
                           "keyed_backlog": keyed_backlog, "customer_b_executions": keyed_lone,
                           "keyed_workflow": f"{KEYED} (one step, fair_by customer)"},
            "results": {"beside_map": beside, "after_batch": after,
                        "lone_worst_ms": worst, "keyed_backlog": keyed,
                        "customer_b_worst_ms": max(k["b_start_to_finish"]["max_ms"]
                                                   for k in keyed)},
            "ratios": {}}
