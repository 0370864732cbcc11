"""Repair a finished execution: lock it, plan which steps run again (:mod:`konduit.core.repair`),
reopen it and start them as a new generation of their tasks. The one place both the manual
repair (:meth:`konduit.engine.client.Client.repair`) and the automatic one
(:mod:`konduit.engine.auto_repair`) reopen an execution."""

from __future__ import annotations

from uuid import UUID

from konduit.core.advance import ExecutionState
from konduit.core.model import ExecutionStatus
from konduit.core.repair import plan_repair
from konduit.db.database import Tx
from konduit.engine.advancer import Advancer
from konduit.engine.step_rows import state_columns
from konduit.engine.stored import SpecSource
from konduit.errors import ExecutionNotFound, KonduitError


async def repair_in(tx: Tx, registry: SpecSource, eid: UUID, *, max_payload_bytes: int) -> list[str]:
    """What :meth:`konduit.engine.client.Client.repair` does, inside the caller's transaction
    (the automatic repair claims the execution in the same one): lock it, plan, reopen it,
    start the re-run steps."""
    row = await tx.one("execution_lock", id=eid)
    if row is None:
        raise ExecutionNotFound(f"no execution with id {eid}")
    if row["status"] in (ExecutionStatus.RUNNING, ExecutionStatus.PENDING,
                         ExecutionStatus.SCHEDULED, ExecutionStatus.CANCELLED):
        raise KonduitError(
            f"execution {eid} is {row['status']}: only a finished, not cancelled, "
            "execution can be repaired"
        )
    spec = registry.get(row["workflow_name"], row["workflow_version"])
    steps = await tx.all("step_get_all", execution_id=eid)
    routes = await tx.all("task_list_routes_latest", execution_id=eid)
    plan = plan_repair(
        spec,
        {s["step"]: s["status"] for s in steps},
        {r["step"]: frozenset(r["routes"]) if r["routes"] is not None else None
         for r in routes},
    )
    reopened = await tx.one(
        "execution_reopen_if_finished", id=eid, steps_pending=len(plan.rerun)
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
    return names
