"""Events that start work, with real worker processes killed mid-way (SIGKILL): every burst
still starts exactly one execution and every batched event lands in exactly one execution."""

from __future__ import annotations

import random
import subprocess
import time
from collections import Counter

import pytest

import konduit
from tests.apps import triggers_app
from tests.support.db import rows, value
from tests.support.waiting import until
from tests.support.workers import kill_workers, reaped, spawn_worker

pytestmark = [pytest.mark.storage, pytest.mark.slow]

TIMING = {"KONDUIT_TEST_DEBOUNCE": "0.5s", "KONDUIT_TEST_WINDOW": "0.5s",
          "KONDUIT_MAINTENANCE_INTERVAL": "0.2"}


def spawn(db_url: str) -> subprocess.Popen[bytes]:
    return spawn_worker("tests.apps.triggers_app:app", db_url, poll_interval=0.2, env=TIMING)


def open_work(db_url: str) -> int:
    """Groups still gathering plus events still waiting for a worker."""
    return int(value(db_url, "SELECT (SELECT count(*) FROM konduit_trigger_groups) + "
                             "(SELECT count(*) FROM konduit_trigger_events "
                             " WHERE status = 'pending')"))


def test_bursts_and_batches_start_exactly_once_across_sigkilled_workers(db_url):
    rng = random.Random(2026)
    app = konduit.App([triggers_app.uploaded, triggers_app.debounced, triggers_app.batched,
                       triggers_app.hostile], database_url=db_url)
    rounds, keys, burst, clicks = 5, 4, 6, 23
    killed_with_open_work = 0
    with reaped([]) as procs, konduit.Client(db_url) as client:
        # Registered (with their triggers) by a sender with the code; from then on a sender
        # without it (the Client) leaves every event to the workers.
        app.send_event("page.clicked", payload={"n": -1})
        n = 0
        for r in range(rounds):
            procs.append(spawn(db_url))
            for i in range(burst):
                for k in range(keys):
                    assert client.send_event("doc.edited",
                                             payload={"doc": f"{r}-{k}", "v": i}) == "started"
                for _ in range(clicks // burst + 1):
                    client.send_event("page.clicked", payload={"n": n})
                    n += 1
            time.sleep(rng.uniform(0.0, 1.0))  # a random moment to crash at, not a wait
            killed_with_open_work += open_work(db_url) > 0
            kill_workers(procs)
        procs.append(spawn(db_url))
        until(lambda: open_work(db_url) == 0, timeout=50, what="every burst and batch started")
    app.close()
    assert killed_with_open_work >= 1, "no worker was killed while work was open"
    edits = [e for (e,) in rows(db_url, "SELECT input FROM konduit_executions "
                                        "WHERE workflow_name = 'on-edit'")]
    assert Counter(e["doc"] for e in edits) == Counter(
        {f"{r}-{k}": 1 for r in range(rounds) for k in range(keys)})
    # Each burst started with one of its events (the last by the time each was applied).
    assert all(0 <= e["v"] < burst for e in edits)
    batches = [b for (b,) in rows(db_url, "SELECT input FROM konduit_executions "
                                          "WHERE workflow_name = 'on-click'")]
    assert all(1 <= len(b) <= 5 for b in batches), batches
    assert sorted(x for b in batches for x in b) == list(range(-1, n))
    assert value(db_url, "SELECT count(*) FROM konduit_trigger_events "
                         "WHERE status <> 'started'") == 0
