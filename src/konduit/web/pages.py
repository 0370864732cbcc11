"""The executions list (paged, with the queue strip), one execution's page (input, DAG, timeline,
tracebacks, map steps collapsed to one row each), a map step's items (paged), the dead letters
(paged), and the JSON the pages' script polls to update their status cells in place.

Paging is by keyset cursor (the last row's sort time and id), so a page does not shift while new
executions arrive; every link to the next page keeps the filters.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar
from urllib.parse import urlencode
from uuid import UUID

from fastapi import APIRouter, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, JSONResponse, Response

from konduit.core.results import ExecutionResult
from konduit.errors import KonduitError
from konduit.reads import ReadModel
from konduit.records import ExecutionFound, ExecutionSummary, StepMark
from konduit.web import views
from konduit.web.api_v1 import encode_cursor as api_cursor
from konduit.web.detail import load_detail
from konduit.web.ops import load_strip
from konduit.web.search_form import SearchText
from konduit.web.site import Site, SiteDep
from konduit.web.summaries import (
    MAP_STATUSES,
    BadCursor,
    decode_cursor,
    encode_cursor,
    live_state,
    map_bars,
    map_summaries,
)
from konduit.web.why import load_reasons

POLL_MS = 2000  # how often the pages' script asks for fresh states
ITEMS_PAGE = 100


def query_string(**params: Any) -> str:
    """``?a=1&b=2`` of the parameters that are set (the filters a page link must keep)."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return "?" + urlencode(kept) if kept else ""


def result_of(row: ExecutionSummary) -> ExecutionResult:
    return ExecutionResult(id=row.id, workflow=row.workflow_name, version=row.workflow_version,
                           status=row.status, output=None, error=row.error, outcomes={},
                           created_at=row.created_at, finished_at=row.finished_at)


K = TypeVar("K")


def page_key(cursor: str | None, key: Callable[[str], K], names: str
              ) -> tuple[datetime | None, K | None]:
    """The (time, key) a page cursor continues after; (None, None) for the first page. Raises
    :class:`BadCursor` saying what it should name when it does not decode."""
    if not cursor:
        return None, None
    try:
        at, raw = decode_cursor(cursor)
        return at, key(raw)
    except (BadCursor, ValueError) as exc:
        if isinstance(exc, BadCursor):
            raise
        raise BadCursor(f"cursor {cursor[:40]!r} does not name {names}; start again from the "
                        "first page") from None


router = APIRouter()


def bad_cursor(site: Site, request: Request, exc: BadCursor) -> Response:
    return site.problem(request, 400, "Bad page cursor", str(exc))


async def execution_rows(model: ReadModel, found: list[ExecutionFound]) -> list[dict[str, Any]]:
    """The executions list's rows: each execution with how long it took, whether a live
    worker serves it, its tags, and its degraded and failed steps."""
    results = [result_of(r) for r in found]
    by_execution: dict[UUID, list[StepMark]] = {}
    for m in await model.marked_steps(r.id for r in results):
        by_execution.setdefault(m.execution_id, []).append(m)
    unserved = await model.unserved(r.id for r in results if not r.finished)
    now = datetime.now(UTC)
    tags = {r.id: r.tags for r in found}
    return [{"r": r, "took": views.between(r.created_at, r.finished_at or now),
             "unserved": r.id in unserved,
             "tags": tags.get(r.id),
             "degraded": sorted(m.step for m in by_execution.get(r.id, [])
                                if m.status == "degraded"),
             "failed": sorted(m.step for m in by_execution.get(r.id, [])
                              if m.status != "degraded")} for r in results]


@router.get("/", response_class=HTMLResponse)
async def executions(request: Request, site: SiteDep, status: str | None = None,
                     workflow: str | None = None, limit: int = 50, cursor: str | None = None,
                     id: str | None = None, key: str | None = None,
                     tag: Annotated[list[str] | None, Query()] = None,
                     input: Annotated[list[str] | None, Query()] = None,
                     since: str | None = None, until: str | None = None,
                     fair_key: str | None = None) -> Response:
    model = await site.model()
    status, workflow, limit = status or None, workflow or None, max(1, min(limit, 500))
    # The search as typed: what the form shows again and every link (pages, live) keeps.
    typed = SearchText.of(id=id, key=key, tag=tag, input=input, since=since, until=until,
                          fair_key=fair_key)
    try:
        before_at, before_id = page_key(cursor, UUID, "an execution")
    except BadCursor as exc:
        return bad_cursor(site, request, exc)
    try:
        where = typed.filter(status=status, workflow=workflow)
    except KonduitError as exc:
        return site.problem(request, 400, "Bad search", str(exc))
    found = await model.search(where, before=None if before_at is None or before_id is None
                                else (before_at, before_id), limit=limit + 1)
    more, found = len(found) > limit, found[:limit]
    rows = await execution_rows(model, found)
    names = sorted({w.name for w in await model.workflows()})
    following = None
    if more and found:
        following = query_string(status=status, workflow=workflow, limit=limit if limit != 50 else None,
                                 cursor=encode_cursor(found[-1].created_at, found[-1].id)) \
            + typed.more_args()
    first = query_string(status=status, workflow=workflow, limit=limit if limit != 50 else None)
    more_args = typed.more_args()
    first = first + more_args if first else "?" + more_args[1:] if more_args else ""
    return site.page(request, "executions.html", rows=rows, workflows=names, status=status,
                     search=typed, searched=bool(typed.more_args()),
                     workflow=workflow, statuses=views.FINISHED | {"pending", "scheduled", "running"},
                     strip=await load_strip(model), next_page=following,
                     first_page=first if cursor else None, poll_ms=POLL_MS,
                     # The same page of the API (same filters, same keyset cursor) keeps
                     # the rows' states fresh; the strip polls its own JSON.
                     live="/api/v1/executions" + query_string(
                         status=status, workflow=workflow, limit=limit,
                         cursor=None if before_at is None or before_id is None
                         else api_cursor(before_at, before_id)) + typed.more_args(),
                     live_strip="/strip.json")


@router.get("/executions/{execution_id}", response_class=HTMLResponse)
async def execution(request: Request, execution_id: str, site: SiteDep) -> Response:
    model = await site.model()
    d = await load_detail(model, execution_id, collapse_maps=True)
    now, origin = datetime.now(UTC), d.result.created_at or datetime.now(UTC)
    reasons = await load_reasons(model, d.result, d.steps, now)
    d.steps = [s | {"word": reasons.words.get(s["step"])} for s in d.steps]
    tries = Counter(a["step"] for a in d.attempts)
    for name, summary in d.maps.items():
        tries[name] = summary.tries
    place = {s["name"]: i for i, s in enumerate(d.spec_steps)}
    ordered = sorted(d.steps, key=lambda s: (s["fired_at"] is None, s["fired_at"] or now,
                                             place.get(s["step"], 0)))
    table = [s | {"tries": tries[s["step"]], "join": int(s["up_total"]) > 1,
                  "fired": views.between(origin, s["fired_at"]),
                  "ended": views.between(origin, s["ended_at"]),
                  "wait": views.between(s["first_upstream_at"], s["fired_at"]),
                  "map": d.maps.get(s["step"]),
                  "budget": d.budgets.get(s["step"]),
                  "why": reasons.of(s["step"])} for s in ordered]
    statuses = {s["step"]: s["status"] for s in d.steps}
    bars = sorted([*d.attempts, *map_bars(d.maps, statuses, now)], key=lambda a: a["started_at"])
    deadline = d.row["deadline_at"]
    failed_in = {f["step"]: int(f["failed_in_step"]) for f in d.failures}
    shown_in = Counter(f["step"] for f in d.failures)
    return site.page(
        request, "execution.html", d=d, r=d.result, steps=table, now=now,
        took=views.between(origin, d.result.finished_at or now),
        dag=views.dag_layout(d.spec_steps, {s["step"]: s for s in d.steps}),
        gantt=views.gantt(bars, d.steps, origin, d.result.finished_at or now, deadline,
                          reasons.waits, finished=d.result.finished_at is not None),
        window=None if deadline is None else {
            "at": deadline, "left": views.between(now, deadline),
            "met": d.result.finished_at <= deadline if d.result.finished_at else None},
        redrivable=d.result.status in ("failed", "timed_out", "cancelled"),
        repairable=d.result.status in ("succeeded", "failed", "timed_out")
        and any(s["status"] in views.REPAIRABLE for s in d.steps),
        cancellable=d.result.status in ("running", "scheduled"),
        failures=d.failures, logs_of={entry["key"]: entry for entry in d.logs},
        more_failures={s: n - shown_in[s] for s, n in failed_in.items()
                                            if n > shown_in[s]},
        statuses=views.STEP_STATUSES, outcomes=views.ATTEMPT_OUTCOMES,
        live=None if d.result.finished else f"/executions/{d.result.id}/live.json",
        # Who answered each wait_for_input step and when (the latest answer of a step).
        answers={a.step: a for a in await model.answers(d.result.id)},
        poll_ms=POLL_MS)


@router.get("/executions/{execution_id}/live.json")
async def execution_live(execution_id: str, site: SiteDep) -> Response:
    """Status, step states and map counts of one execution, for its page's script."""
    model = await site.model()
    result = await model.view(execution_id)
    workflow = await model.workflow(result.workflow, result.version)
    spec_steps = list(workflow.spec["steps"]) if workflow else []
    steps = [s.to_dict() for s in await model.steps(result.id)]
    words = (await load_reasons(model, result, steps, datetime.now(UTC),
                                with_p95=False)).words
    steps = [s | {"word": words.get(s["step"])} for s in steps]
    mapped = [s["name"] for s in spec_steps if s.get("map")]
    maps = map_summaries([c.to_dict() for c in await model.map_counts(result.id, mapped)])
    dag = views.dag_layout(spec_steps, {s["step"]: s for s in steps})
    return JSONResponse(jsonable_encoder(
        live_state(result, steps, maps, {n.name: n.detail for n in dag.nodes})))


@router.get("/executions/{execution_id}/steps/{step}", response_class=HTMLResponse)
async def items(request: Request, execution_id: str, step: str, site: SiteDep,
                status: str | None = None, start: int = 0, limit: int = ITEMS_PAGE) -> Response:
    """A map step's items (or a plain step's one task), a page at a time."""
    model = await site.model()
    result = await model.view(execution_id)
    status, start, limit = status or None, max(0, start), max(1, min(limit, 1000))
    found = [t.to_dict() for t in await model.map_items(
        result.id, step, status=status, from_index=start, limit=limit + 1)]
    if not found and start == 0 and status is None:
        return site.problem(request, 404, "No such step",
                            f"execution {result.id} has no tasks of a step named {step!r}")
    more, found = len(found) > limit, found[:limit]
    summary = map_summaries([c.to_dict() for c in await model.map_counts(result.id, [step])]
                            ).get(step)
    keep = {"status": status, "limit": limit if limit != ITEMS_PAGE else None}
    return site.page(request, "items.html", r=result, step=step, tasks=found, summary=summary,
                     status=status, statuses=MAP_STATUSES,
                     next_page=query_string(**keep, start=int(found[-1]["map_index"]) + 1)
                     if more else None,
                     first_page=query_string(**keep) if start else None)


@router.get("/dead-letters", response_class=HTMLResponse)
async def dead_letters(request: Request, site: SiteDep, limit: int = 100,
                       cursor: str | None = None) -> Response:
    model = await site.model()
    limit = max(1, min(limit, 1000))
    try:
        before_at, before_id = page_key(cursor, int, "a task")
    except BadCursor as exc:
        return bad_cursor(site, request, exc)
    rows = await model.dead_letter_page(
        before=None if before_at is None or before_id is None else (before_at, before_id),
        limit=limit + 1)
    more, rows = len(rows) > limit, rows[:limit]
    seen: set[UUID] = set()
    letters = []
    for r in rows:
        letters.append(r.to_dict() | {"first": r.execution_id not in seen})
        seen.add(r.execution_id)
    keep = {"limit": limit if limit != 100 else None}
    last = rows[-1] if rows else None
    return site.page(request, "dead_letters.html", letters=letters,
                     next_page=query_string(**keep, cursor=encode_cursor(
                         last.finished_at, last.id)) if more and last and last.finished_at
                     else None,
                     first_page=query_string(**keep) if cursor else None)

