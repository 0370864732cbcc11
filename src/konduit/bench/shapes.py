"""Branch tasks/s at several worker shapes side by side, map items/s beside them, and what each
task costs in CPU on each side (``konduit bench --only shapes``).

The shapes: one process x 8 slots, one x 64 and two x 32, each draining ``executions`` x (20
no-op branches + a join) started together; then one process x 8 through a map of ``map_items``
no-op items. For each: tasks/s, and the CPU per task of the worker processes (``/proc``, from the
start of the load to its end) and of the server (every process of the PostgreSQL server whose
backend answers the bench, when it runs on this machine: the postmaster's reaped children plus
the live ones, from before the worker processes start to after they stop). CPU time moves far
less with other load on the machine than tasks/s does: it is the figure to compare across runs.
The server's figure counts whatever else that server ran meanwhile: read it from a server the
bench has to itself (``KONDUIT_HOME`` set to a scratch folder gives it a private one)."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import psycopg

from konduit.bench.fleet import Json, _r, ratio, throughput_run
from konduit.bench.maps import wide_map_run

SHAPES = ((1, 8), (1, 64), (2, 32))
"""(processes, slots each) of the static runs."""


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def server_cpu_seconds(url: str) -> float | None:
    """User + system CPU of every process of the server at ``url`` so far (its postmaster's own,
    its reaped children's and its live children's); None when that server's processes are not
    on this machine (or not readable)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            backend = int(row[0]) if row else 0
            postmaster = int(_stat(backend)[1])  # a backend's parent is the postmaster
        own = _stat(postmaster)
        total = sum(int(x) for x in own[11:15])  # utime stime cutime cstime
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = _stat(int(entry))
            except OSError:
                continue  # exited meanwhile: its time is in the postmaster's cutime now
            if int(fields[1]) == postmaster:
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, psycopg.Error):
        return None


def _per_task(before: float | None, after: float | None, tasks: int) -> float | None:
    if before is None or after is None or not tasks:
        return None
    return _r(1000 * (after - before) / tasks)


def shapes(fresh: Callable[[], AbstractContextManager[str]], *, executions: int,
           map_items: int) -> Json:
    """The static load at each of :data:`SHAPES` and the map at 1 x 8, each in a fresh
    database."""
    runs: list[Json] = []
    for processes, slots in SHAPES:
        with fresh() as url:
            server_before = server_cpu_seconds(url)
            run = throughput_run(url, executions=executions, processes=processes,
                                 concurrency=slots, label=f"shape{processes}x{slots}")
            server_after = server_cpu_seconds(url)
        tasks = run["executions"] * (run["width"] + 1)
        server = _per_task(server_before, server_after, tasks)
        worker = run["worker_cpu_ms_per_task"]
        runs.append({
            "shape": f"{processes} x {slots}", "processes": processes, "slots_each": slots,
            "branch_tasks_per_second": run["branch_tasks_per_second"],
            "commits_per_task": run["commits_per_task"],
            "worker_cpu_ms_per_task": worker, "server_cpu_ms_per_task": server,
            "cpu_ms_per_task": None if worker is None or server is None
            else _r(worker + server),
        })
    with fresh() as url:
        server_before = server_cpu_seconds(url)
        mapped = wide_map_run(url, map_items, warm=2)
        server_after = server_cpu_seconds(url)
    map_worker = mapped["worker_cpu_ms_per_task"]
    map_server = _per_task(server_before, server_after, map_items + 2)
    peak = max(runs, key=lambda r: float(r["branch_tasks_per_second"]))
    one_by_eight = runs[0]
    return {
        "parameters": {"executions": executions, "workflow": "bench-roots-20: 20 no-op root "
                       "branches + a join", "shapes": [f"{p} x {s}" for p, s in SHAPES],
                       "map_items": map_items, "map_shape": "1 x 8",
                       "worker_cpu": "the worker processes' user + system CPU from the start "
                       "of the load to its end, per task",
                       "server_cpu": "every process of the server, from before the worker "
                       "processes start to after they stop, per task (includes the start of "
                       "the load and anything else the server ran meanwhile)"},
        "results": {
            "runs": runs,
            "map": {"items_per_second": mapped["items_per_second"],
                    "worker_cpu_ms_per_task": map_worker, "server_cpu_ms_per_task": map_server,
                    "join_seconds": mapped["join_seconds"]},
            "peak_branch_tasks_per_second": peak["branch_tasks_per_second"],
            "peak_shape": peak["shape"],
        },
        "ratios": {
            "map_items_over_one_by_eight_branches":
                ratio(mapped["items_per_second"], one_by_eight["branch_tasks_per_second"]),
            "peak_over_one_by_eight":
                ratio(peak["branch_tasks_per_second"], one_by_eight["branch_tasks_per_second"]),
        },
    }
