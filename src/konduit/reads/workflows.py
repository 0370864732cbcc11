"""What is registered and who serves it: workflow versions side by side (docs/changing-workflows.md),
the policy each task was created with, event triggers, events kept for a step to come and
schedules."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from datetime import datetime
from uuid import UUID

from konduit.core.triggers import describe as describe_trigger
from konduit.core.values import check_text
from konduit.engine import triggers
from konduit.engine.registry import workflow_key
from konduit.engine.schedules import list_schedules
from konduit.reads.base import ReadBase
from konduit.records import (
    Answer,
    OpenInput,
    ScheduleRecord,
    TaskPolicy,
    TriggerRecord,
    VersionState,
    WorkflowRecord,
)


class WorkflowReads(ReadBase):
    """The reads of workflows, their versions, triggers and schedules."""

    async def workflows(self) -> builtins.list[WorkflowRecord]:
        """Every registered workflow version with its stored definition."""
        return [WorkflowRecord.from_row(r) for r in await self.reads.all("workflow_list_with_spec")]

    async def workflow(self, name: str, version: int) -> WorkflowRecord | None:
        """One registered workflow version, or None."""
        row = await self.reads.one("workflow_get", name=name, version=version)
        return None if row is None else WorkflowRecord.from_row(row)

    async def workflow_served(self, name: str, version: int) -> bool:
        """Whether any live worker claims tasks of workflow ``name`` at ``version``."""
        check_text(name, "name")
        row = await self.db.one("worker_serving_exists", workflow=workflow_key(name, version))
        return bool(row and row["serving"])

    async def versions(self, workflow: str | None = None) -> builtins.list[VersionState]:
        """Every registered workflow version (or those of ``workflow``): its running executions
        and the live workers serving it; ``unserved`` when executions run and no worker does."""
        check_text(workflow, "workflow")
        rows = await self.db.all("workflow_version_list_with_service", name=workflow)
        return [VersionState.from_row(r) for r in rows]

    async def task_policies(self, execution_id: UUID) -> builtins.list[TaskPolicy]:
        """The policy each task of an execution was created with, a map's items grouped."""
        rows = await self.db.all("task_policy_list_by_execution", execution_id=execution_id)
        return [TaskPolicy.from_row(r) for r in rows]

    async def unserved(self, ids: Iterable[UUID]) -> set[UUID]:
        """Which of these executions run under a version no live worker serves."""
        wanted = builtins.list(ids)
        if not wanted:
            return set()
        rows = await self.db.all("execution_list_unserved_by_ids", ids=wanted)
        return {r["id"] for r in rows}

    async def triggers(self, workflow: str | None = None) -> builtins.list[TriggerRecord]:
        """The stored event triggers (of ``workflow``) with their open bursts or batches,
        pending events and last event (docs/events.md)."""
        check_text(workflow, "workflow")
        return [TriggerRecord.from_row({**r, "mode": r["spec"].get("mode", "start"),
                                        "description": describe_trigger(r["spec"])})
                for r in await triggers.list_triggers(self.db, workflow)]

    async def kept_event(self, name: str, *, key: str | None = None,
                         execution_id: UUID | str | None = None) -> datetime | None:
        """Until when the newest event ``name`` (with this ``key`` and ``execution_id``) that
        no task has taken yet is kept for a step to come (``send_event`` answered ``"stored"``),
        or None when none is (docs/durable-waits.md)."""
        check_text(name, "name")
        check_text(key, "key")
        eid = None if execution_id is None else await self.resolve(execution_id)
        row = await self.db.one("event_kept_until", name=name, key=key, execution_id=eid)
        return None if row is None else row["expires_at"]

    async def inbox(self, *, execution_id: UUID | str | None = None,
                    limit: int = 100) -> builtins.list[OpenInput]:
        """Every ``wait_for_input`` step waiting for its answer (of one execution, or all),
        oldest first: workflow, execution, step, waiting since, deadline, who may answer, and
        the JSON Schema its answer must match. Read on the primary: an answer acts on it."""
        eid = None if execution_id is None else await self.resolve(execution_id)
        rows = await self.db.all("task_list_waiting_for_input", execution_id=eid,
                                 limit=max(1, min(int(limit), 1000)))
        return [OpenInput.from_row(r) for r in rows]

    async def answers(self, execution_id: UUID | str) -> builtins.list[Answer]:
        """The answers given to an execution's ``wait_for_input`` steps, with who gave each
        and when, oldest first."""
        eid = await self.resolve(execution_id)
        return [Answer.from_event_row(r)
                for r in await self.reads.all("event_list_answers_by_execution",
                                              execution_id=eid)]

    async def schedules(self) -> builtins.list[ScheduleRecord]:
        """Every stored schedule with its next tick and the execution of its latest tick."""
        return [ScheduleRecord.from_row(r) for r in await list_schedules(self.db)]
