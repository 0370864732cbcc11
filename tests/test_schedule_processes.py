"""Three real worker processes (`konduit worker`) run an ``every="1s"`` schedule for about ten
seconds: each tick starts exactly one execution, and no tick is missed while they run."""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from konduit.core.schedules import tick_key
from tests.support.workers import spawn_worker, stop_workers

pytestmark = [pytest.mark.storage, pytest.mark.slow]

RUN_FOR = 10.0


def spawn(db_url: str, log: Path) -> subprocess.Popen[bytes]:
    return spawn_worker("tests.apps.schedule_app:app", db_url, log_level="INFO",
                        stderr=log.open("wb"))


def test_three_workers_start_each_tick_of_an_every_second_schedule_once(
    db_url: str, tmp_path: Path
) -> None:
    logs = [tmp_path / f"worker-{i}.log" for i in range(3)]
    workers = [spawn(db_url, log) for log in logs]
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # all three registered: they all run
                live = conn.execute("SELECT count(*) FROM konduit_workers "
                                    "WHERE stopped_at IS NULL").fetchone()
                if live is not None and live[0] == 3:
                    break
                time.sleep(0.1)
            else:
                pytest.fail("the three workers did not come up")
            time.sleep(RUN_FOR)
    finally:
        stop_workers(workers)
    assert all(w.returncode == 0 for w in workers), [log.read_text()[-2000:] for log in logs]
    # Which worker started which tick (each logs the ticks it started): together, each once.
    started_by = [log.read_text().count("started execution") for log in logs]
    with psycopg.connect(db_url) as conn:
        executions = conn.execute(
            "SELECT scheduled_at, idempotency_key, status, output, input FROM konduit_executions"
            " ORDER BY scheduled_at").fetchall()
        per_tick = conn.execute(
            "SELECT scheduled_at, count(*) FROM konduit_executions GROUP BY scheduled_at"
        ).fetchall()
        [(last_tick,)] = conn.execute(
            "SELECT last_tick FROM konduit_schedules WHERE name = 'each-second'").fetchall()
    ticks = [row[0] for row in executions]
    assert all(n == 1 for _, n in per_tick) and None not in ticks  # one execution per tick
    assert len(ticks) >= RUN_FOR - 1
    # No tick missed: every second from the first tick to the last handled one has its execution.
    span = int((ticks[-1] - ticks[0]).total_seconds())
    assert ticks == [ticks[0] + timedelta(seconds=i) for i in range(span + 1)]
    assert ticks[-1] == last_tick
    assert sum(started_by) == len(ticks), started_by
    for scheduled_at, key, status, output, input_ in executions:
        assert key == tick_key("each-second", scheduled_at)
        assert input_ == {"from": "schedule"}
        if status == "succeeded":
            assert output == scheduled_at.isoformat()
    # The last ones may still be queued when the workers stop; the others ran.
    assert sum(status == "succeeded" for _, _, status, _, _ in executions) >= len(ticks) // 2
