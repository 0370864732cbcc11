"""Start claimed tasks' handlers: one claim's handlers together, under one lease check.

The task rows are share-locked by that check (one statement, rows in id order) while the
handlers start, so a cancel that commits after the check waits for them to have started, and
one that committed before it is seen: no handler ever starts after its execution's cancel
committed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from konduit.core.context import Context
from konduit.core.model import Completion, TaskAttempt
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database
from konduit.engine.registry import Registry
from konduit.errors import DatabaseError, KonduitError
from konduit.worker.connectivity import Connectivity, retrying
from konduit.worker.executor import Executor

log = logging.getLogger(__name__)

Jobs = dict[int, asyncio.Task[Completion] | None]
"""The handlers one start launched, by :attr:`TaskAttempt.key`; None where the lease no longer held
the task."""


class Starter:
    """Starts handlers for a worker; records each one's context in ``contexts`` (the worker's
    map, by :attr:`TaskAttempt.key`) before it runs, its ``ctx.heartbeat()`` calling ``beat_now``."""

    def __init__(self, db: Database, registry: Registry, executor: Executor,
                 contexts: dict[int, Context], connectivity: Connectivity, *,
                 lease_seconds: float = 15.0, heartbeat_interval: float = 5.0,
                 beat_now: Callable[[], None] | None = None):
        self.beat_now = beat_now
        self.lease_seconds = lease_seconds
        self.heartbeat_interval = heartbeat_interval
        self.db = db
        self.registry = registry
        self.executor = executor
        self.contexts = contexts
        self.connectivity = connectivity

    async def start_claimed(self, claimed: list[TaskAttempt]) -> Jobs:
        """Start one claim's handlers in one transaction (through outages). When that fails for
        another reason, nothing started: each task is then started alone (an empty answer), so
        one task the database refuses cannot keep the others from running."""
        try:
            items = [(self.registry.get(t.workflow_name, t.workflow_version), t) for t in claimed]
            return await retrying(lambda: self.start_many(items), self.connectivity)
        except (DatabaseError, KonduitError) as exc:
            if len(claimed) == 1:
                raise
            log.warning("starting %s tasks together failed (%s); starting each alone",
                        len(claimed), exc)
            return {}

    async def start(self, spec: WorkflowSpec, task: TaskAttempt) -> asyncio.Task[Completion] | None:
        """Start one task's handler (see :meth:`start_many`); None if its lease no longer holds."""
        return (await self.start_many([(spec, task)])).get(task.key)

    async def start_many(self, items: list[tuple[WorkflowSpec, TaskAttempt]]) -> Jobs:
        """Start the handlers while their task rows are share-locked by one lease check. One
        transaction for a whole claim; the upstream payloads are read in it too (a root step
        reads nothing).

        Raises only while no handler has started (a caller may then try again); once one has,
        a failure to end the transaction (its locks go with the connection) changes nothing."""
        jobs: Jobs = {task.key: None for _, task in items}
        leased = sorted((pair for pair in items if pair[1].lease_token is not None),
                        key=lambda pair: pair[1].id)
        if not leased:
            return jobs
        started_any = False
        try:
            # Pipelined when no handler reads upstream (root steps): BEGIN goes out with the
            # check instead of in a round trip of its own. A join's read may stream a wide map's
            # outputs through a cursor, which a pipelined transaction cannot hold.
            pipeline = not any(spec[task.step].after for spec, task in leased)
            async with self.db.transaction(pipeline=pipeline) as tx:
                rows = await tx.all(
                    "task_hold_many_if_leased",
                    ids=[task.id for _, task in leased],
                    lease_tokens=[task.lease_token for _, task in leased],
                )
                held = {row["id"] for row in rows}
                began = time.monotonic()
                ready = [(spec, task, await self.executor.context_for(spec, task, tx))
                         for spec, task in leased if task.id in held]
                if time.monotonic() - began > self.heartbeat_interval:
                    # The upstream reads took longer than a beat (a join over a wide map): our
                    # share locks made the heartbeat skip these rows all along (it never waits
                    # on a lock), so their leases ran on unextended. Extend them here, under the
                    # locks, before anything else can see the rows unlocked; the rescue skips a
                    # row that is locked, so nothing took them meanwhile.
                    await tx.all(
                        "task_extend_leases_if_held",
                        ids=[task.id for _, task, _ in ready],
                        lease_tokens=[task.lease_token for _, task, _ in ready],
                        lease_seconds=self.lease_seconds,
                    )
                waits = []
                for spec, task, ctx in ready:
                    ctx._on_heartbeat = self.beat_now
                    self.contexts[task.key] = ctx
                    started = asyncio.Event()
                    job = asyncio.create_task(self.executor.run(spec, task, ctx, started=started))
                    jobs[task.key] = job
                    started_any = True
                    waits.append(_started(job, started))
                await asyncio.gather(*waits)
        except DatabaseError as exc:
            if not started_any:
                raise
            log.info("the lease check of %s started task(s) did not end cleanly (%s); their "
                     "handlers run on", len(leased), exc)
        return jobs


async def _started(job: asyncio.Task[Completion], started: asyncio.Event) -> None:
    """Return once the handler has been handed its context (or its attempt already ended)."""
    if started.is_set() or job.done():
        return
    waiter = asyncio.create_task(started.wait())
    try:
        await asyncio.wait([job, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


def cancel_job(starting: asyncio.Future[Jobs], task_id: int) -> None:
    """Cancel the handler that ``starting`` launched for ``task_id``, if it launched one."""
    if starting.cancelled() or starting.exception() is not None:
        return
    job = starting.result().get(task_id)
    if job is not None:
        job.cancel()
