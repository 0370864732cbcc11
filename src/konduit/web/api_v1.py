"""``/api/v1``: the dashboard's JSON API (docs/api.md), described by ``/openapi.json``.

Nothing here needs workflow code: a start (or repair) of a workflow the dashboard's App
(``--app MODULE:ATTR``) does not have uses the definition a worker registered in the database,
and its input is checked against the JSON Schema stored with it. Every
refusal is ``application/problem+json`` naming the field at fault (:mod:`konduit.web.problems`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from konduit import tracing
from konduit.app import App
from konduit.core.durations import parse_duration
from konduit.core.fair import FairKeyError
from konduit.core.requests import CancelRequest, EventRequest, MigrateRequest, RepairRequest, StartRequest
from konduit.core.search import check_tags, search_filter
from konduit.core.triggers import TriggerCodeFailed
from konduit.engine.client import Client
from konduit.engine.later import start_time
from konduit.engine.registry import workflow_key
from konduit.engine.stored import NoCode
from konduit.errors import (
    AlertError,
    ExecutionNotFound,
    IdempotencyConflict,
    InputValidationError,
    KonduitError,
    MigrationRefused,
    NothingToRepair,
    PayloadError,
    StatsError,
    WorkflowNotFound,
    WorkflowVersionConflict,
)
from konduit.reads import ReadModel
from konduit.web import api_models as m
from konduit.web.problems import FieldError, problem, problem_responses
from konduit.web.templating import env

if TYPE_CHECKING:
    from konduit.web.clients import Clients

class Refused(Exception):
    """A request refused with a problem (turned into problem+json by the app's handler)."""

    def __init__(self, status: int, detail: str, field: str | None = None,
                 step: str | None = None, errors: list[FieldError] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field
        self.step, self.errors = step, errors

    def response(self) -> JSONResponse:
        return problem(self.status, self.detail, field=self.field, step=self.step,
                       errors=self.errors)



TraceParent = Annotated[str | None, Header(
    max_length=200, description="W3C trace context of the caller (ignored when not valid)")]
TraceState = Annotated[str | None, Header(max_length=512, description="W3C trace state")]

def encode_cursor(created_at: datetime, eid: UUID) -> str:
    raw = json.dumps([created_at.isoformat(), str(eid)]).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, eid = json.loads(raw)
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError("naive")
        return when, UUID(eid)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise Refused(422, "cursor: not a cursor this API gave out (pass next_cursor back "
                      "unchanged)", "query.cursor") from None


def check_start(body: m.StartBody, where: str) -> StartRequest:
    """The request, after checking what can be checked before reading the workflow's
    definition (each fault named); the workflow and its input are checked by the start."""
    if body.timeout is not None:
        try:
            parse_duration(body.timeout, what="timeout")
        except KonduitError as exc:
            raise Refused(422, str(exc), f"{where}timeout") from None
    try:
        check_tags(body.tags)
    except KonduitError as exc:
        raise Refused(422, str(exc), f"{where}tags") from None
    try:
        start_time(body.run_at, body.delay)
    except KonduitError as exc:
        raise Refused(422, str(exc), f"{where}delay") from None
    return StartRequest(body.workflow, body.input, body.idempotency_key, body.version,
                        body.deadline_at, body.timeout, tags=body.tags, run_at=body.run_at,
                        delay=body.delay, priority=body.priority, fair_key=body.fair_key)


_AT_REQUEST = re.compile(r"^start request (?P<index>\d+): ")


def start_refusal(exc: KonduitError, requests: list[StartRequest], batch: bool) -> Refused:
    """The problem of a refused start, naming the field at fault (in a batch, under the index
    of the request at fault, which the error's message starts with)."""
    text = str(exc)
    found = _AT_REQUEST.match(text) if batch else None
    where = f"body.requests.{found['index']}." if found else "body."
    if isinstance(exc, IdempotencyConflict):
        return Refused(409, text, f"{where}idempotency_key")
    if isinstance(exc, InputValidationError):
        errors = [FieldError(field=f"{where}input" + ("" if f == "(root)" else f".{f}"),
                             message=message) for f, message in exc.errors.items()]
        return Refused(422, text, errors[0].field if errors else f"{where}input",
                       errors=errors or None)
    if isinstance(exc, PayloadError):
        return Refused(422, text, f"{where}input")
    if isinstance(exc, FairKeyError):  # the key given, or the one fair_by made of the input
        return Refused(422, text, f"{where}fair_key" if "fair_key of" in text else f"{where}input")
    if isinstance(exc, WorkflowNotFound):
        return Refused(422, text, f"{where}version" if " has no version " in text
                       else f"{where}workflow")
    return Refused(422, text)


def spec_view(spec: dict[str, Any]) -> tuple[list[m.StepDefinition], list[tuple[str, str]], list[m.Join]]:
    steps = [m.StepDefinition.model_validate(s) for s in spec.get("steps", [])]
    edges = [(up, s.name) for s in steps for up in s.after]
    joins = [m.Join(step=s.name, upstream=list(s.after), policy=s.join or m.JoinPolicy(kind="all_succeeded"))
             for s in steps if len(s.after) > 1]
    return steps, edges, joins


Limit = Annotated[int, Query(ge=1, le=500, description="At most this many")]


def api_router(clients: Clients, app: App | None) -> APIRouter:
    """The ``/api/v1`` routes, reading through ``clients``; ``app`` supplies workflow code."""
    router = APIRouter(prefix="/api/v1",
                       responses=problem_responses(400, 401, 403, 413, 422, 503))

    async def operator() -> Client:
        """The client that starts and repairs: with the App's code when there is one (its
        workflows as it defines them), else with the definitions registered in the database."""
        client = await clients.get()
        if app is None:
            return client
        return client.with_registry(app.registry, max_payload_bytes=app.max_payload_bytes)

    async def statuses(client: Client, ids: list[UUID]) -> dict[UUID, str]:
        # A start's answer: read where it was written (a replica may not have it yet).
        return {r.id: r.status for r in await ReadModel(client.reads).on_primary().progress(ids)}

    @router.post("/executions", status_code=201, response_model=m.Started, tags=["executions"],
                 responses=problem_responses(409))
    async def start(body: m.StartBody, traceparent: TraceParent = None,
                    tracestate: TraceState = None) -> m.Started:
        """Start an execution; the same idempotency key (and input) gives the same one. A W3C
        ``traceparent`` header makes the execution part of the caller's trace."""
        client = await operator()
        request = check_start(body, "body.")
        try:
            eid = await client.start(request.workflow, request.input,
                                     idempotency_key=request.idempotency_key,
                                     version=request.version, deadline_at=request.deadline_at,
                                     timeout=request.timeout,
                                     trace_context=tracing.incoming(traceparent, tracestate),
                                     tags=request.tags, run_at=request.run_at,
                                     delay=request.delay, priority=request.priority,
                                     fair_key=request.fair_key)
        except (WorkflowNotFound, IdempotencyConflict, PayloadError, InputValidationError,
                FairKeyError) as exc:
            raise start_refusal(exc, [request], batch=False) from None
        return m.Started(id=eid, status=(await statuses(client, [eid])).get(eid, "pending"))  # type: ignore[arg-type]

    @router.post("/executions:batch", status_code=201, response_model=m.StartedMany,
                 tags=["executions"], responses=problem_responses(409))
    async def start_many(body: m.BatchBody, traceparent: TraceParent = None,
                         tracestate: TraceState = None) -> m.StartedMany:
        """Start many executions in one transaction: every one of them, or none (a W3C
        ``traceparent`` header: all of them in the caller's trace)."""
        client = await operator()
        requests = [check_start(b, f"body.requests.{i}.") for i, b in enumerate(body.requests)]
        try:
            ids = await client.start_many(
                requests, trace_context=tracing.incoming(traceparent, tracestate))
        except (WorkflowNotFound, IdempotencyConflict, PayloadError, InputValidationError,
                FairKeyError) as exc:
            raise start_refusal(exc, requests, batch=True) from None
        found = await statuses(client, ids) if ids else {}
        return m.StartedMany(executions=[m.Started(id=i, status=found.get(i, "pending"))  # type: ignore[arg-type]
                                         for i in ids])

    @router.get("/executions", response_model=m.ExecutionPage, tags=["executions"])
    async def executions(status: m.ExecutionStatus | None = None,
                         workflow: Annotated[str | None, Query(
                             max_length=200, description="name or name@version")] = None,
                         limit: Limit = 50,
                         cursor: Annotated[str | None, Query(max_length=500)] = None,
                         id: Annotated[str | None, Query(
                             max_length=36, description="The start or the end of the id (at "
                             "least 4 hex digits)")] = None,
                         key: Annotated[str | None, Query(
                             max_length=500, description="The idempotency key")] = None,
                         tag: Annotated[list[str] | None, Query(
                             max_length=32, description="key=value: carries this tag "
                             "(repeatable: all of them)")] = None,
                         input: Annotated[list[str] | None, Query(
                             max_length=32, description="field=value: the input has this field "
                             "(input.episode=42; the value is JSON, else text; repeatable)")] = None,
                         since: Annotated[str | None, Query(
                             max_length=64, description="Created since: a duration ago (1h) "
                             "or an ISO 8601 date-time")] = None,
                         until: Annotated[str | None, Query(
                             max_length=64, description="Created before: a duration ago (1h) "
                             "or an ISO 8601 date-time")] = None,
                         fair_key: Annotated[str | None, Query(
                             max_length=200, description="Started with this fair key "
                             "(its workflow's fair_by)")] = None) -> m.ExecutionPage:
        """Executions, newest first, a page at a time: pass ``next_cursor`` back as ``cursor``
        (with the same filters). Pages are stable while executions are started: none is repeated
        or skipped. Each filter is answered by an index; the ones given must all hold."""
        before_at, before_id = decode_cursor(cursor) if cursor else (None, None)
        try:
            where = search_filter(id=id, key=key, tags=tag, inputs=input, status=status,
                                  workflow=workflow, since=since, until=until,
                                  fair_key=fair_key)
        except KonduitError as exc:
            raise Refused(422, str(exc), "query") from None
        model = await clients.model()
        rows = await model.search(where, before=None if before_at is None or before_id is None
                                   else (before_at, before_id), limit=limit + 1)
        items = [m.ExecutionSummary(id=r.id, workflow=r.workflow_name,
                                    version=r.workflow_version, status=r.status,  # type: ignore[arg-type]
                                    error=r.error, idempotency_key=r.idempotency_key,
                                    created_at=r.created_at, finished_at=r.finished_at,
                                    tags=r.tags or {}, run_at=r.run_at, priority=r.priority)
                 for r in rows[:limit]]
        more = len(rows) > limit
        return m.ExecutionPage(items=items, next_cursor=encode_cursor(items[-1].created_at, items[-1].id)
                               if more else None)

    @router.get("/executions/{execution_id}", response_model=m.ExecutionDetail, tags=["executions"],
                responses=problem_responses(404, 409))
    async def execution(execution_id: str) -> m.ExecutionDetail:
        """One execution whole: input, output, each step, every attempt with its full error."""
        model = await clients.model()
        result = await model.view(execution_id)
        row = await model.execution(result.id)
        steps = await model.steps(result.id)
        attempts = await model.attempts(result.id)
        return m.ExecutionDetail(
            id=result.id, workflow=result.workflow, version=result.version,
            status=result.status,  # type: ignore[arg-type]
            input=row.input, output=result.output, error=result.error,
            outcomes=result.outcomes, idempotency_key=row.idempotency_key,
            created_at=row.created_at, finished_at=row.finished_at,
            deadline_at=row.deadline_at, timeout_at=row.timeout_at,
            output_version=row.output_version, tags=row.tags or {}, run_at=row.run_at,
            priority=row.priority, fair_key=row.fair_key,
            steps=[m.StepState.model_validate(s.to_dict()) for s in steps],
            attempts=[m.Attempt.model_validate(a.to_dict()) for a in attempts],
            output_versions=[m.OutputVersion.model_validate(v.to_dict())
                             for v in await model.outputs(result.id)],
            stalled=None if result.finished or (stall := await model.stall(result.id)) is None
            else m.AlertOut.model_validate(stall.to_json()))

    @router.get("/executions/{execution_id}/logs", response_model=list[m.AttemptLog],
                tags=["executions"], responses=problem_responses(404))
    async def execution_logs(execution_id: str) -> list[m.AttemptLog]:
        """What the execution's handlers logged (``logging`` and ``ctx.log``), attempt by
        attempt, oldest first; attempts that logged nothing are left out."""
        model = await clients.model()
        result = await model.view(execution_id)  # 404 before anything else
        return [m.AttemptLog.model_validate(a.to_dict())
                for a in await model.attempt_logs(result.id)]

    @router.post("/executions/{execution_id}/cancel", response_model=m.Cancelled,
                 tags=["executions"], responses=problem_responses(404, 409))
    async def cancel(execution_id: str, body: m.CancelBody | None = None) -> m.Cancelled:
        """Cancel an unfinished execution (its running tasks are told to stop); the body's
        ``reason`` is kept as its error."""
        client = await clients.get()
        eid = await client.resolve(execution_id)  # a unique prefix or tail too
        await client.get(eid)  # 404 before anything else
        cancelled = await client.cancel(
            CancelRequest(eid, "cancelled" if body is None else body.reason))
        status = (await statuses(client, [eid])).get(eid, "cancelled")
        return m.Cancelled(id=eid, cancelled=cancelled, status=status)  # type: ignore[arg-type]

    @router.post("/executions/{execution_id}/repair", response_model=m.Repaired,
                 tags=["executions"], responses=problem_responses(404, 409))
    async def repair(execution_id: str) -> m.Repaired:
        """Re-run the degraded and failed steps of a finished execution and what depends on
        them (409 when there is nothing to repair or it has not finished)."""
        client = await operator()
        eid = await client.resolve(execution_id)  # a unique prefix or tail too
        await client.get(eid)
        try:
            rerun = await client.repair(RepairRequest(eid))
        except ExecutionNotFound:
            raise
        except (NothingToRepair, WorkflowNotFound, NoCode) as exc:
            raise Refused(409, str(exc)) from None
        except KonduitError as exc:
            if type(exc) is not KonduitError:
                raise
            raise Refused(409, str(exc)) from None  # running, pending or cancelled
        status = (await statuses(client, [eid])).get(eid, "running")
        return m.Repaired(id=eid, rerun=rerun, status=status)  # type: ignore[arg-type]

    @router.post("/executions/{execution_id}/migrate", response_model=m.Migrated,
                 tags=["executions"], responses=problem_responses(404, 409))
    async def migrate(execution_id: str, body: m.MigrateBody) -> m.Migrated:
        """Move a running execution to version ``to_version`` of its workflow: allowed when
        every step that started or ended exists there with the same upstreams (409 naming the
        ``step`` otherwise). Without workflow code here, a migration that must start a step
        at once is refused too (docs/migrating-executions.md)."""
        client = await clients.get()
        try:
            eid = await client.resolve(execution_id)
        except ExecutionNotFound as exc:
            raise Refused(404, str(exc)) from None
        if app is not None:  # the App's code starts what must start at once
            client = client.with_registry(app.registry, max_payload_bytes=app.max_payload_bytes)
        try:
            done = await client.migrate(MigrateRequest(eid, body.to_version))
        except MigrationRefused as exc:
            raise Refused(409, str(exc), step=exc.step) from None
        except (WorkflowNotFound, WorkflowVersionConflict) as exc:
            raise Refused(409, str(exc), field="body.to_version") from None
        status = (await statuses(client, [eid])).get(eid, "running")
        return m.Migrated(id=eid, workflow=done.workflow, from_version=done.from_version,
                          to_version=done.to_version, migrated=done.migrated,
                          added=list(done.added), dropped=list(done.dropped),
                          started=list(done.started), skipped=list(done.skipped),
                          status=status)  # type: ignore[arg-type]

    @router.post("/events", response_model=m.EventSent, tags=["executions"])
    async def send_event(body: m.EventBody) -> m.EventSent:
        """Send an event to the step waiting for it, by ``key`` and/or ``execution_id``
        (docs/durable-waits.md), and to the workflows whose ``on_event`` takes it (``started``;
        docs/events.md; then ``key`` and ``execution_id`` may both be left out). Without
        workflow code here, a worker completes the task, or applies the trigger's code."""
        client = await clients.get()
        if app is not None:  # the App's workflows: its code completes the task at once
            client = client.with_registry(app.registry, max_payload_bytes=app.max_payload_bytes,
                                          event_retention=app.event_retention)
        try:
            result = await client.send_event(EventRequest(
                body.name, key=body.key, execution_id=body.execution_id, payload=body.payload))
        except (PayloadError, TriggerCodeFailed) as exc:  # recorded failed (docs/events.md)
            raise Refused(422, str(exc), field="body.payload") from None
        except KonduitError as exc:  # a key PostgreSQL cannot store (NUL)
            raise Refused(422, str(exc), field="body.key") from None
        return m.EventSent(result=result)

    @router.get("/dead-letters", response_model=list[m.DeadLetter], tags=["operations"])
    async def dead_letters(limit: Limit = 100) -> list[m.DeadLetter]:
        """Tasks whose retries ran out (or that failed non-retryably), newest first."""
        rows = await (await clients.model()).dead_letters(limit)
        return [m.DeadLetter(task_id=r.id, execution_id=r.execution_id, workflow=r.workflow_name,
                             step=r.step, map_index=r.map_index, attempt=r.attempt,
                             error=r.error, finished_at=r.finished_at) for r in rows]

    @router.get("/workflows", response_model=list[m.WorkflowOut], tags=["operations"])
    async def workflows() -> list[m.WorkflowOut]:
        """Every registered workflow version with its DAG (steps, edges, joins), its running
        executions and the live workers serving it (``unserved``: executions, no worker)."""
        model = await clients.model()
        rows = await model.workflows()
        states = {(v.name, v.version): v for v in await model.versions()}
        known = set(app.registry.keys()) if app is not None else set()
        started_by: dict[tuple[str, int], list[m.TriggerOut]] = {}
        for t in await model.triggers():
            started_by.setdefault((t.workflow_name, t.workflow_version), []).append(m.TriggerOut(
                event=t.event, mode=t.mode, description=t.description,  # type: ignore[arg-type]
                open_groups=t.open_groups, pending=t.pending, last_event_at=t.last_event_at))
        out = []
        for r in rows:
            steps, edges, joins = spec_view(r.spec or {})
            served = workflow_key(r.name, r.version) in known
            # None: registered between the two reads, so nothing of it runs yet.
            state = states.get((r.name, r.version))
            out.append(m.WorkflowOut(
                name=r.name, version=r.version, spec_hash=r.spec_hash, created_at=r.created_at,
                served=served, steps=steps, edges=edges, joins=joins,
                policy_revision=1 if state is None else state.policy_revision,
                running=0 if state is None else state.running,
                workers=[] if state is None else state.workers,
                unserved=state is not None and state.unserved,
                unserved_since=None if state is None else state.unserved_since,
                triggers=started_by.get((r.name, r.version), [])))
        return out

    @router.get("/workers", response_model=list[m.WorkerOut], tags=["operations"])
    async def workers() -> list[m.WorkerOut]:
        """The workers that are up, with what they serve and run."""
        return [m.WorkerOut.from_row(r.to_dict()) for r in await (await clients.model()).workers()]

    @router.get("/schedules", response_model=list[m.ScheduleOut], tags=["operations"])
    async def schedules() -> list[m.ScheduleOut]:
        """Every stored schedule, its next tick and the execution of its latest tick."""
        rows = await (await clients.model()).schedules()
        return [m.ScheduleOut.model_validate(r.to_dict() | {"workflow": r.workflow_name})
                for r in rows]

    @router.get("/alerts", response_model=list[m.AlertOut], tags=["operations"])
    async def alerts(all: bool = False, kind: Annotated[str | None, Query(max_length=100)] = None,
                     workflow: Annotated[str | None, Query(max_length=200)] = None,
                     limit: Limit = 100) -> list[m.AlertOut]:
        """Open alerts, newest first (``all``: resolved ones too)."""
        try:
            found = await (await clients.model()).alerts(include_resolved=all, kind=kind or None,
                                                       workflow=workflow or None, limit=limit)
        except AlertError as exc:
            raise Refused(422, str(exc), "query.kind") from None
        return [m.AlertOut.model_validate(a.to_json()) for a in found]

    @router.get("/stats", response_model=m.StatsOut, tags=["operations"])
    async def stats(workflow: Annotated[str | None, Query(max_length=200)] = None,
                    history: Annotated[str, Query(max_length=50)] = "24h",
                    fan_in_alert: Annotated[str, Query(max_length=50)] = "20s",
                    consecutive: Annotated[int, Query(ge=1, le=1000)] = 2) -> m.StatsOut:
        """``konduit stats``: per branch and per join over ``history``, and the fan-in alerts."""
        try:
            found = await (await clients.model()).stats(workflow or None, history=history,
                                                      fan_in_alert=fan_in_alert,
                                                      consecutive=consecutive)
        except StatsError as exc:
            text = str(exc)
            field = next((f"query.{f}" for f in ("history", "fan_in_alert", "workflow")
                          if f.replace("_", "-") in text or f in text), None)
            raise Refused(422, text, field) from None
        return m.StatsOut.model_validate(found.to_json())

    @router.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    async def docs(request: Request) -> Response:
        """The API's reference, rendered here from the OpenAPI (nothing fetched elsewhere)."""

        spec = request.app.openapi()
        return HTMLResponse(env.get_template("api_docs.html").render(
            spec=spec, operations=operations(spec), csrf_token=""))

    return router


def operations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The operations of an OpenAPI document, in path order, for the docs page."""
    out = []
    for path, methods in spec.get("paths", {}).items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            answers = op.get("responses", {})
            ok: dict[str, Any] = next((r for s, r in answers.items() if s.startswith("2")), {})
            out.append({"method": method.upper(), "path": path, "summary": op.get("summary", ""),
                        "description": op.get("description", ""),
                        "parameters": op.get("parameters", []),
                        "body": body.get("schema"),
                        "response": ok.get("content", {}).get("application/json", {}).get("schema"),
                        "codes": sorted(op.get("responses", {}))})
    return out
