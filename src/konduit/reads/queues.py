"""The queues and the workers: ready depths and loads, running attempts, live and recent workers
(the queue page, the workers page and its strip)."""

from __future__ import annotations

import builtins

from konduit.reads.base import ReadBase
from konduit.records import OpenAttempt, QueueDepth, QueueLoad, WorkerRecord, WorkerState


class QueueReads(ReadBase):
    """The reads of queues and workers."""

    async def queue_loads(self) -> builtins.list[QueueLoad]:
        """Per queue and workflow version: ready depth, due, running, waiting, oldest-ready
        age (the queue page)."""
        rows = await self.reads.all("task_count_open_by_queue_and_workflow")
        return [QueueLoad.from_row(r) for r in rows]

    async def queues(self) -> builtins.list[QueueDepth]:
        """Ready tasks per queue and workflow, how many are due and the oldest due one's age."""
        return [QueueDepth.from_row(r) for r in await self.reads.all("task_count_ready_by_queue")]

    async def running_count(self) -> int:
        """How many executions are running now."""
        row = await self.reads.one("execution_count_running")
        return int(row["running"]) if row else 0

    async def recent_workers(self, since_seconds: float) -> builtins.list[WorkerState]:
        """Every worker heard from within ``since_seconds``: alive, stopped or dead."""
        rows = await self.reads.all("worker_list_recent_with_liveness", since_seconds=since_seconds)
        return [WorkerState.from_row(r) for r in rows]

    async def running_attempts(self, limit: int) -> builtins.list[OpenAttempt]:
        """The attempts running now (hedges too), with their worker, at most ``limit``."""
        rows = await self.reads.all("attempt_list_open_with_worker", limit=limit)
        return [OpenAttempt.from_row(r) for r in rows]

    async def workers(self, stale_seconds: float | None = None) -> builtins.list[WorkerRecord]:
        """Live workers (not stopped, heard from within ``stale_seconds``, else within their own
        lease): host, pid, queues, workflows served, isolation, slots, running tasks, abandoned
        threads and ``heartbeat_age`` in seconds."""
        rows = await self.reads.all("worker_list_live", stale_seconds=stale_seconds)
        return [WorkerRecord.from_row(r) for r in rows]
