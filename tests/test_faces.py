"""The faces of one operation agree: ``App``, ``konduit.Client`` and ``konduit.AsyncClient``
have every operation of :class:`konduit.operations.AsyncOperations` with the same parameters
and docstring (the blocking ones are generated: ``scripts/async_to_sync.py``, whose output
must be checked in), the HTTP API's OpenAPI document and the command line take the same
parameters (under the names listed below), and what is missing from a door is declared here
with the reason. A parameter removed from any one face fails this module (shown in
``test_the_parity_check_fails_when_a_face_drops_a_parameter``).

Also the promises of the code-less Client that broke at its edges: any number of threads may
make its first calls at once, and it finds executions by tag, key, input and time.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import typer

import konduit
from konduit.cli import cli as cli_app
from konduit.operations import AsyncOperations
from konduit.web import create_app, database_client

ROOT = Path(__file__).resolve().parents[1]

OPERATIONS = sorted(name for name, member in inspect.getmembers(AsyncOperations)
                    if (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member))
                    and not name.startswith("_"))

FACES: dict[str, type] = {"App": konduit.App, "Client": konduit.Client,
                          "AsyncClient": konduit.AsyncClient}

# A face whose method takes more than the operation, on purpose.
FACE_EXCEPTIONS = {
    ("App", "migrate"): "without arguments it migrates the schema (konduit db migrate)",
}


def _parameters(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter but ``self``; annotations are compared apart
    (a blocking face returns blocking handles)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()
            if p.name != "self"]


def face_drift(faces: dict[str, type]) -> list[str]:
    """What differs between each face's operations and the async definition."""
    drift = []
    for face, cls in faces.items():
        for op in OPERATIONS:
            if (face, op) in FACE_EXCEPTIONS:
                continue
            mine = getattr(cls, op, None)
            if mine is None:
                drift.append(f"{face} has no {op}")
                continue
            want = getattr(AsyncOperations, op)
            if _parameters(mine) != _parameters(want):
                drift.append(f"{face}.{op}{inspect.signature(mine)} is not "
                             f"{op}{inspect.signature(want)}")
            if inspect.getdoc(mine) != inspect.getdoc(want):
                drift.append(f"{face}.{op} has another docstring")
    return drift


def test_the_generated_blocking_face_is_up_to_date() -> None:
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "async_to_sync.py"),
                            "--check"], capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_face_has_every_operation_with_the_same_signature_and_docstring() -> None:
    assert len(OPERATIONS) >= 30
    assert face_drift(FACES) == []


def test_the_parity_check_fails_when_a_face_drops_a_parameter() -> None:
    """The check can fail: a face whose cancel lost ``reason`` (the App's before) is drift."""

    class Dropped(konduit.Client):
        def cancel(self, execution_id: Any) -> bool:  # type: ignore[override]
            return False

    drift = face_drift({"Dropped": Dropped})
    assert drift and all(d.startswith("Dropped.cancel") for d in drift), drift


# -- the HTTP API and the command line --------------------------------------------------------

# operation -> (HTTP method and path, or None; CLI command, or None). A None is declared
# below with its reason.
DOORS: dict[str, tuple[tuple[str, str] | None, str | None]] = {
    "start": (("post", "/api/v1/executions"), "start"),
    "start_many": (("post", "/api/v1/executions:batch"), None),
    "status": (("get", "/api/v1/executions/{execution_id}"), "status"),
    "cancel": (("post", "/api/v1/executions/{execution_id}/cancel"), "cancel"),
    "repair": (("post", "/api/v1/executions/{execution_id}/repair"), "repair"),
    "redrive": (("post", "/api/v1/executions/{execution_id}/redrive"), "redrive"),
    "fork": (("post", "/api/v1/executions/{execution_id}/fork"), "fork"),
    "bulk": (("post", "/api/v1/executions:bulk"), "redrive"),
    "migrate": (("post", "/api/v1/executions/{execution_id}/migrate"), None),
    "send_event": (("post", "/api/v1/events"), "send-event"),
    "search": (("get", "/api/v1/executions"), "list"),
    "dead_letters": (("get", "/api/v1/dead-letters"), "dead-letters"),
    "workflows": (("get", "/api/v1/workflows"), None),
    "workers": (("get", "/api/v1/workers"), "workers"),
    "schedules": (("get", "/api/v1/schedules"), "schedules"),
    "alerts": (("get", "/api/v1/alerts"), "alerts"),
    "attempt_logs": (("get", "/api/v1/executions/{execution_id}/logs"), None),
    "journal": (("get", "/api/v1/executions/{execution_id}/journal"), None),
    "stream": (("get", "/api/v1/executions/{execution_id}/streams/{name}"), "stream"),
    "streams": (("get", "/api/v1/executions/{execution_id}/streams"), "status"),
    "prune": (None, "prune"),
    "move_to_history": (None, "move-history"),
    "versions": (None, "versions"),
    "list": (("get", "/api/v1/executions"), "list"),
    "wait": (None, "status"),
    "answer": (("post", "/api/v1/executions/{execution_id}/steps/{step}/answer"), "answer"),
    "inbox": (("get", "/api/v1/inbox"), "inbox"),
    # What an execution's detail shows: GET /api/v1/executions/{id} and konduit status.
    "answers": (("get", "/api/v1/executions/{execution_id}"), "status"),
    "auto_repair_status": (("get", "/api/v1/executions/{execution_id}"), "status"),
    "outputs": (("get", "/api/v1/executions/{execution_id}"), "status"),
    "stall": (("get", "/api/v1/executions/{execution_id}"), "status"),
    "steps": (("get", "/api/v1/executions/{execution_id}"), "status"),
    "tasks": (("get", "/api/v1/executions/{execution_id}"), "status"),
    "payloads": (None, "status"),
    "workflow_served": (None, "status"),
    "count_prunable": (None, "prune"),
    "migrate_workflow": (None, "migrate-executions"),
    "pause_schedule": (None, "schedules"),
    "resume_schedule": (None, "schedules"),
    "webhook_deliveries": (None, "webhooks"),
    "retry_webhook_delivery": (None, "webhooks"),
    "triggers": (("get", "/api/v1/workflows"), None),
    "retry_now": (None, None),
    "unregister_webhooks": (None, None),
}

NOT_AT_DOOR = {
    ("cli", "start_many"): "a batch is a program's call, not a command line's",
    ("cli", "migrate"): "konduit migrate moves executions by workflow version (migrate_workflow)",
    ("cli", "workflows"): "konduit versions lists the registered versions with their workers",
    ("cli", "attempt_logs"): "konduit status --logs shows them",
    ("cli", "journal"): "konduit status --journal shows it",
    ("http", "prune"): "deleting history is an operator's command, not an API call",
    ("http", "move_to_history"): "moving history is an operator's command, not an API call",
    ("http", "versions"): "GET /api/v1/workflows lists the versions",
    ("http", "wait"): "a request does not stay open for a run: poll GET /api/v1/executions/{id}",
    ("http", "payloads"): "the detail's attempts and output versions hold the results; a late "
                          "result is the Client's and konduit status's",
    ("http", "workflow_served"): "GET /api/v1/workers lists what each live worker serves",
    ("http", "count_prunable"): "deleting history is an operator's command, not an API call",
    ("http", "migrate_workflow"): "POST /api/v1/executions/{id}/migrate moves one execution; a "
                                  "whole version is an operator's command",
    ("http", "pause_schedule"): "a schedule is paused by its operator (konduit schedules, the "
                                "dashboard's schedules page)",
    ("http", "resume_schedule"): "a schedule is resumed by its operator (konduit schedules, the "
                                 "dashboard's schedules page)",
    ("http", "webhook_deliveries"): "the outbox is the operator's: konduit webhooks, the "
                                    "dashboard's webhooks page",
    ("http", "retry_webhook_delivery"): "the outbox is the operator's: konduit webhooks "
                                        "--retry",
    ("cli", "triggers"): "GET /api/v1/workflows and the dashboard's stats page show each "
                         "workflow's triggers; the command line has no view of them",
    ("http", "retry_now"): "the dashboard's execution page has the button; a program calls the "
                           "Client",
    ("cli", "retry_now"): "a backoff is seconds long: the dashboard's button, or the Client",
    ("http", "unregister_webhooks"): "an App's own call when it starts, with its Webhook "
                                     "objects",
    ("cli", "unregister_webhooks"): "an App's own call when it starts, with its Webhook "
                                    "objects",
}

# The name a door gives a face's parameter, where it differs: (door, operation) -> renames.
RENAMED: dict[tuple[str, str], dict[str, str]] = {
    ("http", "start"): {"trace_context": "traceparent"},
    ("http", "start_many"): {"trace_context": "traceparent"},
    ("http", "search"): {"id_prefix": "id", "idempotency_key": "key", "tags": "tag",
                         "before": "cursor"},
    ("http", "alerts"): {"include_resolved": "all"},
    ("cli", "start"): {"tags": "tag"},
    ("cli", "search"): {"id_prefix": "id", "idempotency_key": "key", "tags": "tag"},
    ("cli", "workers"): {"stale_seconds": "stale"},
    ("http", "list"): {"id_prefix": "id", "idempotency_key": "key", "tags": "tag"},
    ("cli", "list"): {"id_prefix": "id", "idempotency_key": "key", "tags": "tag"},
    ("cli", "migrate_workflow"): {"to_version": "to"},
    ("cli", "pause_schedule"): {"name": "pause"},
    ("cli", "resume_schedule"): {"name": "resume"},
    ("cli", "retry_webhook_delivery"): {"delivery_id": "retry"},
}

# Parameters a door does not take, declared: (door, operation, parameter) -> why.
NOT_TAKEN = {
    **{("http", "search", p): "a search's parts are the query; the filter object is Python's"
       for p in ("where",)},
    **{("cli", "search", p): "a search's parts are the options; the filter object is Python's"
       for p in ("where", "before")},
    ("cli", "start", "trace_context"): "a command line has no caller's span",
    ("http", "start_many", "requests"): "the body is the batch",
    ("http", "search", "version"): "workflow=name@version",
    ("cli", "search", "version"): "--workflow name@version",
    ("http", "workers", "stale_seconds"): "the live workers as the workers decide",
    ("cli", "dead_letters", "limit"): "all of them",
    ("cli", "bulk", "action"): "the command is the action: konduit cancel|redrive --status ...",
    ("cli", "bulk", "where"): "a filter's parts are the options (as konduit list takes them)",
    ("cli", "bulk", "reason"): "konduit cancel --reason; a redrive keeps no reason",
    ("http", "list", "version"): "workflow=name@version",
    ("cli", "list", "version"): "--workflow name@version",
    ("cli", "migrate_workflow", "from_version"): "--workflow name@version",
    ("cli", "workflow_served", "name"): "the execution's workflow",
    ("cli", "workflow_served", "version"): "the execution's version",
    ("http", "triggers", "workflow"): "each workflow of the list carries its triggers",
}


def _http_parameters(spec: dict[str, Any], method: str, path: str) -> set[str]:
    operation = spec["paths"][path][method]
    names = {p["name"] for p in operation.get("parameters", [])}
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    schema = body.get("schema", {})
    ref = schema.get("$ref") or next((s["$ref"] for s in schema.get("anyOf", []) if "$ref" in s),
                                     None)
    if ref is not None:
        schema = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
        names |= set(schema.get("properties", {}))
    return names - {"tracestate"}


def _cli_parameters(command: str) -> set[str]:
    found = typer.main.get_command(cli_app).commands[command]  # type: ignore[attr-defined]
    return {p.name for p in found.params if p.name} - {"database_url", "as_json", "app_spec"}


def door_drift(drop: tuple[str, str, str] | None = None) -> list[str]:
    """What the HTTP API and the command line miss of each operation's parameters; ``drop``
    (door, operation, its name for a parameter) takes one away first, as a face that lost it."""
    spec = create_app(database_client("postgresql://unused@127.0.0.1:1/none", None),
                      None).openapi()
    drift = []
    for op, (http, cli) in DOORS.items():
        params = [p for p, *_ in _parameters(getattr(AsyncOperations, op))]
        for door, found in (("http", None if http is None else _http_parameters(spec, *http)),
                            ("cli", None if cli is None else _cli_parameters(cli))):
            if found is not None and drop is not None and drop[:2] == (door, op):
                found = found - {drop[2]}
            if found is None:
                if (door, op) not in NOT_AT_DOOR:
                    drift.append(f"{op} has no {door} door and none is declared")
                continue
            for p in params:
                name = RENAMED.get((door, op), {}).get(p, p)
                if name not in found and (door, op, p) not in NOT_TAKEN:
                    drift.append(f"{door} {op} does not take {p} (as {name}): {sorted(found)}")
    return drift


def test_the_http_api_and_the_command_line_take_each_operations_parameters() -> None:
    assert door_drift() == []


def test_every_operation_has_its_doors_declared() -> None:
    """No operation escapes the door check: each names its HTTP route and command (or says
    why a door has none). Before, 21 operations were in no table, and the HTTP inbox and the
    command line's inbox and webhooks took no execution while every other face did."""
    assert sorted(set(OPERATIONS) - set(DOORS)) == []
    assert sorted(set(DOORS) - set(OPERATIONS)) == []


@pytest.mark.parametrize("drop", [("http", "cancel", "reason"), ("cli", "start", "fair_key"),
                                  ("http", "search", "tag"), ("cli", "send_event", "payload")])
def test_the_door_check_fails_when_a_door_drops_a_parameter(drop: tuple[str, str, str]) -> None:
    drift = door_drift(drop)
    assert len(drift) == 1 and drift[0].startswith(f"{drop[0]} {drop[1]} does not take"), drift


# -- the code-less Client at its edges ---------------------------------------------------------


def _one_step(name: str) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)
    wf.step(name="only")(lambda ctx: 1)
    return wf


def test_many_threads_make_a_fresh_clients_first_calls_at_once(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """16 threads released together make a new Client's first calls, 5 times over: every call
    returns (before, the loop thread was made without a lock: several were, the connections'
    lock was bound to another loop, and calls hung for good)."""
    make_app(_one_step("threads")).start("threads", {"n": 0})  # registers it
    for trial in range(5):
        client = konduit.Client(db_url)
        barrier = threading.Barrier(16)
        answers: list[Any] = []
        errors: list[BaseException] = []

        def first_call(i: int, client: konduit.Client = client,
                       barrier: threading.Barrier = barrier, answers: list[Any] = answers,
                       errors: list[BaseException] = errors) -> None:
            barrier.wait()
            try:
                if i % 2:
                    answers.append(client.start("threads", {"n": i}).id)
                else:
                    answers.append(client.workflows())
            except BaseException as exc:  # pragma: no cover - what the test fails with
                errors.append(exc)

        threads = [threading.Thread(target=first_call, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), f"trial {trial}: a first call hung"
        assert errors == [] and len(answers) == 16, (trial, errors)
        client.close()


def test_a_code_less_client_finds_executions_by_tag_key_input_and_time(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(_one_step("found"))
    tagged = app.start("found", {"episode": 42}, tags={"customer": "acme"},
                       idempotency_key="nightly-1").id
    other = app.start("found", {"episode": 7}).id
    since = datetime.now(UTC) - timedelta(minutes=5)
    with konduit.Client(db_url) as client:
        assert [r.id for r in client.list(tags={"customer": "acme"})] == [tagged]
        assert [r.id for r in client.list(idempotency_key="nightly-1")] == [tagged]
        assert [r.id for r in client.list(input={"episode": 7})] == [other]
        assert {r.id for r in client.list(since=since, workflow="found")} == {tagged, other}
        assert client.list(until=since) == []
        [found] = client.search(tags={"customer": "acme"}, since=since)
        assert found.id == tagged and found.tags == {"customer": "acme"}
        assert [r.id for r in client.search(id_prefix=str(tagged)[-8:])] == [tagged]
        assert client.cancel(tagged, reason="wrong episode") is True
        assert "wrong episode" in (client.status(tagged).error or "")


def test_errors_carry_the_field_and_the_index_at_fault(make_app: Callable[..., konduit.App],
                                                      db_url: str) -> None:
    """A start's error says which field (and, in a batch, which request) is at fault as
    attributes, so the API needs no message parsing; its kind is ``code``."""
    wf = konduit.Workflow("blamed", version=1, fair_by="input.customer")
    wf.step(name="only")(lambda ctx: 1)
    app = make_app(wf)
    app.start("blamed", {"customer": "warm"})
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"workflow": "nope"}, "workflow", "workflow_not_found"),
        ({"workflow": "blamed", "version": 9}, "version", "workflow_not_found"),
        ({"workflow": "blamed", "input": {"customer": 1.5}}, "input", "fair_key_error"),
        ({"workflow": "blamed", "input": {"customer": "a"}, "fair_key": ""}, "fair_key",
         "fair_key_error"),
        ({"workflow": "blamed", "input": {"customer": "a"}, "timeout": "soon"}, "timeout",
         "konduit_error"),
        ({"workflow": "blamed", "input": {"customer": "a"}, "tags": {"k": 1}}, "tags",
         "search_error"),
        ({"workflow": "blamed", "input": {"customer": "a"}, "delay": -1}, "delay",
         "konduit_error"),
        ({"workflow": "blamed", "input": {"customer": "a"}, "priority": "high"}, "priority",
         "konduit_error"),
    ]
    with konduit.Client(db_url) as client:
        for request, field, code in cases:
            for face in (app, client):
                with pytest.raises(konduit.KonduitError) as one:
                    face.start(**request)
                assert (one.value.field, one.value.index, one.value.code) == (field, None, code)
                with pytest.raises(konduit.KonduitError) as batch:
                    face.start_many([{"workflow": "blamed", "input": {"customer": "ok"}},
                                     request])
                assert (batch.value.field, batch.value.index) == (field, 1), request
        with pytest.raises(konduit.IdempotencyConflict) as conflict:
            client.start_many([{"workflow": "blamed", "input": {"customer": "a"},
                                "idempotency_key": "k"},
                               {"workflow": "blamed", "input": {"customer": "b"},
                                "idempotency_key": "k"}])
        assert (conflict.value.field, conflict.value.index) == ("idempotency_key", 1)


def test_the_servers_operations_keep_one_client_with_the_apps_code(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """An API server with ``--app`` runs its commands on one client with the App's code (made
    once per server client), so a start registers the App's workflows once, not at every
    request (one made per command did)."""
    import asyncio

    from konduit.web.clients import Clients, ServerOperations

    app = make_app(_one_step("served"))

    async def go() -> None:
        clients = Clients(database_client(db_url, app))
        ops = ServerOperations(clients, app)
        try:
            first = await ops._engine()
            await ops.start("served", {"n": 1})
            second = await ops._engine()
            assert second is first and "served@1" in second._registered
        finally:
            await clients.close()

    asyncio.run(go())


def test_start_takes_exactly_the_fields_of_start_request() -> None:
    """``start`` restates :class:`konduit.StartRequest`'s fields as keywords (so a caller's
    editor shows them); a field added to the request and not to ``start`` (or a default that
    differs) would make the two ways to start an execution disagree. ``trace_context`` is the
    one extra: it is not part of what is started."""
    import dataclasses

    fields = [(f.name, f.default if f.default is not dataclasses.MISSING else inspect._empty)
              for f in dataclasses.fields(konduit.StartRequest)]
    for face in (AsyncOperations, *FACES.values()):
        params = [(p.name, p.default)
                  for p in inspect.signature(face.start).parameters.values()
                  if p.name not in ("self", "trace_context")]
        assert params == fields, face
