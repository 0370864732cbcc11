"""The attempt's typed model (konduit.core.model): each status set is exactly what the schema's
CHECK constraints allow; an attempt is built strictly from its row; a completion keeps what
happens to the task apart from how it ended."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import uuid
from typing import Any

import psycopg
import pytest

from konduit.core.model import (
    AttemptOutcome,
    Command,
    Completion,
    DeliveryStatus,
    ExecutionStatus,
    Outcome,
    OutputSource,
    StepStatus,
    TaskAttempt,
    TaskStatus,
    Transition,
    WaitKind,
)

ROW: dict[str, Any] = {
    "id": 7, "execution_id": uuid.uuid4(), "step": "s", "map_index": 0, "item": None,
    "attempt": 1, "max_attempts": 3, "lease_token": uuid.uuid4(), "queue": "default",
    "workflow_name": "w", "workflow_version": 1, "input": {"a": 1}, "deadline_remaining": 9.5,
    "generation": 2, "scheduled_at": None, "hedged": False, "fallback_age": None,
    "policy_revision": 1,
}


@pytest.mark.storage
@pytest.mark.parametrize(("table", "column", "members"), [
    ("konduit_executions", "status", ExecutionStatus),
    ("konduit_steps", "status", StepStatus),
    ("konduit_tasks", "status", TaskStatus),
    ("konduit_attempts", "outcome", AttemptOutcome),
    ("konduit_outputs", "source", OutputSource),
    ("konduit_tasks", "wait_kind", WaitKind),
    ("konduit_webhook_deliveries", "status", DeliveryStatus),
])
def test_each_status_set_is_what_the_schema_allows(db_url: str, table: str, column: str,
                                                   members: type[enum.StrEnum]) -> None:
    with psycopg.connect(db_url) as conn:
        # The column's own CHECK (PostgreSQL's default name; the migrations that widened a
        # set kept it).
        [(allowed,)] = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = %s::regclass AND conname = %s",
            (table, f"{table}_{column}_check")).fetchall()
    assert set(re.findall(r"'([a-z_]+)'::text", allowed)) == {m.value for m in members}


def test_task_outcomes_are_the_terminal_statuses() -> None:
    terminal = {s.value for s in TaskStatus} - {"ready", "running", "waiting"}
    assert {o.value for o in Outcome} == terminal == {s.value for s in StepStatus} - {
        "waiting", "active"}


def test_members_are_their_strings() -> None:
    assert TaskStatus.READY == "ready" and hash(TaskStatus.READY) == hash("ready")
    assert {"timed_out": 1}[Outcome.TIMED_OUT] == 1 and "failed" in {Outcome.FAILED}
    assert json.dumps({"o": Outcome.DEGRADED}) == '{"o": "degraded"}'
    assert f"{ExecutionStatus.RUNNING}" == "running"


def test_an_attempt_is_built_from_every_column_of_its_row() -> None:
    attempt = TaskAttempt.from_row(ROW)
    assert (attempt.id, attempt.generation, attempt.deadline_remaining) == (7, 2, 9.5)
    for column in ("scheduled_at", "generation", "hedged", "fallback_age", "deadline_remaining",
                   "policy_revision"):
        with pytest.raises(KeyError, match=column):
            TaskAttempt.from_row({k: v for k, v in ROW.items() if k != column})


def test_a_completion_ends_its_task_or_moves_it_never_both() -> None:
    attempt = TaskAttempt.from_row({**ROW, "hedged": True})
    assert attempt.key == -7
    ended = attempt.completion(Outcome.SUCCEEDED, payload_json="1", payload=1)
    assert (ended.command, ended.outcome, ended.ends, ended.word) == (
        Command.END, Outcome.SUCCEEDED, True, "succeeded")
    retry = attempt.completion(Command.RETRY, retry_delay=2.0, attempt_outcome="lost")
    assert (retry.command, retry.outcome, retry.ends, retry.word) == (
        Command.RETRY, None, False, "retry")
    assert retry.attempt_outcome is AttemptOutcome.LOST  # plain strings become members
    assert [attempt.completion(c).word for c in (Command.RELEASE, Command.WAIT, Command.YIELD)] \
        == ["released", "waiting", "yielded"]
    swept = attempt.completion("timed_out", transition="expire")  # type: ignore[arg-type]
    assert swept.outcome is Outcome.TIMED_OUT and swept.transition is Transition.EXPIRE
    with pytest.raises(ValueError):
        attempt.completion("retry")  # type: ignore[arg-type]  # a command is not an outcome
    with pytest.raises(ValueError):
        dataclasses.replace(retry, command=Command.END)  # ends, with no outcome
    with pytest.raises(ValueError):
        dataclasses.replace(ended, command=Command.RETRY)  # moves, with an outcome
    with pytest.raises(ValueError):
        Completion(task_id=1, lease_token=None, execution_id=uuid.uuid4(), step="s",
                   map_index=0, attempt=1, command=Command.END, outcome=Outcome.FAILED,
                   transition="vanish")  # type: ignore[arg-type]
