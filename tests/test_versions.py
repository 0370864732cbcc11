"""Changing a workflow while it runs (docs/changing-workflows.md): a policy-only change
re-registers the same version, each task keeping the policy it was created with; a shape change
without a new version is refused naming the change; several versions side by side."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

import konduit
from konduit import Retry
from tests.support.waiting import until as wait_for
from tests.support.workers import running_worker


def _policy(max_attempts: int, *, name: str = "pol", version: int = 1) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=version)
    retry = Retry(max_attempts=max_attempts, base="10ms", jitter=False)

    @wf.step(retry=retry)
    def a(ctx: Any) -> int:
        if (ctx.input or {}).get("fail"):
            raise RuntimeError("told to fail")
        return 1

    @wf.step(after=[a], retry=retry)
    def b(ctx: Any) -> int:
        return 2

    return wf


def _tries(app: konduit.App, execution_id: Any) -> dict[str, tuple[int, int]]:
    return {t.step: (t.attempt, t.max_attempts) for t in app.tasks(execution_id)}


def test_a_policy_change_needs_no_version_and_tasks_keep_theirs(
        make_app: Callable[..., konduit.App]) -> None:
    old = make_app(_policy(2))
    failing = old.start("pol", {"fail": True})
    passing = old.start("pol", {"fail": False})
    new = make_app(_policy(5))
    # The same version with another retry count registers: no new version needed.
    later = new.start("pol", {"fail": True})
    (state,) = new.versions("pol")
    assert (state.version, state.policy_revision) == (1, 2)
    with running_worker(new, concurrency=4):
        for handle in (failing, passing, later):
            with contextlib.suppress(konduit.ExecutionFailed):
                new.wait(handle.id, timeout=60)
    # The new worker ran the old task under the policy it was created with: 2 tries, not 5.
    assert new.status(failing.id).status == "failed"
    assert _tries(new, failing.id) == {"a": (2, 2)}
    assert _tries(new, later.id) == {"a": (5, 5)}
    # An old execution's task created after the change takes the new policy.
    assert new.status(passing.id).status == "succeeded"
    assert _tries(new, passing.id) == {"a": (1, 2), "b": (1, 5)}
    policies = new._read(lambda c: c.task_policies(passing.id))
    assert [(p.step, p.max_attempts, p.policy_revision) for p in policies] == [
        ("a", 2, 1), ("b", 5, 2)]
    # Registering the first policy again is one more revision, not a conflict.
    again = make_app(_policy(2))
    again.start("pol", {"fail": False})
    assert again.versions("pol")[0].policy_revision == 3


def test_a_shape_change_without_a_version_is_refused_naming_it(
        make_app: Callable[..., konduit.App]) -> None:
    first = make_app(_policy(2))
    first.start("pol")
    changed = konduit.Workflow("pol", version=1)
    changed.step(name="a")(lambda ctx: 1)
    changed.step(name="b", after=["a"])(lambda ctx: 2)
    changed.step(name="c", after=["a"])(lambda ctx: 3)
    second = make_app(changed)
    with pytest.raises(konduit.WorkflowVersionConflict) as info:
        second.start("pol")
    message = str(info.value)
    assert "step 'c' added" in message and "edge a->c added" in message
    assert "version 1" in message and "new version" in message
    assert isinstance(info.value, konduit.WorkflowDefinitionError)
    # A worker of that deployment refuses to start, saying the same.
    with pytest.raises(konduit.WorkflowVersionConflict, match="step 'c' added"):
        second.run_worker(concurrency=1, stop_after=10)
    # Nothing was changed: still one revision of the first shape.
    assert first.versions("pol")[0].policy_revision == 1


def test_versions_side_by_side_start_the_newest_unless_told(
        make_app: Callable[..., konduit.App]) -> None:
    app = make_app(_policy(2, version=1), _policy(3, version=2))
    newest = app.start("pol")
    older = app.start("pol", version=1)
    assert (newest.status().version, older.status().version) == (2, 1)
    states = {s.version: s for s in app.versions("pol")}
    assert {v: (s.running, s.workers, s.unserved) for v, s in states.items()} == {
        1: (1, [], True), 2: (1, [], True)}
    with running_worker(app, concurrency=2):
        app.wait(older.id, timeout=60)
        app.wait(newest.id, timeout=60)
        served = {s.version: s for s in app.versions()}
        assert all(len(s.workers) == 1 and not s.unserved for s in served.values())
    assert {s.version: s.running for s in app.versions("pol")} == {1: 0, 2: 0}


def test_version_unserved_is_raised_after_the_grace_and_resolved_when_served(
        make_app: Callable[..., konduit.App]) -> None:
    orphan = make_app(_policy(2, name="orphan"))
    stuck = orphan.start("orphan")
    time.sleep(0.6)  # past the grace the test sets, with no worker serving orphan@1
    # A worker of another deployment judges it: the version's own workers are gone.
    other = make_app(_policy(2, name="other"))
    quick = {"alert_interval": 0.2, "alert_version_unserved": 0.5}
    with running_worker(other, concurrency=1, **quick):
        alert = wait_for(lambda: other.alerts(kind="version_unserved"), timeout=30)[0]
    assert (alert.subject, alert.workflow, alert.severity) == ("orphan@1", "orphan", "critical")
    assert "1 running execution" in alert.message and "no live worker" in alert.message
    assert alert.details["running"] == 1
    # A worker serving the version comes: the execution drains and the alert resolves.
    with running_worker(orphan, concurrency=2, **quick):
        orphan.wait(stuck.id, timeout=60)
        wait_for(lambda: not other.alerts(kind="version_unserved"), timeout=30)
    (closed,) = other.alerts(kind="version_unserved", include_resolved=True)
    assert closed.resolved_at is not None and "serves the version" in str(
        closed.details["resolution"])


def test_registrations_racing_on_one_version_take_turns(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """Forced collision: the version's row is held locked while three deployments register it
    (two policies of the same shape, one other shape); released, they go one after another."""
    make_app(_policy(2)).start("pol")
    other_shape = konduit.Workflow("pol", version=1)
    other_shape.step(name="a")(lambda ctx: 1)
    apps = [make_app(_policy(3)), make_app(_policy(4)), make_app(other_shape)]
    barrier = threading.Barrier(len(apps) + 1)
    outcomes: dict[int, str] = {}

    def register(i: int) -> None:
        barrier.wait()
        try:
            apps[i].start("pol")
            outcomes[i] = "ok"
        except konduit.WorkflowVersionConflict as exc:
            outcomes[i] = str(exc)

    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT 1 FROM konduit_workflows WHERE name = 'pol' FOR UPDATE")
        threads = [threading.Thread(target=register, args=(i,)) for i in range(len(apps))]
        for t in threads:
            t.start()
        barrier.wait()
        # Each registration is past its insert and waits on the row lock before any goes on.
        # pg_stat_activity is read once per transaction and kept (the holder's transaction
        # stays open): cleared before each look, or backends that connected after the first
        # look are never seen (it timed out on a loaded machine).
        def waiting() -> bool:
            holder.execute("SELECT pg_stat_clear_snapshot()")
            row = holder.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                "WHERE NOT l.granted AND a.datname = current_database()").fetchone()
            return row is not None and row[0] >= 3

        wait_for(waiting, timeout=30, what="the three registrations to wait on the lock")
        holder.rollback()
    for t in threads:
        t.join(timeout=60)
    assert outcomes[0] == outcomes[1] == "ok"
    assert "step 'b' removed" in outcomes[2] and "edge a->b removed" in outcomes[2]
    (state,) = apps[0].versions("pol")
    assert state.policy_revision == 3  # one revision per policy registered, none lost
    with psycopg.connect(db_url) as conn:
        revisions = conn.execute("SELECT revision FROM konduit_workflow_policies "
                                 "WHERE name = 'pol' ORDER BY revision").fetchall()
    assert [r[0] for r in revisions] == [1, 2, 3]


def test_a_process_still_on_the_old_policy_stamps_its_tasks_with_it(
        make_app: Callable[..., konduit.App]) -> None:
    """During a rolling deploy an old process creates tasks with the policy it registered: the
    task says so (its revision is its creator's, not the newest one's). A restarted old worker
    registers its policy again: the last to start decides the version's policy."""
    old = make_app(_policy(2))
    old.start("pol", {"fail": False})  # registers revision 1
    make_app(_policy(5)).start("pol", {"fail": False})  # a new process: revision 2
    started = old.start("pol", {"fail": False})  # the old process, after the change
    assert old.versions("pol")[0].policy_revision == 2
    policies = old._read(lambda c: c.task_policies(started.id))
    assert [(p.step, p.max_attempts, p.policy_revision) for p in policies] == [("a", 2, 1)]
    with running_worker(old, concurrency=2):  # an old worker (re)starts: revision 3
        old.wait(started.id, timeout=60)
    assert old.versions("pol")[0].policy_revision == 3
    policies = old._read(lambda c: c.task_policies(started.id))
    assert [(p.step, p.max_attempts, p.policy_revision) for p in policies] == [
        ("a", 2, 1), ("b", 2, 3)]


def _backoff(base: str) -> konduit.Workflow:
    wf = konduit.Workflow("backoff", version=1)

    @wf.step(retry=Retry(max_attempts=3, backoff="fixed", base=base, jitter=False))
    def a(ctx: Any) -> int:
        raise RuntimeError("always")

    return wf


def test_a_worker_retries_a_task_as_the_policy_it_was_created_with_says(
        make_app: Callable[..., konduit.App]) -> None:
    old = make_app(_backoff("30s"))
    created_before = old.start("backoff")  # revision 1: 30 s between tries
    new = make_app(_backoff("10ms"))
    created_after = new.start("backoff")  # revision 2: 10 ms
    with running_worker(new, concurrency=2):
        with pytest.raises(konduit.ExecutionFailed):
            new.wait(created_after.id, timeout=60)  # three quick tries
        (task,) = wait_for(lambda: [t for t in new.tasks(created_before.id)
                                    if t.attempt == 1 and t.status == "ready"], timeout=30)
        # The worker's code says 10 ms; the task was created under 30 s, and waits that.
        assert task.run_at is not None and task.finished_at is None
        waits = (task.run_at - datetime.now(UTC)).total_seconds()
        assert 20 < waits <= 30, waits
    assert _tries(new, created_after.id) == {"a": (3, 3)}
