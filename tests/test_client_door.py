"""engine.Client and the read model above it are the one door (issue 17): the App's sync face
has nothing the async client and read model lack, and what they return are the typed records of
konduit.records, whose fields are the columns of the statements they are read from (so the JSON
made of them keeps its shape)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import uuid
import warnings
from typing import Any

import psycopg
import pytest

import konduit
from konduit import records
from konduit.cli.common import dump_json
from konduit.db.queries import q
from konduit.engine.client import Client
from konduit.reads import ReadModel

# App methods with no client twin on purpose: the worker, the schema, the App's own plumbing.
SYNC_ONLY = {"add", "close", "handle", "migrate", "migrate_schema", "run_worker", "run_worker_async",
             "client_async", "reads_async", "database_url"}
RENAMED = {"status": "get"}  # App.status reads what Client.get does


def test_every_app_operation_is_a_client_coroutine() -> None:
    """An asyncio user (``await app.client_async()``, ``await app.reads_async()``) can do
    whatever the App can: a command or a read acted on on the Client, a read shown on the read
    model."""
    for name, member in vars(konduit.App).items():
        if name.startswith("_") or name in SYNC_ONLY or not callable(member):
            continue
        wanted = RENAMED.get(name, name)
        twin = getattr(Client, wanted, None) or getattr(ReadModel, wanted, None)
        assert twin is not None, f"App.{name} has no Client.{wanted} nor ReadModel.{wanted}"
        assert inspect.iscoroutinefunction(twin), f"{name} is not a coroutine"


def test_the_engine_client_keeps_no_read_of_the_read_model() -> None:
    """A read moved above the engine is not also left on it."""
    public = [{n for n in dir(cls) if not n.startswith("_")} for cls in (Client, ReadModel)]
    assert public[0] & public[1] == {"resolve", "on_primary"}, sorted(public[0] & public[1])


TASK = {f.name: None for f in dataclasses.fields(records.TaskRecord)} | {
    "id": 7, "step": "fetch", "status": "succeeded", "attempt": 2}


def test_a_record_is_built_from_its_columns_and_refuses_a_missing_one() -> None:
    task = records.TaskRecord.from_row(TASK | {"a_column_added_later": 1})
    assert (task.id, task.step, task.status, task.attempt) == (7, "fetch", "succeeded", 2)
    assert task.to_dict() == TASK
    with pytest.raises(KeyError, match="wait_child"):
        records.TaskRecord.from_row({k: v for k, v in TASK.items() if k != "wait_child"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.status = "failed"  # type: ignore[misc]


def test_reading_a_record_as_a_dict_works_for_one_release_with_a_warning() -> None:
    task = records.TaskRecord.from_row(TASK)
    with pytest.warns(DeprecationWarning, match=r"TaskRecord\['step'\] is deprecated.*\.step"):
        assert task["step"] == "fetch"
    with pytest.warns(DeprecationWarning):
        assert task.get("attempt") == 2 and task.get("nothing", "x") == "x"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert dict(task) == TASK
        with pytest.raises(KeyError):
            task["nothing"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert task.step == "fetch"  # the attribute never warns


def test_the_cli_prints_a_record_as_the_dict_it_replaces() -> None:
    task = records.TaskRecord.from_row(TASK)
    assert json.loads(dump_json([task])) == [TASK]


# Each record and the statement it is read from, with parameters that match nothing: the
# statement's columns are known without rows.
NOTHING = uuid.UUID(int=0)
SOURCES: list[tuple[type[records.Record], str, dict[str, Any]]] = [
    (records.TaskRecord, "task_list_by_execution", {"execution_id": NOTHING}),
    (records.StepRecord, "step_get_all", {"execution_id": NOTHING}),
    (records.OutputVersion, "execution_output_list", {"id": NOTHING}),
    (records.Payload, "output_list_by_execution", {"execution_id": NOTHING}),
    (records.DeadLetter, "task_list_dead", {"limit": 1}),
    (records.WorkerRecord, "worker_list_live", {"stale_seconds": None}),
    (records.WebhookDelivery, "webhook_delivery_list",
     {"status": None, "execution_id": None, "limit": 1}),
    (records.ExecutionSummary, "execution_list_older_than_cursor",
     {"status": None, "workflow_name": None, "before_at": None, "before_id": None, "limit": 1}),
    (records.ExecutionRecord, "execution_get", {"id": NOTHING}),
    (records.ExecutionProgress, "execution_status_many", {"ids": [NOTHING]}),
    (records.StepMark, "step_list_degraded_or_failed_for_executions", {"ids": [NOTHING]}),
    (records.WorkflowRecord, "workflow_list_with_spec", {}),
    (records.WorkflowRecord, "workflow_get", {"name": "", "version": 0}),
    (records.AttemptRecord, "attempt_list_by_execution", {"execution_id": NOTHING}),
    (records.AttemptRecord, "attempt_list_by_execution_except_steps",
     {"execution_id": NOTHING, "steps": ["x"]}),
    (records.FailedAttempt, "attempt_list_failed_by_execution",
     {"execution_id": NOTHING, "per_step": 1}),
    (records.MapStepCounts, "task_summarize_by_step", {"execution_id": NOTHING, "steps": ["x"]}),
    (records.MapItem, "task_list_by_step_page",
     {"execution_id": NOTHING, "step": "x", "status": None, "from_index": 0, "limit": 1}),
    (records.DeadLetterWithStatus, "task_list_dead_older_than_cursor",
     {"before_at": None, "before_id": None, "limit": 1}),
    (records.ParentLink, "execution_parent_of", {"execution_id": NOTHING}),
    (records.ChildExecution, "execution_children_list", {"execution_id": NOTHING}),
    (records.StepBudget, "task_list_budgets_by_execution", {"execution_id": NOTHING}),
    (records.QueueDepth, "task_count_ready_by_queue", {}),
    (records.WorkerState, "worker_list_recent_with_liveness", {"since_seconds": 1.0}),
    (records.OpenAttempt, "attempt_list_open_with_worker", {"limit": 1}),
    (records.VersionState, "workflow_version_list_with_service", {"name": None}),
    (records.TaskPolicy, "task_policy_list_by_execution", {"execution_id": NOTHING}),
]
# A schedule is its row (less the clock read with it) plus what Schedules.list works out.
SCHEDULE_DERIVED = {"schedule", "next_tick", "behind"}


@pytest.mark.storage
def test_every_record_has_exactly_the_columns_of_its_statement(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        def columns(query: str, params: dict[str, Any]) -> list[str]:
            cursor = conn.execute(q(query), params)  # type: ignore[arg-type]
            assert cursor.description is not None
            return [c.name for c in cursor.description]

        for record, query, params in SOURCES:
            fields = [f.name for f in dataclasses.fields(record)]
            assert sorted(columns(query, params)) == sorted(fields), (record.__name__, query)
        schedule = set(columns("schedule_list", {})) - {"now"}
        assert schedule | SCHEDULE_DERIVED == {f.name for f in dataclasses.fields(records.ScheduleRecord)}
