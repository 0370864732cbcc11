"""The join state of steps, read and written set-based: every row addressed by its own
(execution, step) key, so one statement serves one execution's fan-in decision or a whole round
of them (:class:`konduit.engine.round.Round`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from konduit.core.advance import StepState
from konduit.db.database import Row, Tx

STATE_FIELDS = (
    "status",
    "up_pending",
    "up_ok",
    "up_failed",
    "up_required_failed",
    "up_skipped",
    "tasks_total",
    "tasks_pending",
    "tasks_ok",
    "tasks_degraded",
    "tasks_failed",
)

StepWrite = tuple[UUID, str, StepState, datetime | None, datetime | None, str | None, bool, bool]
"""(execution, step, state, first_upstream_at, last_upstream_at, straggler, fired, ended)."""


def state_columns(states: list[StepState]) -> dict[str, list[Any]]:
    """Join counters as the parallel arrays the ``step_*_many`` queries unnest."""
    return {
        ("statuses" if name == "status" else f"{name}s"): [getattr(st, name) for st in states]
        for name in STATE_FIELDS
    }


def state_of(row: Row) -> StepState:
    return StepState(**{f: row[f] for f in STATE_FIELDS})


async def read(tx: Tx, keys: Sequence[tuple[UUID, str]]) -> list[Row]:
    """The join state (and ``first_upstream_at``) of the steps ``keys`` name."""
    if not keys:
        return []
    return await tx.all("step_get_many_across_executions",
                        execution_ids=[e for e, _ in keys], steps=[s for _, s in keys])


async def read_later(tx: Tx, keys: Sequence[tuple[UUID, str]]
                     ) -> Callable[[], Awaitable[list[Row]]]:
    """:func:`read`, sent now (queued in a pipelined transaction) and answered when awaited."""
    return await tx.later("step_get_many_across_executions",
                          execution_ids=[e for e, _ in keys], steps=[s for _, s in keys])


def step_write_columns(rows: Sequence[StepWrite]) -> dict[str, list[Any]]:
    """Step writes as the parallel arrays the ``step_update_many_*`` queries unnest."""
    return {
        "execution_ids": [r[0] for r in rows],
        "steps": [r[1] for r in rows],
        **state_columns([r[2] for r in rows]),
        "first_upstream_ats": [r[3] for r in rows],
        "last_upstream_ats": [r[4] for r in rows],
        "stragglers": [r[5] for r in rows],
        "fireds": [r[6] for r in rows],
        "endeds": [r[7] for r in rows],
    }


async def write(tx: Tx, rows: Sequence[StepWrite],
                steps_pending: Sequence[tuple[UUID, int]] = ()) -> None:
    """Apply decisions to the step rows they changed (give them in (execution, step) order,
    the lock order), and with them each (execution, count) of ``steps_pending`` (how many
    steps of a locked, running execution have not ended: written where it changed), in one
    statement; sent without waiting in a pipelined transaction."""
    if not rows:
        if steps_pending:
            await tx.send("execution_set_steps_pending_many_if_running_and_changed",
                          ids=[e for e, _ in steps_pending],
                          steps_pendings=[n for _, n in steps_pending])
        return
    if steps_pending:
        await tx.send(
            "step_update_many_across_executions_with_steps_pending",
            **step_write_columns(rows),
            ids=[e for e, _ in steps_pending],
            steps_pendings=[n for _, n in steps_pending],
        )
        return
    await tx.send(
        "step_update_many_across_executions",
        **step_write_columns(rows),
    )
