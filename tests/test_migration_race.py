"""A migration racing the completions of a join's branches: each join fires exactly once.

Version 1: root -> b0, b1 -> j. Version 2 adds a second join of the same branches, f, and a
step e after j. In every trial both branches are leased, then a barrier releases, at the same
instant and each on its own connection, the two completions and the migration of the
execution to version 2. Whatever the order the database serializes them in (the migration
before both, between them, or after both), j, f and e must each get exactly one task and the
execution must finish, at version 2.
"""

from __future__ import annotations

import threading
from collections import Counter
from uuid import UUID

import pytest

from konduit.bench.harness import LoopThread, claim
from konduit.core.model import TaskAttempt
from konduit.core.requests import MigrateRequest
from konduit.db.database import Database
from konduit.engine.client import Client
from konduit.engine.completer import Recorded, record
from konduit.engine.registry import Registry
from konduit.records import MigrationRecord
from tests.support.migrating import run_ready, task_rows, versioned

pytestmark = pytest.mark.storage

V1 = {"root": [], "b0": ["root"], "b1": ["root"], "j": ["b0", "b1"]}
V2 = {**V1, "f": ["b0", "b1"], "e": ["j"]}
TRIALS = 100


async def lease(db: Database, registry: Registry, eid: UUID) -> list[TaskAttempt]:
    """Run the root of ``eid`` and lease both branches."""
    (root,) = await claim(db, registry, 1)
    assert root.step == "root" and root.execution_id == eid
    outcome, _ = await record(db, registry, root.completion(
        "succeeded", payload_json="1", payload=1))
    assert outcome is Recorded.ENDED
    return sorted(await claim(db, registry, 2), key=lambda task: task.step)


async def complete(db: Database, registry: Registry, task: TaskAttempt,
                   barrier: threading.Barrier) -> Recorded:
    barrier.wait(timeout=30)  # blocks this loop thread only, which runs nothing else
    outcome, _ = await record(db, registry, task.completion(
        "succeeded", payload_json="1", payload=1))
    return outcome


async def migrate(db: Database, registry: Registry, eid: UUID,
                  barrier: threading.Barrier) -> MigrationRecord:
    client = Client(db, registry)
    barrier.wait(timeout=30)
    return await client.migrate(MigrateRequest(eid, 2))


def test_joins_fire_exactly_once_when_a_migration_races_the_branches(make_app):
    app = make_app(versioned(1, V1), versioned(2, V2))
    registry = app.registry
    threads = [LoopThread(app.database_url) for _ in range(3)]
    main = threads[0]
    where_f_fired: Counter[str] = Counter()
    try:
        for trial in range(TRIALS):
            eid = app.start("flow", version=1).id
            branches = main.run(lease(main.db, registry, eid))
            assert [b.step for b in branches] == ["b0", "b1"]
            barrier = threading.Barrier(3)
            futures = [threads[i].submit(complete(threads[i].db, registry, branches[i], barrier))
                       for i in (0, 1)]
            migrating = threads[2].submit(migrate(threads[2].db, registry, eid, barrier))
            ended = [futures[0].result(timeout=60), futures[1].result(timeout=60)]
            moved = migrating.result(timeout=60)
            assert ended == [Recorded.ENDED, Recorded.ENDED]
            assert isinstance(moved, MigrationRecord) and moved.migrated, trial
            where_f_fired["migration" if "f" in moved.started else "completion"] += 1
            for _ in range(10):  # drain: j and f, then e
                if not main.run(run_ready(main.db, registry)):
                    break
            result = app.status(eid)
            assert result.status == "succeeded" and result.version == 2, (trial, result)
            tasks = Counter(t["step"] for t in main.run(task_rows(main.db, eid)))
            assert tasks == {"root": 1, "b0": 1, "b1": 1, "j": 1, "f": 1, "e": 1}, (trial, tasks)
    finally:
        for t in threads:
            t.close()
    print(f"f fired by: {dict(where_f_fired)} over {TRIALS} trials")
    assert sum(where_f_fired.values()) == TRIALS
