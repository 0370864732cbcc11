"""Maintenance: return tasks whose lease expired (worker died or hung) to the DAG.

Runs in every worker; concurrent sweeps are safe because each reclaim goes through the same
lease-fenced completion as a worker's own write, so only one of them changes a task.
"""

from __future__ import annotations

import logging

from konduit.db.database import Database
from konduit.engine.advancer import finish_execution
from konduit.engine.completer import Recorded, record
from konduit.engine.registry import Registry
from konduit.worker.executor import Claimed

log = logging.getLogger("konduit.maintenance")


async def reclaim_expired_leases(db: Database, registry: Registry, *, limit: int = 100) -> int:
    """Retry (or dead-letter, when attempts are exhausted) every task whose lease expired.
    Returns how many tasks were reclaimed."""
    rows = await db.all("task_list_expired_leases", limit=limit)
    reclaimed = 0
    for row in rows:
        async with db.transaction() as tx:
            task = await tx.one("task_get_for_reclaim", id=row["id"], lease_token=row["lease_token"])
        if task is None:
            continue
        try:
            registry.get(task["workflow_name"], task["workflow_version"])
        except Exception:
            continue  # another deployment's workflow: its own workers reclaim it
        lost = Claimed.from_row(task)
        completion = lost.completion(
            "failed" if lost.attempt >= lost.max_attempts else "retry",
            error=f"lease expired on worker {task['worker_id']} (attempt {lost.attempt})",
            attempt_outcome="lost",
        )
        outcome, _ = await record(db, registry, completion)
        if outcome is not Recorded.LEASE_LOST:
            reclaimed += 1
            log.info("reclaimed task %s (%s): %s", task["id"], task["step"], completion.error)
    return reclaimed


async def end_timed_out_executions(db: Database, *, limit: int = 100) -> int:
    """End running executions past their hard timeout as ``timed_out``; returns how many."""
    rows = await db.all("execution_list_timed_out", limit=limit)
    ended = 0
    for row in rows:
        async with db.transaction() as tx:
            execution = await tx.one("execution_lock", id=row["id"])
            if execution is None or execution["status"] != "running":
                continue
            if await finish_execution(
                tx, row["id"], "timed_out", None, "the execution exceeded its timeout",
                execution["steps_pending"],
            ):
                ended += 1
                log.info("execution %s timed out", row["id"])
    return ended
