"""What the pages, the API and the command line show of executions: details, lists, searches,
tasks, steps, attempts and their logs, maps, payloads, parents and children, dead letters."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from konduit.core.durations import Duration
from konduit.core.payloads import is_sealed
from konduit.core.repair_contract import AutoRepairState, RepairContract
from konduit.core.repair_contract import describe as describe_auto_repair
from konduit.core.results import ExecutionResult
from konduit.core.search import ExecutionFilter
from konduit.core.values import MAX_BIGINT, check_whole
from konduit.db.database import Database
from konduit.db.sealing import sealed_words
from konduit.engine import retention
from konduit.engine.client import execution_result
from konduit.engine.retention import Prunable
from konduit.engine.search import search_executions
from konduit.errors import ExecutionNotFound, KonduitError
from konduit.reads.base import ReadBase
from konduit.records import (
    AttemptLog,
    AttemptRecord,
    ChildExecution,
    DeadLetter,
    DeadLetterWithStatus,
    ExecutionFound,
    ExecutionProgress,
    ExecutionRecord,
    ExecutionSummary,
    FailedAttempt,
    JournalEntry,
    MapItem,
    MapStepCounts,
    OpenTask,
    OutputVersion,
    ParentLink,
    Payload,
    StepBudget,
    StepMark,
    StepRecord,
    StreamRecord,
    TaskRecord,
)


class ExecutionReads(ReadBase):
    """The reads of executions and what they are made of."""

    async def view(self, execution_id: UUID | str) -> ExecutionResult:
        """What :meth:`konduit.engine.client.Client.get` answers, read where the pages' and the
        API's reads go (a read replica within its lag bound): for showing, not for acting on."""
        eid = await self.resolve(execution_id)

        async def read(db: Database) -> ExecutionResult:
            row = await db.one("execution_get_with_history", id=eid)
            if row is None:
                raise ExecutionNotFound(f"no execution with id {eid}")
            steps = await db.all("step_get_all_with_history", execution_id=eid)
            return execution_result(row, {s["step"]: s["status"] for s in steps})

        return await self.reads.call(read)

    async def execution(self, execution_id: UUID | str) -> ExecutionRecord:
        """One execution whole (input, output, window, limits); raises
        :class:`ExecutionNotFound`."""
        eid = await self.resolve(execution_id)

        async def read(db: Database) -> ExecutionRecord:
            row = await db.one("execution_get_with_history", id=eid)
            if row is None:  # raised inside: a replica that lacks it hands over to the primary
                raise ExecutionNotFound(f"no execution with id {eid}")
            return ExecutionRecord.from_row(row)

        return await self.reads.call(read)

    async def page(self, *, status: str | None = None, workflow: str | None = None,
                   before: tuple[datetime, UUID] | None = None,
                   limit: int = 50) -> builtins.list[ExecutionSummary]:
        """Executions newest first, older than ``before`` (the (created_at, id) of the previous
        page's last one): keyset pages, stable while executions start."""
        before_at, before_id = before if before is not None else (None, None)
        rows = await self.reads.all("execution_list_older_than_cursor", status=status,
                                 workflow_name=workflow, before_at=before_at,
                                 before_id=before_id, limit=limit)
        return [ExecutionSummary.from_row(r) for r in rows]

    async def progress(self, ids: Iterable[UUID]) -> builtins.list[ExecutionProgress]:
        """How each of these executions stands now (unknown ids are left out)."""
        wanted = builtins.list(ids)
        if not wanted:
            return []
        rows = await self.reads.all("execution_status_many", ids=wanted)
        return [ExecutionProgress.from_row(r) for r in rows]

    async def marked_steps(self, ids: Iterable[UUID]) -> builtins.list[StepMark]:
        """The degraded, failed and timed-out steps of these executions."""
        wanted = builtins.list(ids)
        if not wanted:
            return []
        rows = await self.reads.all("step_list_degraded_or_failed_for_executions", ids=wanted)
        return [StepMark.from_row(r) for r in rows]

    async def search(self, where: ExecutionFilter | None = None, *,
                     before: tuple[datetime, UUID] | None = None,
                     limit: int = 50) -> builtins.list[ExecutionFound]:
        """Executions matching ``where`` (:class:`~konduit.core.search.ExecutionFilter`: id
        start or end, idempotency key, tags, input fields, status, workflow@version, time
        range), newest first, older than ``before`` (the (created_at, id) of the previous
        page's last one). Every part is answered by an index (migration 0024)."""
        return await self.reads.call(lambda db: search_executions(
            db, where or ExecutionFilter(), before=before, limit=limit))

    async def list(
        self, *, status: str | None = None, workflow: str | None = None, limit: int = 50,
        **search: Any,
    ) -> builtins.list[ExecutionResult]:
        """Recent executions, newest first; with any part of a search (``tags``,
        ``idempotency_key``, ``input``, ``since``, ``until``, ``id_prefix``, ``version``: see
        :class:`~konduit.core.search.ExecutionFilter`) the ones :meth:`search` finds."""
        if not search:
            rows = await self.reads.all("execution_list_older_than_cursor", status=status,
                                        workflow_name=workflow, before_at=None, before_id=None,
                                        limit=limit)
            return [execution_result(r, {}) for r in rows]
        try:
            where = ExecutionFilter(status=status, workflow=workflow, **search)
        except TypeError as exc:
            raise KonduitError(f"list: {exc}") from None
        return [ExecutionResult(id=r.id, workflow=r.workflow_name, version=r.workflow_version,
                                status=r.status, output=None, error=r.error, outcomes={},
                                created_at=r.created_at, finished_at=r.finished_at)
                for r in await self.search(where, limit=limit)]

    async def outputs(self, execution_id: UUID | str) -> builtins.list[OutputVersion]:
        """Every output version of an execution (repairs add versions), oldest first."""
        rows = await self.reads.all("execution_output_list", id=await self.resolve(execution_id))
        return [OutputVersion.from_row(r) for r in rows]

    async def payloads(self, execution_id: UUID | str) -> builtins.list[Payload]:
        """Every payload an execution's tasks produced: the handler's, the fallback's, and late
        results that arrived after a deadline ended their attempt (``source``), each marked
        ``current`` when it is the one downstream steps consumed."""
        rows = await self.reads.all("output_list_by_execution",
                                 execution_id=await self.resolve(execution_id))
        return [Payload.from_row(r) for r in rows]

    async def tasks(self, execution_id: UUID | str) -> builtins.list[TaskRecord]:
        """Every task of an execution (all generations), with attempts and errors."""
        rows = await self.reads.all("task_list_by_execution",
                                 execution_id=await self.resolve(execution_id))
        return [TaskRecord.from_row(r) for r in rows]

    async def steps(self, execution_id: UUID | str) -> builtins.list[StepRecord]:
        """Every step of an execution with its join counters and timings (fan-in wait)."""
        rows = await self.reads.all("step_get_all_with_history",
                                    execution_id=await self.resolve(execution_id))
        return [StepRecord.from_row(r) for r in rows]

    async def attempts(self, execution_id: UUID | str, *,
                       except_steps: Iterable[str] = ()) -> builtins.list[AttemptRecord]:
        """Every attempt of an execution's tasks, oldest first, but those of ``except_steps``
        (the map steps a page shows as one row each)."""
        eid = await self.resolve(execution_id)
        skipped = builtins.list(except_steps)
        if skipped:
            rows = await self.reads.all("attempt_list_by_execution_except_steps",
                                     execution_id=eid, steps=skipped)
        else:
            rows = await self.reads.all("attempt_list_by_execution", execution_id=eid)
        return [AttemptRecord.from_row(r) for r in rows]

    async def attempt_logs(self, execution_id: UUID | str, *,
                           limit: int | None = None) -> builtins.list[AttemptLog]:
        """What the handlers of an execution logged, attempt by attempt, oldest first (only
        attempts that logged anything, at most ``limit`` of them; see ``Context.log``)."""
        rows = await self.reads.all("attempt_log_list_by_execution",
                                 execution_id=await self.resolve(execution_id), limit=limit)
        return [AttemptLog.from_row(_logs_shown(r)) for r in rows]

    async def journal(self, execution_id: UUID | str, *,
                      limit: int | None = None) -> builtins.list[JournalEntry]:
        """The recorded durable calls of an execution (``ctx.call``), by step, item and
        position, at most ``limit`` of them."""
        io = self.reads.io
        rows = await self.reads.all("journal_list_by_execution",
                                 execution_id=await self.resolve(execution_id), limit=limit,
                                 sealed=io.active)
        if not io.active:
            return [JournalEntry.from_row(r) for r in rows]
        # Under a codec or a payload store the size is the result's, not its envelope's (the
        # envelope's only when this process cannot open it).
        entries = []
        for r in rows:
            size = io.plain_size(r["result_text"])
            entries.append(JournalEntry.from_row(
                r if size is None else {**r, "result_bytes": size}))
        return entries

    async def streams(self, execution_id: UUID | str) -> builtins.list[StreamRecord]:
        """The durable streams of an execution (``ctx.stream``), by name."""
        rows = await self.reads.all("stream_list_of_execution",
                                    execution_id=await self.resolve(execution_id))
        return [StreamRecord.from_row(r) for r in rows]

    async def failed_attempts(self, execution_id: UUID | str,
                              per_step: int) -> builtins.list[FailedAttempt]:
        """The attempts that ended with an error, at most ``per_step`` of each step."""
        rows = await self.reads.all("attempt_list_failed_by_execution",
                                 execution_id=await self.resolve(execution_id),
                                 per_step=per_step)
        return [FailedAttempt.from_row(r) for r in rows]

    async def map_counts(self, execution_id: UUID | str,
                         steps: Iterable[str]) -> builtins.list[MapStepCounts]:
        """For each of these (map) steps and generation: tasks per status, tries, durations."""
        wanted = builtins.list(steps)
        if not wanted:
            return []
        rows = await self.reads.all("task_summarize_by_step",
                                 execution_id=await self.resolve(execution_id), steps=wanted)
        return [MapStepCounts.from_row(r) for r in rows]

    async def map_items(self, execution_id: UUID | str, step: str, *, status: str | None = None,
                        from_index: int = 0, limit: int = 100) -> builtins.list[MapItem]:
        """A page of one step's tasks of its latest generation, in item order, from
        ``from_index`` on, optionally of one status."""
        rows = await self.reads.all("task_list_by_step_page",
                                 execution_id=await self.resolve(execution_id), step=step,
                                 status=status, from_index=from_index, limit=limit)
        return [MapItem.from_row(r) for r in rows]

    async def parent(self, execution_id: UUID | str) -> ParentLink | None:
        """The execution whose child-workflow step started this one, or None."""
        row = await self.reads.one("execution_parent_of",
                                execution_id=await self.resolve(execution_id))
        return None if row is None else ParentLink.from_row(row)

    async def children(self, execution_id: UUID | str) -> builtins.list[ChildExecution]:
        """The executions this one's child-workflow steps started."""
        rows = await self.reads.all("execution_children_list",
                                 execution_id=await self.resolve(execution_id))
        return [ChildExecution.from_row(r) for r in rows]

    async def fork_origin(self, execution_id: UUID | str) -> dict[str, Any] | None:
        """Where a fork came from (:meth:`konduit.App.fork`): ``forked_from`` (the origin's
        id), ``forked_at_step`` and ``origin_status`` (None once the origin was pruned); None
        for an execution that is not a fork."""
        row = await self.reads.one("execution_get_fork_origin",
                                   id=await self.resolve(execution_id))
        if row is None:
            return None
        origin = await self.reads.one("execution_get_with_history", id=row["forked_from"])
        return {**row, "origin_status": None if origin is None else origin["status"]}

    async def forks(self, execution_id: UUID | str, *,
                    limit: int = 100) -> builtins.list[dict[str, Any]]:
        """The forks of an execution, oldest first: ``id``, ``status``, ``forked_at_step``,
        ``created_at`` of each (at most ``limit``)."""
        rows = await self.reads.all("execution_list_forks",
                                    id=await self.resolve(execution_id), limit=limit)
        return [dict(r) for r in rows]

    async def budgets(self, execution_id: UUID | str) -> builtins.list[StepBudget]:
        """Each step's time budget in the latest generation (a window may have cut it)."""
        rows = await self.reads.all("task_list_budgets_by_execution",
                                 execution_id=await self.resolve(execution_id))
        return [StepBudget.from_row(r) for r in rows]

    async def open_tasks(self, execution_id: UUID | str, *,
                         limit: int = 500) -> builtins.list[OpenTask]:
        """Why an execution is where it is: its unfinished tasks (ready, in backoff, running
        with their worker's heartbeat age, waiting for an event, a timer or a child) and the
        tasks that made a durable wait, at most ``limit``."""
        rows = await self.reads.all("task_list_open_or_waited_by_execution",
                                 execution_id=await self.resolve(execution_id), limit=limit)
        return [OpenTask.from_row(r) for r in rows]

    async def auto_repair_status(self, execution_id: UUID | str) -> str | None:
        """How the automatic repair (``repair_within``) of an execution stands, as one line,
        or None when its workflow has no repair contract or it is not covered by it."""
        eid = await self.resolve(execution_id)
        row = await self.db.one("execution_get_auto_repair", id=eid)
        if row is None:
            raise ExecutionNotFound(f"no execution with id {eid}")
        state = AutoRepairState(
            status=row["status"], finished_at=row["finished_at"],
            auto_repair_at=row["auto_repair_at"], auto_repair_error=row["auto_repair_error"],
            degraded=tuple(row["degraded"]), contract=RepairContract.from_spec(row["spec"]),
        )
        return describe_auto_repair(state, datetime.now(UTC))

    async def dead_letters(self, limit: int = 50) -> builtins.list[DeadLetter]:
        """Tasks that failed for good (retries exhausted or non-retryable), newest first."""
        check_whole(limit, "limit", high=MAX_BIGINT)
        return [DeadLetter.from_row(r) for r in await self.reads.all("task_list_dead", limit=limit)]

    async def dead_letter_page(self, *, before: tuple[datetime, int] | None = None,
                               limit: int = 100) -> builtins.list[DeadLetterWithStatus]:
        """Dead letters newest first, older than ``before`` (the (finished_at, id) of the
        previous page's last one), each with its execution's status."""
        before_at, before_id = before if before is not None else (None, None)
        rows = await self.reads.all("task_list_dead_older_than_cursor", before_at=before_at,
                                 before_id=before_id, limit=limit)
        return [DeadLetterWithStatus.from_row(r) for r in rows]

    async def count_prunable(self, older_than: Duration) -> Prunable:
        """What :meth:`konduit.engine.client.Client.prune` with the same ``older_than`` would
        consider, deleting nothing."""
        return await retention.count_prunable(self.db, older_than)


def _logs_shown(row: Any) -> Any:
    """An attempt's log row with its records as a door shows them: sealed by a codec this
    process cannot open, one record that says so (``encrypted (key k1)``), never the envelope."""
    records = row["records"]
    if not is_sealed(records):
        return row
    return {**row, "records": [{"at": row["started_at"].timestamp(), "level": "",
                                "logger": "konduit", "message": sealed_words(records)}]}
