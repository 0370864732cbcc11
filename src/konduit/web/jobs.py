"""Bulk operations as background jobs of the dashboard's server: ``POST /api/v1/bulk-jobs``
starts one and answers at once, ``GET /api/v1/bulk-jobs/{id}`` says how far it got, batch by
batch (:func:`konduit.engine.bulk.run_bulk` tells the job after each one).

A job lives in the memory of the server process that runs it: a restart of that process stops
it and forgets it. Nothing is lost by that: every batch it finished is committed, and running
the same filter again skips what was done (a redriven execution is running, a cancelled one is
cancelled: the action no longer applies to either). The most recent :data:`KEPT` jobs are kept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID, uuid4

from konduit.core.requests import BulkRequest
from konduit.records import BulkResult

log = logging.getLogger(__name__)

KEPT = 100
"""How many jobs (running or ended) a server remembers; the oldest ended ones go first."""


@dataclass
class BulkJob:
    """One bulk operation running (``state``: ``running``, ``succeeded``, ``failed``) with the
    counts of the batches done so far (``progress``), or why it failed (``error``)."""

    id: UUID
    request: BulkRequest
    state: str = "running"
    progress: BulkResult | None = None
    error: str | None = None
    started_at: float = 0.0
    ended_at: float | None = None


class BulkJobs:
    """The bulk jobs of one server."""

    def __init__(self) -> None:
        self._jobs: OrderedDict[UUID, BulkJob] = OrderedDict()
        self._tasks: dict[UUID, asyncio.Task[None]] = {}

    def start(self, request: BulkRequest,
              run: Callable[[BulkRequest, Callable[[BulkResult], None]], Awaitable[BulkResult]],
              ) -> BulkJob:
        """Start ``run(request, progress)`` on the server's loop; the job, at once."""
        job = BulkJob(uuid4(), request, started_at=time.time())

        def progress(result: BulkResult) -> None:
            job.progress = result

        async def body() -> None:
            try:
                job.progress = await run(request, progress)
                job.state = "succeeded"
            except Exception as exc:  # said by the job's status, and logged
                job.state, job.error = "failed", str(exc) or type(exc).__name__
                log.warning("bulk %s job %s failed: %s", request.action, job.id, job.error)
            finally:
                job.ended_at = time.time()
                self._tasks.pop(job.id, None)

        self._jobs[job.id] = job
        self._tasks[job.id] = asyncio.get_running_loop().create_task(body())
        self._forget()
        return job

    def get(self, job_id: UUID) -> BulkJob | None:
        """The job, or None when this server does not know it."""
        return self._jobs.get(job_id)

    def _forget(self) -> None:
        ended = [j for j in self._jobs.values() if j.state != "running"]
        while len(self._jobs) > KEPT and ended:
            self._jobs.pop(ended.pop(0).id, None)
