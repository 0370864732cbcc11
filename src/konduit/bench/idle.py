"""What idle workers cost the database: committed transactions per second and the CPU of their
PostgreSQL backends, for one idle worker process and for a fleet of them.

Measured while the workers run (not across their start and stop): after a settling time, over
a window, from ``pg_stat_database.xact_commit`` of the scratch database (less the observer's own
statements) and from ``/proc`` for the backends connected to that database (when the server runs
on this machine; other databases on the same server, other tests' included, are not counted).
A backend flushes its statistics when it goes idle, at most once a second, so a window of
several seconds reads the commits within about a second's worth per backend.

Not part of the API.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from konduit.bench.fleet import Json, Observer, _r, ratio, worker_processes


def _backend_cpu(obs: Observer) -> dict[int, float]:
    """CPU seconds so far of each backend connected to the observer's database (but its own);
    empty when they are not readable here (a remote server)."""
    pids = [int(r[0]) for r in obs.rows(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid()")]
    tick = os.sysconf("SC_CLK_TCK")
    cpu: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
    return cpu


def _commits(obs: Observer) -> tuple[int, int]:
    if obs.server_version >= 150000:
        obs.one("SELECT pg_stat_force_next_flush()")
    return int(obs.one("SELECT xact_commit FROM pg_stat_database"
                       " WHERE datname = current_database()")), obs.statements


def idle_fleet(url: str, workers: int, *, window: float = 15.0, settle: float = 6.0,
               env: dict[str, str] | None = None) -> Json:
    """``workers`` idle worker processes (2 slots each) on ``url``: their commits per second and
    their backends' CPU milliseconds per second over ``window`` seconds, ``settle`` seconds after
    the last one registered (startup's one-off statements are not counted)."""
    obs = Observer(url)
    try:
        with worker_processes(url, obs, workers, concurrency=2, label="idle", env=env):
            time.sleep(settle)
            before, cpu_before, began = _commits(obs), _backend_cpu(obs), time.monotonic()
            time.sleep(window)
            after, cpu_after, span = _commits(obs), _backend_cpu(obs), time.monotonic() - began
    finally:
        obs.close()
    commits = (after[0] - before[0]) - (after[1] - before[1])
    both = cpu_before.keys() & cpu_after.keys()
    cpu = sum(cpu_after[p] - cpu_before[p] for p in both) if both else None
    return {"workers": workers, "seconds": _r(span),
            "commits_per_second": _r(commits / span),
            "backend_cpu_ms_per_second": None if cpu is None else _r(cpu * 1000 / span),
            "backends": len(both)}


def idle_cost(fresh: Any, *, fleet: int = 10, window: float = 15.0,
              env: dict[str, str] | None = None) -> Json:
    """One idle worker, then ``fleet`` of them, each in a database of its own from ``fresh()``;
    the ratios are the fleet's cost over one's."""
    with fresh() as url:
        one = idle_fleet(url, 1, window=window, env=env)
    with fresh() as url:
        many = idle_fleet(url, fleet, window=window, env=env)
    return {
        "parameters": {"fleet": fleet, "window_seconds": window, "concurrency_each": 2,
                       "commits": "pg_stat_database.xact_commit of the scratch database over the "
                       "window, less the observer's statements",
                       "cpu": "user + system CPU of the database's backends (/proc), when local"},
        "results": {"one": one, "fleet": many},
        "ratios": {"fleet_commits_over_one": ratio(many["commits_per_second"],
                                                   one["commits_per_second"]),
                   "fleet_cpu_over_one": ratio(many["backend_cpu_ms_per_second"],
                                               one["backend_cpu_ms_per_second"])},
    }
