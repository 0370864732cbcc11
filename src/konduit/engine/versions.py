"""Workflow versions side by side: which versions run, who serves them, and the policy each task
was created with (docs/changing-workflows.md). A part of :class:`konduit.engine.client.Client`,
kept in its own module: the Client inherits :class:`VersionReads`."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from uuid import UUID

from konduit.db.database import Database
from konduit.records import TaskPolicy, VersionState


class VersionReads:
    """The Client's reads about versions; ``db`` is the Client's database."""

    db: Database

    async def versions(self, workflow: str | None = None) -> builtins.list[VersionState]:
        """Every registered workflow version (or those of ``workflow``): its running executions
        and the live workers serving it; ``unserved`` when executions run and no worker does."""
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
