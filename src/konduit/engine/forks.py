"""Fork an execution: a new execution of the same workflow version that copies the outputs of
the steps a chosen step depends on from its origin and runs that step and the rest.

One transaction: lock the origin (its steps' outcomes are read under the lock), plan
(:func:`konduit.core.repair.plan_fork`: the join state of every step that runs is rebuilt by the
decision a repair uses, so each join fires exactly once), create the new execution on the start
path with no root task, copy the ended steps' rows, tasks and outputs from the origin, and start
the steps whose upstreams all stand (:meth:`konduit.engine.advancer.Advancer.start_steps`).
Every refusal is raised before anything is written.

An origin that still runs may be forked: only steps that ended succeeded or degraded are
copied, and a step of a running execution that ended never changes again (a repair, which adds
a generation, needs a finished execution; the fork copies the latest generation).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING
from uuid import UUID

from konduit.core.advance import ExecutionState
from konduit.core.model import ExecutionStatus
from konduit.core.repair import plan_fork
from konduit.core.requests import ForkRequest, StartRequest
from konduit.db.database import Tx
from konduit.engine.advancer import Advancer
from konduit.engine.starts import insert_executions, prepare_many_off_loop
from konduit.engine.step_rows import state_columns
from konduit.engine.stored import NoCode
from konduit.errors import ExecutionNotFound, blame

if TYPE_CHECKING:
    from konduit.engine.client import Client


async def copy_stored(tx: Tx, execution_id: UUID) -> None:
    """Give a fork its own copy of each stored payload it took from its origin, so that pruning
    either execution removes only what is its own."""
    store = tx.io.store
    rows = await tx.all("output_list_stored_by_execution", execution_id=execution_id)
    for row in rows:
        env = json.loads(row["envelope"])
        ref = str(env["ref"])
        mine = f"{execution_id}/{ref.rpartition('/')[2]}"
        if ref == mine:
            continue
        await asyncio.to_thread(store.copy, ref, mine)
        env["ref"] = mine
        await tx.run("output_set_envelope", execution_id=execution_id, step=row["step"],
                     map_index=row["map_index"], content_hash=row["content_hash"],
                     envelope=json.dumps(env, separators=(",", ":")))


async def fork(client: Client, request: ForkRequest) -> UUID:
    """What :meth:`konduit.engine.client.Client.fork` does; returns the new execution's id."""
    eid = await client.resolve(request.execution_id)
    # The origin may have moved into the history: it finished and no longer changes, and a
    # fork only reads it (its rows, through the views of migration 0041).
    row = await client.db.one("execution_get_with_history", id=eid)
    if row is None:
        raise ExecutionNotFound(f"no execution with id {eid}")
    name, version = row["workflow_name"], row["workflow_version"]
    # Without the workflow's code, from its registered definition (the workers run the steps).
    await client.specs.load(client.db, name, version)
    start = StartRequest(name, row["input"] if request.input is None else request.input,
                         version=version)
    with blame("input"):
        [prepared] = await prepare_many_off_loop(client.specs, [start],
                                                 max_bytes=client.max_payload_bytes, one=True)
    spec = prepared.spec
    if not client.specs.is_stored(spec):
        await client.register(spec)
    async with client.db.transaction() as tx:
        origin = await tx.one("execution_lock", id=eid)
        if origin is None and await tx.one("execution_get_in_history", id=eid) is None:
            raise ExecutionNotFound(f"no execution with id {eid}")
        statuses = {s["step"]: s["status"]
                    for s in await tx.all("step_get_all_with_history", execution_id=eid)}
        routes = {r["step"]: frozenset(r["routes"]) if r["routes"] is not None else None
                  for r in await tx.all("task_list_routes_latest_with_history",
                                        execution_id=eid)}
        with blame("from_step"):
            planned = plan_fork(spec, statuses, routes, request.from_step)
        plan = planned.plan
        maps = [n for n in plan.rerun if spec[n].is_map]
        if maps and client.specs.is_stored(spec):
            raise NoCode(
                f"forking an execution of workflow {name!r} version {version} from step "
                f"{request.from_step!r} needs its code: its map step(s) {', '.join(maps)} run "
                "again and expand over() here; fork it from a process that has the code (the "
                "App, or konduit fork --app)")
        [new_id] = await insert_executions(tx, [prepared], roots=False)
        forked = await tx.one("execution_set_forked_if_running", id=new_id, origin_id=eid,
                              from_step=request.from_step, steps_pending=len(plan.rerun))
        assert forked is not None
        copied = list(planned.copied)
        if copied:
            await tx.run("step_copy_ended_from_origin", id=new_id, origin_id=eid, steps=copied)
            await tx.run("task_copy_ended_from_origin", id=new_id, origin_id=eid, steps=copied)
            await tx.run("output_copy_from_origin", id=new_id, origin_id=eid, steps=copied)
            if tx.io.store is not None:
                await copy_stored(tx, new_id)
        names = list(plan.rerun)
        await tx.run("step_reset_many", execution_id=new_id, steps=names,
                     **state_columns([plan.states[n] for n in names]))
        advancer = Advancer(
            tx, spec, new_id, ExecutionState(ExecutionStatus.RUNNING, len(names)),
            forked["generation"], max_payload_bytes=client.max_payload_bytes)
        await advancer.start_steps(list(plan.start))
    return new_id
