"""Repair or redrive a finished execution: lock it, plan which steps run again
(:mod:`konduit.core.repair`), reopen it and start them as a new generation of their tasks. The
one place the manual repair (:meth:`konduit.engine.client.Client.repair`), the automatic one
(:mod:`konduit.engine.auto_repair`) and a redrive (:meth:`konduit.engine.client.Client.redrive`,
one or in bulk: :mod:`konduit.engine.bulk`) reopen an execution.

The two differ in two choices only, both made here:

=========  ======================================  ==============================================
           accepts an execution that ended         re-runs the steps that ended
=========  ======================================  ==============================================
repair     succeeded, failed, timed_out            degraded, failed, timed_out, cancelled
redrive    failed, timed_out, cancelled            failed, timed_out, cancelled (degraded kept)
=========  ======================================  ==============================================

Everything else is one path: the execution row lock, the pure plan, the reopen statement (which
re-checks the status it read), the new generation of the re-run steps' tasks. Outputs of the
steps not re-run stay where they are (content-addressed), and so do the old generation's tasks:
a late completion of one of those is fenced by its lease, as every completion is."""

from __future__ import annotations

import json
from uuid import UUID

from konduit.core.advance import ExecutionState
from konduit.core.model import ExecutionStatus
from konduit.core.repair import REDRIVABLE, REPAIRABLE, plan_repair
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Tx
from konduit.engine import limit_keys
from konduit.engine.advancer import Advancer
from konduit.engine.starts import rerun_keys_off_loop
from konduit.engine.step_rows import state_columns
from konduit.engine.stored import SpecSource
from konduit.errors import ExecutionNotFound, KonduitError, NotRedrivable

REPAIR_FROM = (ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.TIMED_OUT)
"""The statuses of an execution a repair accepts."""
REDRIVE_FROM = (ExecutionStatus.FAILED, ExecutionStatus.TIMED_OUT, ExecutionStatus.CANCELLED)
"""The statuses of an execution a redrive accepts."""


async def repair_in(tx: Tx, registry: SpecSource, eid: UUID, *, max_payload_bytes: int,
                    redrive: bool = False) -> list[str]:
    """What :meth:`konduit.engine.client.Client.repair` (or, with ``redrive``,
    :meth:`~konduit.engine.client.Client.redrive`) does, inside the caller's transaction (the
    automatic repair claims the execution in the same one; a bulk redrive does a batch in
    one): lock it, plan, reopen it, start the re-run steps. Every refusal is raised before
    anything is written, so a caller may go on in the same transaction."""
    row = await tx.one("execution_lock", id=eid)
    if row is None:
        raise ExecutionNotFound(f"no execution with id {eid}")
    if redrive and row["status"] not in REDRIVE_FROM:
        hint = (" (repair re-runs the degraded steps of a succeeded one)"
                if row["status"] == ExecutionStatus.SUCCEEDED else "")
        raise NotRedrivable(
            f"execution {eid} is {row['status']}: only a failed, timed-out or cancelled "
            f"execution can be redriven{hint}"
        )
    if not redrive and row["status"] not in REPAIR_FROM:
        raise KonduitError(
            f"execution {eid} is {row['status']}: only a finished, not cancelled, "
            "execution can be repaired"
            + (" (redrive runs a cancelled one again)"
               if row["status"] == ExecutionStatus.CANCELLED else "")
        )
    spec = registry.get(row["workflow_name"], row["workflow_version"])
    steps = await tx.all("step_get_all", execution_id=eid)
    routes = await tx.all("task_list_routes_latest", execution_id=eid)
    plan = plan_repair(
        spec,
        {s["step"]: s["status"] for s in steps},
        {r["step"]: frozenset(r["routes"]) if r["routes"] is not None else None
         for r in routes},
        REDRIVABLE if redrive else REPAIRABLE,
    )
    run_key, step_keys = await _keys_if_missing(tx, spec, eid)
    reopened = await tx.one(
        "execution_reopen_if_finished", id=eid, steps_pending=len(plan.rerun),
        from_statuses=list(REDRIVE_FROM if redrive else REPAIR_FROM), run_key=run_key,
        limit_keys=None if step_keys is None else json.dumps(step_keys),
    )
    assert reopened is not None
    names = list(plan.rerun)
    states = [plan.states[n] for n in names]
    await tx.run(
        "step_reset_many",
        execution_id=eid,
        steps=names,
        **state_columns(states),
    )
    advancer = Advancer(
        tx, spec, eid, ExecutionState(ExecutionStatus.RUNNING, len(plan.rerun)), reopened["generation"],
        max_payload_bytes=max_payload_bytes,
    )
    await advancer.start_steps(list(plan.start))
    if reopened["run_key"] is not None and spec.max_running is not None:
        # Workflow(max_running=): running again takes a slot of its key, as a start does (the
        # reopen gave a key to one started before the workflow had max_running).
        await limit_keys.admit_reopened(tx, eid, row["workflow_name"], reopened["run_key"],
                                        spec.max_running)
    return names


async def _keys_if_missing(tx: Tx, spec: WorkflowSpec,
                           eid: UUID) -> tuple[str | None, dict[str, str] | None]:
    """The keys its start would give now an execution started without them (before its
    workflow had ``max_running``, or before a step of it had a per-key ``concurrency=`` or
    ``rate=``: operating settings, changed without a new version), so that running again is
    limited as its start would have been: its key under ``max_running`` (None when the workflow
    has none or the execution has its key) and the keys of its per-key limited steps it lacks
    (None when none: the reopen keeps the keys it has). Raised before anything is written: a
    key function's refusal refuses this repair or redrive only."""
    if spec.max_running is None and not spec.flow_keys:
        return None, None
    row = await tx.one("execution_get_input_if_keys_missing", id=eid,
                       run_key=spec.max_running is not None, steps=list(spec.flow_keys))
    if row is None:
        return None, None
    if spec.run_key is None and not row["steps_missing"]:
        return "", None  # one slot set for the whole workflow: no key function to run
    return await rerun_keys_off_loop(spec, row["input"], run_key=row["run_key_missing"],
                                     steps=row["steps_missing"])
