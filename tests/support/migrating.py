"""Workflows in two versions and a way to drive their tasks by hand, for the migration tests."""

from __future__ import annotations

import json
from uuid import UUID

import konduit
from konduit.bench.harness import claim
from konduit.core.model import Command
from konduit.db.database import Database
from konduit.engine.client import Client
from konduit.engine.completer import Recorded, record
from konduit.engine.registry import Registry


def versioned(version: int, graph: dict[str, list[str]], name: str = "flow",
              joins: dict[str, konduit.Join] | None = None) -> konduit.Workflow:
    """A workflow whose steps (step -> upstreams, in definition order) return their name."""
    wf = konduit.Workflow(name, version=version)
    for step, after in graph.items():
        def handler(ctx: konduit.Context) -> str:
            return ctx.step

        join = (joins or {}).get(step) or (konduit.Join.all_done() if len(after) > 1 else None)
        wf.step(name=step, after=after, join=join)(handler)
    return wf


async def run_ready(db: Database, registry: Registry, *, only: set[str] | None = None,
                    limit: int = 50) -> list[str]:
    """Claim the ready tasks (of ``only`` those steps: the others are released) and end each
    succeeded with its step's name as payload; returns the steps run."""
    ran: list[str] = []
    for task in await claim(db, registry, limit):
        if only is not None and task.step not in only:
            await record(db, registry, task.completion(Command.RELEASE))
            continue
        outcome, _ = await record(db, registry, task.completion(
            "succeeded", payload_json=json.dumps(task.step), payload=task.step))
        assert outcome is Recorded.ENDED, (task.step, outcome)
        ran.append(task.step)
    return ran


async def task_rows(db: Database, execution_id: UUID) -> list[dict[str, object]]:
    """(step, status, workflow label) of every task of an execution, in id order."""
    async with db.transaction() as tx:
        cur = await tx.conn.execute(
            "SELECT step, status, workflow FROM konduit_tasks WHERE execution_id = %s ORDER BY id",
            (execution_id,))
        return [dict(r) for r in await cur.fetchall()]


async def register(db: Database, registry: Registry) -> None:
    """Record every version of ``registry`` in the database, as a worker does when it starts."""
    await Client(db, registry).register_all()
