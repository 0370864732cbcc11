"""``/api/v1``: the dashboard's JSON API (docs/api.md), described by ``/openapi.json``.

Nothing here needs workflow code: a start (or repair) of a workflow the dashboard's App
(``--app MODULE:ATTR``) does not have uses the definition a worker registered in the database,
and its input is checked against the JSON Schema stored with it. Each route performs its
operation through the one definition (:class:`~konduit.web.clients.ServerOperations`), which
checks the request once; every refusal is ``application/problem+json`` naming the field at
fault and the error's ``code``, read from the error's attributes (:mod:`konduit.web.problems`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from markupsafe import Markup, escape

from konduit import doctext, tracing
from konduit.core.requests import BulkRequest, StartRequest
from konduit.core.search import SearchError, search_filter
from konduit.errors import (
    DatabaseError,
    ExecutionInHistory,
    IdempotencyConflict,
    InputValidationError,
    KonduitError,
    MigrationRefused,
    NotAnswerable,
    SchemaOutdated,
    UserCodeStuck,
    WorkflowNotFound,
    WorkflowVersionConflict,
)
from konduit.settings import settings
from konduit.web import api_models as m
from konduit.web.jobs import BulkJob
from konduit.web.problems import FieldError, problem, problem_responses
from konduit.web.security import who_acts
from konduit.web.site import Ops
from konduit.web.templating import env


class Refused(Exception):
    """A request refused with a problem (turned into problem+json by the app's handler)."""

    def __init__(self, status: int, detail: str, field: str | None = None,
                 step: str | None = None, errors: list[FieldError] | None = None,
                 code: str | None = None):
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field
        self.step, self.errors, self.code = step, errors, code

    def response(self) -> JSONResponse:
        return problem(self.status, self.detail, field=self.field, step=self.step,
                       errors=self.errors, code=self.code)

    @classmethod
    def of(cls, exc: KonduitError, status: int = 422, where: str = "body.") -> Refused:
        """The problem of a refused operation: the field at fault as the error names it
        (``exc.field``, under ``where``: ``body.``, ``query.``), and its ``code``. A write to
        an execution moved into the history is a conflict (409), whatever the route."""
        if isinstance(exc, ExecutionInHistory):
            status = 409
        return cls(status, str(exc), None if exc.field is None else where + exc.field,
                   code=exc.code)


NOT_THE_CALLERS = (DatabaseError, SchemaOutdated)
"""Errors of the server's database, not of the request: answered 503 by the app's handler, never
as the caller's fault (a route that refuses every other KonduitError re-raises these)."""

TraceParent = Annotated[str | None, Header(
    max_length=200, description="W3C trace context of the caller (ignored when not valid)")]
TraceState = Annotated[str | None, Header(max_length=512, description="W3C trace state")]
Limit = Annotated[int, Query(ge=1, le=500, description="At most this many")]

router = APIRouter(prefix="/api/v1", responses=problem_responses(400, 401, 403, 413, 422, 503))


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


def start_refusal(exc: KonduitError) -> Refused:
    """The problem of a refused start, from what the error carries: the field at fault
    (``exc.field``; in a batch under the index of the request at fault, ``exc.index``), one
    entry per fault of an input that does not match its schema, and the error's ``code``. A
    start-time key the server has no code for (``key_needs_code``) names no field: no field
    of the request is at fault, the server lacks the workflow's code."""
    where = "body." if exc.index is None else f"body.requests.{exc.index}."
    # Too many calls of the workflow's start-time code hung: the server's state, not the
    # request, is at fault (UserCodeStuck), and a later try may pass.
    status = (409 if isinstance(exc, IdempotencyConflict)
              else 503 if isinstance(exc, UserCodeStuck) else 422)
    refusal = Refused.of(exc, status, where)
    if isinstance(exc, InputValidationError) and exc.errors:
        refusal.errors = [FieldError(field=f"{where}input" + ("" if f == "(root)" else f".{f}"),
                                     message=message) for f, message in exc.errors.items()]
        refusal.field = refusal.errors[0].field
    return refusal


def spec_view(spec: dict[str, Any]) -> tuple[list[m.StepDefinition], list[tuple[str, str]], list[m.Join]]:
    steps = [m.StepDefinition.model_validate(s) for s in spec.get("steps", [])]
    edges = [(up, s.name) for s in steps for up in s.after]
    joins = [m.Join(step=s.name, upstream=list(s.after), policy=s.join or m.JoinPolicy(kind="all_succeeded"))
             for s in steps if len(s.after) > 1]
    return steps, edges, joins


# -- starting ---------------------------------------------------------------------------------


@router.post("/executions", status_code=201, response_model=m.Started, tags=["executions"],
             responses=problem_responses(409))
async def start(body: m.StartBody, ops: Ops, traceparent: TraceParent = None,
                tracestate: TraceState = None) -> m.Started:
    """Start an execution; the same idempotency key (and input) gives the same one. A W3C
    ``traceparent`` header makes the execution part of the caller's trace."""
    try:
        handle = await ops.start(**dict(body),
                                 trace_context=tracing.incoming(traceparent, tracestate))
    except NOT_THE_CALLERS:
        raise
    except KonduitError as exc:
        raise start_refusal(exc) from None
    found = await ops.progress([handle.id])
    return m.Started(id=handle.id, status=found.get(handle.id, "pending"))  # type: ignore[arg-type]


@router.post("/executions:batch", status_code=201, response_model=m.StartedMany,
             tags=["executions"], responses=problem_responses(409))
async def start_many(body: m.BatchBody, ops: Ops, traceparent: TraceParent = None,
                     tracestate: TraceState = None) -> m.StartedMany:
    """Start many executions in one transaction: every one of them, or none (a W3C
    ``traceparent`` header: all of them in the caller's trace)."""
    try:
        handles = await ops.start_many([StartRequest(**dict(b)) for b in body.requests],
                                       trace_context=tracing.incoming(traceparent, tracestate))
    except NOT_THE_CALLERS:
        raise
    except KonduitError as exc:
        raise start_refusal(exc) from None
    ids = [h.id for h in handles]
    found = await ops.progress(ids) if ids else {}
    return m.StartedMany(executions=[m.Started(id=i, status=found.get(i, "pending"))  # type: ignore[arg-type]
                                     for i in ids])


# -- finding and reading ----------------------------------------------------------------------


@router.get("/executions", response_model=m.ExecutionPage, tags=["executions"])
async def executions(ops: Ops, status: m.ExecutionStatus | None = None,
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
    before = decode_cursor(cursor) if cursor else None
    try:
        where = search_filter(id=id, key=key, tags=tag, inputs=input, status=status,
                              workflow=workflow, since=since, until=until, fair_key=fair_key)
    except KonduitError as exc:  # the parameter at fault, when the error names one
        raise Refused(422, str(exc), "query" if exc.field is None else f"query.{exc.field}",
                      code=exc.code) from None
    try:
        rows = await ops.search(where, before=before, limit=limit + 1)
    except SearchError as exc:  # by input under a payload codec: named like a bad filter
        raise Refused(422, str(exc), "query" if exc.field is None else f"query.{exc.field}",
                      code=exc.code) from None
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
async def execution(execution_id: str, ops: Ops) -> m.ExecutionDetail:
    """One execution whole: input, output, each step, every attempt with its full error, the
    answers of its ``wait_for_input`` steps, and how its automatic repair stands."""
    model = await ops.model()
    result = await model.view(execution_id)
    row = await model.execution(result.id)
    return m.ExecutionDetail(
        id=result.id, workflow=result.workflow, version=result.version,
        status=result.status,  # type: ignore[arg-type]
        input=row.input, output=result.output, error=result.error,
        outcomes=result.outcomes, idempotency_key=row.idempotency_key,
        created_at=row.created_at, finished_at=row.finished_at,
        deadline_at=row.deadline_at, timeout_at=row.timeout_at,
        output_version=row.output_version, tags=row.tags or {}, run_at=row.run_at,
        priority=row.priority, fair_key=row.fair_key,
        steps=[m.StepState.model_validate(s.to_dict()) for s in await ops.steps(result.id)],
        attempts=[m.Attempt.model_validate(a.to_dict())
                  for a in await model.attempts(result.id)],
        output_versions=[m.OutputVersion.model_validate(v.to_dict())
                         for v in await ops.outputs(result.id)],
        stalled=None if result.finished or (stall := await ops.stall(result.id)) is None
        else m.AlertOut.model_validate(stall.to_json()),
        streams=[m.StreamOut.model_validate(s.to_dict()) for s in await ops.streams(result.id)],
        answers=[m.AnswerOut(execution_id=a.execution_id, step=a.step, value=a.value,
                             answered_by=a.answered_by, answered_at=a.answered_at)
                 for a in await ops.answers(result.id)],
        auto_repair=await ops.auto_repair_status(result.id))


@router.get("/executions/{execution_id}/logs", response_model=list[m.AttemptLog],
            tags=["executions"], responses=problem_responses(404))
async def execution_logs(execution_id: str, ops: Ops) -> list[m.AttemptLog]:
    """What the execution's handlers logged (``logging`` and ``ctx.log``), attempt by
    attempt, oldest first; attempts that logged nothing are left out."""
    result = await (await ops.model()).view(execution_id)  # 404 before anything else
    return [m.AttemptLog.model_validate(a.to_dict()) for a in await ops.attempt_logs(result.id)]


@router.get("/executions/{execution_id}/journal", response_model=list[m.JournalEntry],
            tags=["executions"], responses=problem_responses(404))
async def execution_journal(execution_id: str, ops: Ops) -> list[m.JournalEntry]:
    """The durable calls an execution's handlers recorded (``ctx.call``; docs/journal.md), by
    step, item and position: each call's name, the attempt that ran it live, how long it took
    and how often later attempts replayed it."""
    result = await (await ops.model()).view(execution_id)  # 404 before anything else
    return [m.JournalEntry.model_validate(e.to_dict()) for e in await ops.journal(result.id)]
@router.get("/executions/{execution_id}/streams", response_model=list[m.StreamOut],
            tags=["executions"], responses=problem_responses(404))
async def execution_streams(execution_id: str, ops: Ops) -> list[m.StreamOut]:
    """The execution's durable streams (``ctx.stream``), by name."""
    eid = (await ops.status(execution_id)).id  # a unique prefix or tail too; 404 first
    return [m.StreamOut.model_validate(s.to_dict()) for s in await ops.streams(eid)]


SSE_RESPONSE: dict[int | str, dict[str, Any]] = {200: {
    "description": "Server-sent events: one per record, ``id`` its offset, ``event`` its kind "
                   "(data or restart), ``data`` the record as JSON; then an ``end`` event when "
                   "the stream ended",
    "content": {"text/event-stream": {"schema": {"type": "string"}}}}}


async def with_keepalive(source: AsyncIterator[str], every: float) -> AsyncIterator[str]:
    """``source``'s items, and ``": keep-alive"`` comments while it has sent nothing for
    ``every`` seconds. The next item is awaited in a task of its own (never cancelled by a
    keep-alive), so a slow source is waited for, not restarted."""
    it = source.__aiter__()
    pending: asyncio.Future[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield ": keep-alive\n\n"
                continue
            finished, pending = pending, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.wait({pending})  # its outcome is not ours to raise
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()


def sse_event(kind: str, data: Any, event_id: int | None = None) -> str:
    """One server-sent event (``data`` as one line of JSON)."""
    head = "" if event_id is None else f"id: {event_id}\n"
    return f"{head}event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@router.get("/executions/{execution_id}/streams/{name:path}", response_class=StreamingResponse,
            tags=["executions"], responses={**SSE_RESPONSE, **problem_responses(404)})
async def execution_stream(
    execution_id: str, name: str, ops: Ops,
    from_offset: Annotated[int, Query(ge=0, le=2**62, description=(
        "The first offset to send (0: all); a Last-Event-ID header resumes after it "
        "instead"))] = 0,
    follow: Annotated[bool, Query(description=(
        "Send the records still to come until the stream ends (else stop at the end of "
        "what is stored now)"))] = True,
    last_event_id: Annotated[str | None, Header(max_length=24, description=(
        "The last offset received (EventSource sends it when it reconnects): the events "
        "resume after it"))] = None,
) -> StreamingResponse:
    """Follow one durable stream of the execution as server-sent events (docs/streams.md):
    each record once, in offset order, from ``from_offset`` (or after ``Last-Event-ID``);
    restart records say where a retried attempt started writing again. The answer ends with
    an ``end`` event once the stream ended (its task or its execution ended)."""
    eid = (await ops.status(execution_id)).id  # 404 before the stream starts
    start = from_offset
    if last_event_id is not None:
        try:
            start = int(last_event_id) + 1
        except ValueError:
            raise Refused(400, f"Last-Event-ID must be an offset (a whole number), not "
                          f"{last_event_id!r}", field="header.last-event-id") from None
        if start < 0:
            raise Refused(400, "Last-Event-ID must be an offset >= 0",
                          field="header.last-event-id")

    async def events() -> AsyncIterator[str]:
        try:
            async for chunk in ops.stream(eid, name, from_offset=start, follow=follow):
                yield sse_event(chunk.kind, chunk.to_json(), chunk.offset)
        except KonduitError as exc:  # said in the stream: its status went out already
            yield sse_event("error", {"detail": str(exc), "code": exc.code})
            return
        yield sse_event("end", {})

    # A quiet followed stream sends an SSE comment every KONDUIT_STREAM_KEEPALIVE seconds:
    # proxies and load balancers close a connection idle for their timeout (often 30-60 s),
    # and the reader would reconnect for nothing; a comment is no event to the reader.
    return StreamingResponse(with_keepalive(events(), settings().stream_keepalive),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# -- commands ---------------------------------------------------------------------------------


@router.post("/executions/{execution_id}/cancel", response_model=m.Cancelled,
             tags=["executions"], responses=problem_responses(404, 409))
async def cancel(execution_id: str, ops: Ops, body: m.CancelBody | None = None) -> m.Cancelled:
    """Cancel an unfinished execution (its running tasks are told to stop); the body's
    ``reason`` is kept as its error."""
    eid = (await ops.status(execution_id)).id  # a unique prefix or tail too; 404 first
    try:
        cancelled = await ops.cancel(eid, (body or m.CancelBody()).reason)
    except NOT_THE_CALLERS:
        raise
    except KonduitError as exc:  # a reason no text column can hold (a NUL)
        raise Refused.of(exc) from None
    status = (await ops.progress([eid])).get(eid, "cancelled")
    return m.Cancelled(id=eid, cancelled=cancelled, status=status)  # type: ignore[arg-type]


REPAIR_REFUSALS = {"nothing_to_repair", "workflow_not_found", "no_code", "konduit_error"}
"""The codes of a repair refused as a conflict (409): nothing to repair, no definition or code
to re-run, or an execution that is running, pending or cancelled."""


@router.post("/executions/{execution_id}/repair", response_model=m.Repaired,
             tags=["executions"], responses=problem_responses(404, 409))
async def repair(execution_id: str, ops: Ops) -> m.Repaired:
    """Re-run the degraded and failed steps of a finished execution and what depends on
    them (409 when there is nothing to repair or it has not finished)."""
    eid, rerun, status = await _run_again(ops, execution_id, ops.repair, REPAIR_REFUSALS)
    return m.Repaired(id=eid, rerun=rerun, status=status)  # type: ignore[arg-type]


async def _run_again(ops: Any, execution_id: str,
                     operation: Callable[[UUID], Awaitable[list[str]]],
                     refusals: set[str]) -> tuple[UUID, list[str], str]:
    """A repair or a redrive through the API: the execution (404 first), the steps re-run
    (409 for the operation's refusals) and its status after."""
    eid = (await ops.status(execution_id)).id  # a unique prefix or tail too; 404 first
    try:
        rerun = await operation(eid)
    except KonduitError as exc:
        if exc.code not in refusals:
            raise
        raise Refused(409, str(exc), code=exc.code) from None
    return eid, rerun, (await ops.progress([eid])).get(eid, "running")


REDRIVE_REFUSALS = {"not_redrivable", "nothing_to_repair", "workflow_not_found", "no_code"}
"""The codes of a redrive refused as a conflict (409): an execution that runs or succeeded,
nothing left to re-run, or no definition or code to re-run."""


@router.post("/executions/{execution_id}/redrive", response_model=m.Redriven,
             tags=["executions"], responses=problem_responses(404, 409))
async def redrive(execution_id: str, ops: Ops) -> m.Redriven:
    """Run a failed, timed-out or cancelled execution again from the steps that did not
    succeed, keeping every succeeded and degraded output, as a new generation (409 for one
    that runs or succeeded: a repair re-runs a succeeded execution's degraded steps)."""
    eid, rerun, status = await _run_again(ops, execution_id, ops.redrive, REDRIVE_REFUSALS)
    return m.Redriven(id=eid, rerun=rerun, status=status)  # type: ignore[arg-type]


FORK_CONFLICTS = {"not_forkable", "workflow_not_found", "no_code"}
"""The codes of a fork refused as a conflict (409): an upstream step of ``from_step`` that did
not succeed in the origin, or no definition or code to run the fork."""


@router.post("/executions/{execution_id}/fork", status_code=201, response_model=m.Forked,
             tags=["executions"], responses=problem_responses(404, 409))
async def fork(execution_id: str, body: m.ForkBody, ops: Ops) -> m.Forked:
    """Start a new execution that copies the outputs of the steps ``from_step`` depends on
    from this one and runs ``from_step`` and the rest (``input`` null or absent: the
    origin's). 422 naming ``body.from_step`` for a step the workflow lacks, or ``body.input``
    for an input it refuses; 409 when an upstream step of ``from_step`` did not succeed."""
    eid = (await ops.status(execution_id)).id  # a unique prefix or tail too; 404 first
    try:
        handle = await ops.fork(eid, from_step=body.from_step, input=body.input)
    except NOT_THE_CALLERS:
        raise
    except KonduitError as exc:
        if exc.code in FORK_CONFLICTS:
            raise Refused.of(exc, 409) from None
        raise start_refusal(exc) from None
    status = (await ops.progress([handle.id])).get(handle.id, "running")
    return m.Forked(id=handle.id, forked_from=eid, from_step=body.from_step,
                    status=status)  # type: ignore[arg-type]


@router.post("/executions:bulk", response_model=m.BulkDone, tags=["executions"])
async def bulk(body: m.BulkBody, ops: Ops) -> m.BulkDone:
    """Cancel or redrive every execution the ``where`` filter finds (the search's parts, as
    ``GET /api/v1/executions`` takes them; at least one), ``batch_size`` per transaction, so
    no lock is held longer than a batch; ``dry_run`` counts and changes nothing. The answer
    counts what was done and skipped (by reason) once every batch ran."""
    request = _bulk_request(body)
    try:
        done = await ops.bulk(request.action, request.where, dry_run=request.dry_run,
                              batch_size=request.batch_size, reason=request.reason)
    except NOT_THE_CALLERS:
        raise
    except KonduitError as exc:
        raise _bulk_refused(exc) from None
    return m.BulkDone(**{**done.to_dict(), "ids": list(done.ids[:m.MAX_BULK_IDS])})


def _bulk_request(body: m.BulkBody) -> BulkRequest:
    """The request of a bulk body; a bad filter or field is refused naming it."""
    w = body.where
    try:
        where = search_filter(id=w.id, key=w.key, tags=w.tag, inputs=w.input, status=w.status,
                              workflow=w.workflow, since=w.since, until=w.until,
                              fair_key=w.fair_key)
    except KonduitError as exc:
        raise Refused(422, str(exc), "body.where" if exc.field is None
                      else f"body.where.{exc.field}", code=exc.code) from None
    try:
        return BulkRequest(body.action, where, dry_run=body.dry_run,
                           batch_size=body.batch_size, reason=body.reason)
    except KonduitError as exc:  # an empty filter, a reason no text column can hold
        raise Refused.of(exc) from None


def _bulk_refused(exc: KonduitError) -> Refused:
    """A bulk operation's refusal: a search's (by input under a payload codec) names the
    filter's field, ``body.where.input``, as a bad filter is named."""
    if isinstance(exc, SearchError):
        return Refused(422, str(exc), "body.where" if exc.field is None
                       else f"body.where.{exc.field}", code=exc.code)
    return Refused.of(exc)


def _job_out(job: BulkJob) -> m.BulkJobOut:
    done = job.progress
    return m.BulkJobOut(
        id=job.id, state=job.state, action=job.request.action,  # type: ignore[arg-type]
        dry_run=job.request.dry_run, matched=done.matched if done else 0,
        done=done.done if done else 0, skipped=done.skipped if done else {},
        batches=done.batches if done else 0,
        seconds=done.seconds if done else 0.0,
        longest_batch_seconds=done.longest_batch_seconds if done else 0.0, error=job.error)


@router.post("/bulk-jobs", status_code=202, response_model=m.BulkJobOut, tags=["executions"])
async def start_bulk_job(body: m.BulkBody, ops: Ops) -> m.BulkJobOut:
    """``POST /api/v1/executions:bulk`` in the background: answers at once (``202``) with the
    job, whose progress ``GET /api/v1/bulk-jobs/{id}`` reports after each batch. A job lives
    in this server process: a restart forgets it (the batches it finished stay done; the same
    filter again skips them). What the operation refuses before its first batch (a filter
    by input under a payload codec) is refused here, ``422`` naming the field, and no job
    starts."""
    request = _bulk_request(body)
    try:
        job = await ops.start_bulk_job(request)
    except NOT_THE_CALLERS:
        raise
    except KonduitError as exc:
        raise _bulk_refused(exc) from None
    return _job_out(job)


@router.get("/bulk-jobs/{job_id}", response_model=m.BulkJobOut, tags=["executions"],
            responses=problem_responses(404))
async def bulk_job(job_id: UUID, ops: Ops) -> m.BulkJobOut:
    """How far a bulk job got: the counts of the batches done so far, its ``state``
    (``running``, ``succeeded``, ``failed`` with its ``error``)."""
    job = ops.jobs.get(job_id)
    if job is None:
        raise Refused(404, f"no bulk job {job_id} on this server (jobs live in the server "
                      "process that runs them)", code="bulk_job_not_found")
    return _job_out(job)


@router.post("/executions/{execution_id}/migrate", response_model=m.Migrated,
             tags=["executions"], responses=problem_responses(404, 409))
async def migrate(execution_id: str, body: m.MigrateBody, ops: Ops) -> m.Migrated:
    """Move a running execution to version ``to_version`` of its workflow: allowed when
    every step that started or ended exists there with the same upstreams (409 naming the
    ``step`` otherwise). Without workflow code here, a migration that must start a step
    at once is refused too (docs/migrating-executions.md)."""
    try:
        done = await ops.migrate(execution_id, to_version=body.to_version)
    except MigrationRefused as exc:
        raise Refused(409, str(exc), step=exc.step, code=exc.code) from None
    except (WorkflowNotFound, WorkflowVersionConflict) as exc:  # to_version is at fault
        raise Refused(409, str(exc), field="body.to_version", code=exc.code) from None
    status = (await ops.progress([done.execution_id])).get(done.execution_id, "running")
    return m.Migrated(id=done.execution_id, workflow=done.workflow,
                      from_version=done.from_version, to_version=done.to_version,
                      migrated=done.migrated, added=list(done.added),
                      dropped=list(done.dropped), started=list(done.started),
                      skipped=list(done.skipped), status=status)  # type: ignore[arg-type]


@router.post("/events", response_model=m.EventSent, tags=["executions"])
async def send_event(body: m.EventBody, ops: Ops) -> m.EventSent:
    """Send an event to the step waiting for it, by ``key`` and/or ``execution_id``
    (docs/durable-waits.md), and to the workflows whose ``on_event`` takes it (``started``;
    docs/events.md; then ``key`` and ``execution_id`` may both be left out). Without
    workflow code here, a worker completes the task, or applies the trigger's code."""
    try:
        result = await ops.send_event(body.name, key=body.key, execution_id=body.execution_id,
                                      payload=body.payload)
    except NOT_THE_CALLERS:
        raise
    except InputValidationError as exc:  # a payload model declared for the event refused it
        raise fields_refused(exc, "body.payload") from None
    except KonduitError as exc:  # a payload too large, a key PostgreSQL cannot store (NUL)...
        raise Refused.of(exc) from None
    return m.EventSent(result=result)


def fields_refused(exc: InputValidationError, where: str) -> Refused:
    """422 for a value refused by its JSON Schema: one entry per field at fault, under
    ``where`` (the body's member that holds the value)."""
    refusal = Refused.of(exc)
    refusal.errors = [FieldError(field=where + ("" if f == "(root)" else f".{f}"),
                                 message=message) for f, message in exc.errors.items()]
    refusal.field = refusal.errors[0].field if refusal.errors else where
    return refusal


def answerer(request: Request, named: str | None) -> str:
    """Who answers, as recorded: the credential the request came with (its token's label, or
    the open dashboard's), after the name the caller gives, if any."""
    who = who_acts(request.scope)
    return who if not named else f"{named} via {who}"


@router.post("/executions/{execution_id}/steps/{step}/answer", response_model=m.AnswerOut,
             tags=["executions"], responses=problem_responses(404, 409))
async def answer(execution_id: str, step: str, body: m.AnswerBody, request: Request,
                 ops: Ops) -> m.AnswerOut:
    """Answer a ``wait_for_input`` step (docs/people-in-the-loop.md): ``value`` is checked
    against the step's model (422 with one entry per ``body.value.<field>`` at fault) and
    becomes the step's output; who answered (the token's label, after ``answered_by``) and
    when are recorded with it. 409 when the step waits for no answer now: not a
    ``wait_for_input`` step, not reached yet, answered already, past its deadline, or its
    execution no longer runs."""
    try:
        done = await ops.answer(execution_id, step, body.value,
                                answered_by=answerer(request, body.answered_by))
    except NOT_THE_CALLERS:
        raise
    except InputValidationError as exc:
        raise fields_refused(exc, "body.value") from None
    except NotAnswerable as exc:
        raise Refused(409, str(exc), step=exc.step, code=exc.code) from None
    except KonduitError as exc:
        if exc.field != "answered_by":
            raise  # the app's handlers answer it (404 for an unknown execution, ...)
        raise Refused.of(exc) from None  # the body's answered_by (with the token's label)
    return m.AnswerOut(execution_id=done.execution_id, step=done.step,
                       value=done.value, answered_by=done.answered_by,
                       answered_at=done.answered_at)


@router.get("/inbox", response_model=list[m.InboxItem], tags=["executions"],
            responses=problem_responses(404, 409))
async def inbox(ops: Ops, limit: Limit = 100,
                execution_id: Annotated[str | None, Query(
                    max_length=100, description="Only the waits of this execution (its id, or "
                    "a unique start or end of it)")] = None) -> list[m.InboxItem]:
    """Every ``wait_for_input`` step waiting for a person's answer (of one execution, or of
    all), oldest first: workflow, execution, step, waiting since, deadline, who may answer, and
    the JSON Schema of the answer (docs/people-in-the-loop.md)."""
    return [m.InboxItem(execution_id=i.execution_id, workflow=i.workflow_name,
                        version=i.workflow_version, step=i.step, waiting_since=i.waiting_since,
                        deadline_at=i.deadline_at, who=i.who, answer_schema=i.schema)
            for i in await ops.inbox(execution_id=execution_id or None, limit=limit)]


# -- the fleet --------------------------------------------------------------------------------


@router.get("/dead-letters", response_model=list[m.DeadLetter], tags=["operations"])
async def dead_letters(ops: Ops, limit: Limit = 100) -> list[m.DeadLetter]:
    """Tasks whose retries ran out (or that failed non-retryably), newest first."""
    return [m.DeadLetter(task_id=r.id, execution_id=r.execution_id, workflow=r.workflow_name,
                         step=r.step, map_index=r.map_index, attempt=r.attempt,
                         error=r.error, finished_at=r.finished_at)
            for r in await ops.dead_letters(limit)]


@router.get("/workflows", response_model=list[m.WorkflowOut], tags=["operations"])
async def workflows(ops: Ops) -> list[m.WorkflowOut]:
    """Every registered workflow version with its DAG (steps, edges, joins), its running
    executions and the live workers serving it (``unserved``: executions, no worker)."""
    rows = await ops.workflows()
    states = {(v.name, v.version): v for v in await ops.versions()}
    started_by: dict[tuple[str, int], list[m.TriggerOut]] = {}
    for t in await ops.triggers():
        started_by.setdefault((t.workflow_name, t.workflow_version), []).append(m.TriggerOut(
            event=t.event, mode=t.mode, description=t.description,  # type: ignore[arg-type]
            open_groups=t.open_groups, pending=t.pending, last_event_at=t.last_event_at))
    out = []
    for r in rows:
        steps, edges, joins = spec_view(r.spec or {})
        # None: registered between the two reads, so nothing of it runs yet.
        state = states.get((r.name, r.version))
        out.append(m.WorkflowOut(
            name=r.name, version=r.version, spec_hash=r.spec_hash, created_at=r.created_at,
            served=ops.serves(r.name, r.version), steps=steps, edges=edges, joins=joins,
            policy_revision=1 if state is None else state.policy_revision,
            running=0 if state is None else state.running,
            workers=[] if state is None else state.workers,
            unserved=state is not None and state.unserved,
            unserved_since=None if state is None else state.unserved_since,
            triggers=started_by.get((r.name, r.version), [])))
    return out


@router.get("/workers", response_model=list[m.WorkerOut], tags=["operations"])
async def workers(ops: Ops) -> list[m.WorkerOut]:
    """The workers that are up, with what they serve and run."""
    return [m.WorkerOut.from_row(r.to_dict()) for r in await ops.workers()]


@router.get("/schedules", response_model=list[m.ScheduleOut], tags=["operations"])
async def schedules(ops: Ops) -> list[m.ScheduleOut]:
    """Every stored schedule, its next tick and the execution of its latest tick."""
    return [m.ScheduleOut.model_validate(r.to_dict() | {"workflow": r.workflow_name})
            for r in await ops.schedules()]


@router.get("/alerts", response_model=list[m.AlertOut], tags=["operations"])
async def alerts(ops: Ops, all: bool = False,
                 kind: Annotated[str | None, Query(max_length=100)] = None,
                 workflow: Annotated[str | None, Query(max_length=200)] = None,
                 limit: Limit = 100) -> list[m.AlertOut]:
    """Open alerts, newest first (``all``: resolved ones too)."""
    try:
        found = await ops.alerts(include_resolved=all, kind=kind or None,
                                 workflow=workflow or None, limit=limit)
    except NOT_THE_CALLERS:
        raise
    except KonduitError as exc:  # an unknown kind, a workflow no name can be (a NUL)...
        raise Refused.of(exc, where="query.") from None
    return [m.AlertOut.model_validate(a.to_json()) for a in found]


@router.get("/stats", response_model=m.StatsOut, tags=["operations"])
async def stats(ops: Ops, workflow: Annotated[str | None, Query(max_length=200)] = None,
                history: Annotated[str, Query(max_length=50)] = "24h",
                fan_in_alert: Annotated[str, Query(max_length=50)] = "20s",
                consecutive: Annotated[int, Query(ge=1, le=1000)] = 2) -> m.StatsOut:
    """``konduit stats``: per branch and per join over ``history``, and the fan-in alerts."""
    try:
        found = await (await ops.model()).stats(workflow or None, history=history,
                                                fan_in_alert=fan_in_alert,
                                                consecutive=consecutive)
    except NOT_THE_CALLERS:
        raise
    except KonduitError as exc:  # a history that is no duration, a workflow with a NUL...
        raise Refused.of(exc, where="query.") from None
    return m.StatsOut.model_validate(found.to_json())


@router.get("/docs", response_class=HTMLResponse, include_in_schema=False)
async def docs(request: Request) -> Response:
    """The API's reference, rendered here from the OpenAPI (nothing fetched elsewhere)."""
    spec = request.app.openapi()
    return HTMLResponse(env.get_template("api_docs.html").render(
        spec=spec, operations=operations(spec), csrf_token=""))


def schema_type(schema: dict[str, Any] | None) -> Markup:
    """A schema as the docs page shows it, resolved: a reference is a link to the named schema
    (below on the page), an array "list of" its items, a nullable value "X or null", a
    dict "object of" its values, an enum its values; never a raw ``$ref``."""
    if not schema:
        return Markup("any JSON")
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[1]
        return Markup('<a href="#schema-{0}">{0}</a>').format(name)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            joiner = Markup(" and ") if key == "allOf" else Markup(" or ")
            return joiner.join(schema_type(s) for s in schema[key])
    if "enum" in schema:
        return Markup(" | ").join(Markup("<code>{}</code>").format(json.dumps(v))
                                  for v in schema["enum"])
    kind = schema.get("type", "any JSON")
    if kind == "array":
        return Markup("list of ") + schema_type(schema.get("items"))
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return Markup("object of ") + schema_type(schema["additionalProperties"])
    fmt = schema.get("format")
    return escape(f"{kind} ({fmt})" if fmt else str(kind))


def described(text: str | None) -> Markup:
    """An OpenAPI description (Markdown) as HTML."""
    return Markup(doctext.to_html(text or ""))  # escaped by to_html


env.filters.update(schema_type=schema_type, described=described)


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
