"""Migrating a running execution to another version of its workflow, in one transaction.

:func:`migrate_in` takes the locks in the order of every completion round (DESIGN.md, fan-in
protocol rule 7): the execution row first (``execution_lock``, the lock each fan-in decision of
the execution takes before it reads join state), then its unfinished task rows in id order (the
relabel to the target version), then its step rows. A completion that commits before the
migration's lock is seen by it (the reads that follow are new statements, READ COMMITTED); one
that comes later waits for the lock and then reads the execution's new version and its rebuilt
step rows, so its decision follows the new DAG. Either way each join fires exactly once
(tests/test_migration_race.py forces the collision).

The plan itself is the pure :func:`konduit.core.migration.plan_migration`, on the shapes of
both versions as stored in ``konduit_workflows``: the check needs no workflow code. Creating the
tasks of steps that must start at once does (a map's items, a wait's key): it uses the target
version's code from the caller's registry, and the migration is refused, naming the step, when
that code is not there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from uuid import UUID

from konduit.core import shape
from konduit.core.advance import ExecutionState
from konduit.core.migration import MigrationPlan, Shape, plan_migration
from konduit.core.model import ExecutionStatus, TaskStatus
from konduit.core.values import MAX_INT, check_text
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database, Row, Tx
from konduit.engine.advancer import Advancer
from konduit.engine.finish import finish_execution
from konduit.engine.history import refuse_if_moved
from konduit.engine.outputs import final_output
from konduit.engine.registry import Registry, workflow_key
from konduit.engine.step_rows import state_columns
from konduit.errors import (
    ExecutionNotFound,
    KonduitError,
    MigrationRefused,
    WorkflowNotFound,
    WorkflowVersionConflict,
    blamed,
)
from konduit.records import MigrationRecord

Register = Callable[[WorkflowSpec], Awaitable[None]]
"""Record a definition in ``konduit_workflows`` (:meth:`konduit.engine.client.Client.register`)."""


def check_version(version: object, field: str = "to_version") -> int:
    """A version: a whole number in its column's range (else ``field`` is at fault)."""
    if isinstance(version, bool) or not isinstance(version, int) \
            or not 1 <= version <= MAX_INT:
        raise blamed(KonduitError(f"{field} must be a version number from 1 to {MAX_INT}, "
                                  f"got {version!r:.40}"), field)
    return version


def target_code(registry: Registry, name: str, version: int) -> WorkflowSpec | None:
    """The caller's definition of ``name`` at ``version``, or None when it has none."""
    try:
        return registry.get(name, version)
    except KonduitError:
        return None


async def migrate_in(tx: Tx, registry: Registry, eid: UUID, to_version: int, *,
                     max_payload_bytes: int) -> MigrationRecord:
    """Move the running execution ``eid`` to version ``to_version`` of its workflow, inside
    ``tx``. Raises :class:`MigrationRefused` (naming the step at fault) when the execution's
    past does not exist as it was in the target version, or the move is not possible now; the
    transaction then must roll back (the caller's ``atomic`` does)."""
    check_version(to_version)
    row = await tx.one("execution_lock", id=eid)
    if row is None:
        raise ExecutionNotFound(f"no execution with id {eid}")
    name, from_version = row["workflow_name"], row["workflow_version"]
    record = MigrationRecord(execution_id=eid, workflow=name, from_version=from_version,
                             to_version=to_version, migrated=False)
    if row["status"] != ExecutionStatus.RUNNING:
        raise MigrationRefused(f"execution {eid} is {row['status']}: only a running execution "
                               "can be migrated")
    if from_version == to_version:
        return record  # nothing to do: a repeated migration is harmless
    target = await tx.one("workflow_get", name=name, version=to_version)
    if target is None:
        raise WorkflowNotFound(
            f"workflow {name!r} version {to_version} is not registered in the database: start "
            "a worker (or an App) that defines it before migrating executions to it")
    source = await tx.one("workflow_get", name=name, version=from_version)
    assert source is not None  # the execution's foreign key
    code = target_code(registry, name, to_version)
    # A policy-only difference is no conflict (docs/changing-workflows.md): another process
    # re-registered the version with its policy, and this one creates its tasks with its own
    # (stamped with the revision it registered), as it does for every task it creates.
    changes = [] if code is None or code.spec_hash == target["spec_hash"] else \
        shape.shape_diff(shape.shape_of(target["spec"] or {}), shape.shape_of(code.spec_json))
    if changes:
        raise WorkflowVersionConflict(
            f"workflow {name!r} version {to_version} is registered with a different shape than "
            f"this process's ({'; '.join(changes)}): a shape change needs a new version number")
    key = workflow_key(name, to_version)
    # Task rows after the execution row, in id order; relabelled so that only workers serving
    # the target claim them from now on (refused below, rolled back, when one may not record).
    moved = await tx.all("task_relabel_unfinished_in_id_order", execution_id=eid, workflow=key)
    steps = await tx.all("step_list_for_migration", execution_id=eid)
    past = frozenset(s["step"] for s in steps if s["has_tasks"] or s["status"] != "waiting")
    old = Shape.from_spec_json(source["spec"])
    # Only a plain step's handler routes (a map's items and a wait do not): never read a map's
    # million tasks for it.
    routing = sorted(s for s in past if s in old and old[s].kind == "plain")
    routes = await tx.all("task_list_routes_latest_of_steps", execution_id=eid, steps=routing)
    plan = plan_migration(
        old, Shape.from_spec_json(target["spec"]),
        {s["step"]: s["status"] for s in steps}, past,
        {r["step"]: None if r["routes"] is None else frozenset(r["routes"]) for r in routes})
    _refuse_unserved(moved, key)
    if code is None and (plan.start or plan.steps_pending == 0):
        what = f"step {plan.start[0]!r} would start" if plan.start \
            else "the execution would finish"
        raise MigrationRefused(
            f"{what} now and this process does not have version {to_version} of {name!r}: "
            "migrate from an App (or `konduit migrate-executions --app`) that defines it",
            step=plan.start[0] if plan.start else None)
    await _write_steps(tx, eid, plan, Shape.from_spec_json(target["spec"]),
                       {s["step"]: s["ended_at"] for s in steps})
    migrated = await tx.one("execution_migrate_if_running_at_version", id=eid,
                            to_version=to_version, from_version=from_version,
                            steps_pending=plan.steps_pending)
    assert migrated is not None  # the execution row is locked and was running at from_version
    for queue in sorted({t["queue"] for t in moved if t["status"] == TaskStatus.READY}):
        await tx.one("task_notify_ready", queue=queue)  # workers of the target may be idle
    if code is not None:
        if plan.start:
            await Advancer(tx, code, eid, ExecutionState(ExecutionStatus.RUNNING,
                                                         plan.steps_pending),
                           row["generation"], max_payload_bytes=max_payload_bytes,
                           window_left=row["window_left_seconds"]).start_steps(list(plan.start))
        elif plan.steps_pending == 0:
            # Every step of the target has ended: the execution is done.
            await finish_execution(tx, eid, ExecutionStatus.SUCCEEDED,
                                   await final_output(tx, code, eid), None, 0)
    return MigrationRecord(execution_id=eid, workflow=name, from_version=from_version,
                           to_version=to_version, migrated=True, added=plan.added,
                           dropped=plan.dropped, started=plan.start, skipped=plan.skipped)


def _refuse_unserved(moved: list[Row], key: str) -> None:
    """A task running on a live worker that does not serve the target could not record its
    end under the new version: refuse until it ends (or the worker serves the target too)."""
    for t in moved:
        if t["status"] != TaskStatus.RUNNING:
            continue
        for worker, serves in ((t["worker_id"], t["worker_serves"]),
                               (t["hedge_worker_id"], t["hedge_worker_serves"])):
            if serves is False:
                raise MigrationRefused(
                    f"step {t['step']!r} is running on worker {worker!r}, which does not serve "
                    f"{key}: wait for it to end, or run workers that register both versions",
                    step=t["step"])


async def _write_steps(tx: Tx, eid: UUID, plan: MigrationPlan, new: Shape,
                       ended_at: dict[str, datetime | None]) -> None:
    """Drop the old version's unstarted steps and write the rebuilt ones (step order)."""
    if plan.dropped:
        await tx.run("step_delete_many_if_waiting", execution_id=eid, steps=list(plan.dropped))
    names = sorted(plan.states)
    if not names:
        return
    states = [plan.states[n] for n in names]
    firsts = [min((at for u in new[n].after if (at := ended_at.get(u)) is not None), default=None)
              for n in names]
    written = await tx.run(
        "step_upsert_many_if_unstarted",
        execution_id=eid,
        steps=names,
        up_totals=[len(new[n].after) for n in names],
        **state_columns(states),
        first_upstream_ats=firsts,
    )
    if written != len(names):  # under the execution lock no step can have started meanwhile
        raise KonduitError(f"execution {eid}: {len(names) - written} step rows changed under "
                           "the execution lock during a migration")


async def migrate(db: Database, registry: Registry, eid: UUID, to_version: int, *,
                  register: Register, max_payload_bytes: int) -> MigrationRecord:
    """:func:`migrate_in` in a transaction of its own. The caller's own definition of the
    target version, when it has one, is registered first (``register``: the client's, which
    refuses a different definition under the same version)."""
    row = await db.one("execution_get", id=eid)
    if row is None:
        await refuse_if_moved(db, eid, "migrate")
        raise ExecutionNotFound(f"no execution with id {eid}")
    check_version(to_version)
    code = target_code(registry, row["workflow_name"], to_version)
    if code is not None:
        await register(code)
    return await db.atomic(lambda tx: migrate_in(tx, registry, eid, to_version,
                                                 max_payload_bytes=max_payload_bytes))


async def migrate_all(db: Database, registry: Registry, workflow: str, from_version: int,
                      to_version: int, *, register: Register,
                      max_payload_bytes: int) -> list[MigrationRecord]:
    """Migrate every running execution of ``workflow`` at ``from_version``, oldest first, each
    in its own transaction: a refused one is reported (``migrated=False``, the reason and the
    step) and the others go on."""
    check_text(workflow, "workflow")
    check_version(from_version, "from_version")
    check_version(to_version)
    rows = await db.all("execution_list_running_of_version", workflow_name=workflow,
                        workflow_version=from_version)
    done: list[MigrationRecord] = []
    for eid in (r["id"] for r in rows):
        try:
            done.append(await migrate(db, registry, eid, to_version, register=register,
                                      max_payload_bytes=max_payload_bytes))
        except MigrationRefused as refused:
            done.append(MigrationRecord(
                execution_id=eid, workflow=workflow, from_version=from_version,
                to_version=to_version, migrated=False, reason=str(refused), step=refused.step))
    return done
