"""Migrating an execution while its step runs in a real ``konduit worker`` process."""

from __future__ import annotations

from pathlib import Path

import pytest

import konduit
from tests.apps import migration_app
from tests.support.waiting import until
from tests.support.workers import spawn_worker, stop_workers

pytestmark = [pytest.mark.storage, pytest.mark.slow]


def running_b(app: konduit.App, eid: object) -> bool:
    return any(t.step == "b" and t.status == "running" for t in app.tasks(eid))  # type: ignore[arg-type]


def test_a_worker_serving_both_versions_finishes_the_migrated_execution(make_app, db_url,
                                                                         tmp_path: Path):
    app = make_app(migration_app.V1, migration_app.V2)
    gate = tmp_path / "gate"
    worker = spawn_worker("tests.apps.migration_app:both", db_url, concurrency=2,
                          poll_interval=0.05)
    try:
        handle = app.start("migrating", {"gate": str(gate)}, version=1)
        until(lambda: running_b(app, handle.id), what="b running on the worker")
        moved = app.migrate(handle.id, to_version=2)
        assert moved.migrated and moved.added == ("c",) and moved.started == ()
        gate.touch()  # b returns: its completion decides with version 2's DAG, so c runs
        result = handle.wait(timeout=60)
        assert result.version == 2 and result.output == {"c": "b", "version": 2}
        assert [t.step for t in app.tasks(handle.id)] == ["a", "b", "c"]
    finally:
        gate.touch()
        stop_workers([worker])


def test_a_step_running_on_a_worker_without_the_target_version_refuses(make_app, db_url,
                                                                        tmp_path: Path):
    app = make_app(migration_app.V1, migration_app.V2)
    gate = tmp_path / "gate"
    worker = spawn_worker("tests.apps.migration_app:old_only", db_url, concurrency=2,
                          poll_interval=0.05)
    try:
        handle = app.start("migrating", {"gate": str(gate)}, version=1)
        until(lambda: running_b(app, handle.id), what="b running on the worker")
        with pytest.raises(konduit.MigrationRefused, match=r"step 'b' is running on worker .*"
                           r"which does not serve migrating@2") as info:
            app.migrate(handle.id, to_version=2)
        assert info.value.step == "b"
        gate.touch()
        result = handle.wait(timeout=60)
        assert result.version == 1 and result.output == "b"
    finally:
        gate.touch()
        stop_workers([worker])
