"""The operator's missing pages and actions: Schedules (pause/resume), a start form, "send event"
on a waiting step, "retry now" on a task in backoff, and the queue page.

Every action is a POST from the dashboard's own page: the security middleware checks its CSRF
token (and the session or token), and each handler checks the origin, as Cancel and Repair do
(:mod:`konduit.web.actions`). Each is the operation every door runs
(:class:`konduit.web.clients.ServerOperations`), and what it refuses is said on the page, never
a 500.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from konduit.errors import DatabaseUnavailable, ExecutionNotFound, KonduitError
from konduit.web.actions import back_to
from konduit.web.site import Site, SiteDep, form_fields, same_origin

NO_CODE = "starting runs workflow code: start the dashboard with --app MODULE:ATTR"


def to(path: str, **message: str) -> RedirectResponse:
    query = "?" + urlencode(message) if message else ""
    return RedirectResponse(path + query, status_code=303)


def parse_payload(text: str, what: str) -> Any:
    """JSON typed in a form (empty: null); raises ValueError naming the field and the fault."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not JSON: {exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}") from None


router = APIRouter()


# -- schedules ------------------------------------------------------------------------------


@router.get("/schedules", response_class=HTMLResponse)
async def schedules(request: Request, site: SiteDep) -> Response:
    model = await site.model()
    found = await model.schedules()
    return site.page(request, "schedules.html", schedules=found,
                     triggers=await model.triggers())


async def set_paused(site: Site, request: Request, name: str, paused: bool) -> Response:
    verb = "pause" if paused else "resume"
    if not same_origin(request):
        return site.forbidden(request, f"schedule {verb}")
    try:
        changed = await (site.ops.pause_schedule(name) if paused
                         else site.ops.resume_schedule(name))
    except DatabaseUnavailable:
        raise
    except KonduitError as exc:  # an unknown name: said on the page
        return to("/schedules", error=str(exc))
    done = "paused" if paused else "resumed"
    return to("/schedules", flash=f"{name}: {done}" if changed
              else f"{name} was {'paused' if paused else 'running'} already")


@router.post("/schedules/{name}/pause")
async def pause(request: Request, name: str, site: SiteDep) -> Response:
    return await set_paused(site, request, name, True)


@router.post("/schedules/{name}/resume")
async def resume(request: Request, name: str, site: SiteDep) -> Response:
    return await set_paused(site, request, name, False)


# -- start ----------------------------------------------------------------------------------


def start_page(site: Site, request: Request, status_code: int = 200,
               **form: Any) -> HTMLResponse:
    workflows = sorted({(s.name, s.version) for s in site.app.registry}) if site.app else []
    return site.page(request, "start.html", status_code, workflows=workflows,
                     names=sorted({n for n, _ in workflows}), form=form,
                     problem=form.get("problem"), no_code=None if site.app else NO_CODE)


@router.get("/start", response_class=HTMLResponse)
async def start_form(request: Request, site: SiteDep, workflow: str = "") -> Response:
    return start_page(site, request, workflow=workflow, version="", input="")


@router.post("/start", response_class=HTMLResponse)
async def start(request: Request, site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "start")
    fields = await form_fields(request)
    form = {k: fields.get(k, "") for k in ("workflow", "version", "input")}
    if site.app is None:
        return start_page(site, request, 503, **form, problem=NO_CODE)
    try:
        version = int(form["version"]) if form["version"].strip() else None
    except ValueError:
        return start_page(site, request, 422, **form, problem=f"version: {form['version']!r} is "
                          "not a whole number (leave it empty for the latest)")
    try:
        payload = parse_payload(form["input"], "input")
    except ValueError as exc:
        return start_page(site, request, 422, **form, problem=str(exc))
    try:
        handle = await site.ops.start(form["workflow"], payload, version=version)
    except DatabaseUnavailable:
        raise
    except KonduitError as exc:  # unknown workflow or version, input refused, too large...
        return start_page(site, request, 422, **form, problem=str(exc))
    return back_to(handle.id, flash="started")


# -- send event -----------------------------------------------------------------------------


@router.get("/executions/{execution_id}/send-event", response_class=HTMLResponse)
async def send_event_form(request: Request, execution_id: str, site: SiteDep, name: str = "",
                          key: str = "") -> Response:
    result = await site.ops.status(execution_id)
    return site.page(request, "send_event.html", r=result,
                     form={"name": name, "key": key, "payload": ""}, problem=None)


@router.post("/executions/{execution_id}/send-event", response_class=HTMLResponse)
async def send_event(request: Request, execution_id: str, site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "send-event")
    result = await site.ops.status(execution_id)
    fields = await form_fields(request)
    form = {k: fields.get(k, "") for k in ("name", "key", "payload")}

    def again(problem: str) -> HTMLResponse:
        return site.page(request, "send_event.html", 422, r=result, form=form, problem=problem)

    if not form["name"].strip():
        return again("name: the event's name is needed")
    try:
        payload = parse_payload(form["payload"], "payload")
        sent = await site.ops.send_event(form["name"], key=form["key"] or None,
                                         execution_id=result.id, payload=payload)
    except ValueError as exc:
        return again(str(exc))
    except (ExecutionNotFound, DatabaseUnavailable):
        raise
    except KonduitError as exc:  # a payload too large, a key PostgreSQL cannot store
        return again(str(exc))
    if sent == "no match":
        return again(f"no match: no step of this execution waits or may still wait for "
                     f"event {form['name']!r}" + (f" key {form['key']!r}" if form["key"] else "")
                     + "; nothing was kept")
    return back_to(result.id, flash=f"event {form['name']!r}: {sent}")


# -- retry now ------------------------------------------------------------------------------


@router.post("/executions/{execution_id}/tasks/{task_id}/retry-now")
async def retry_now(request: Request, execution_id: str, task_id: int,
                    site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "retry")
    eid = await (await site.clients.get()).resolve(execution_id)
    if (await form_fields(request)).get("confirm") != "yes":  # as Cancel and Repair
        return back_to(eid, error="not retried: use the Retry now button of the page")
    if await site.ops.retry_now(eid, task_id):
        return back_to(eid, flash="retrying now: the task is ready to be claimed")
    return back_to(eid, error="not retried: the task is no longer waiting out a backoff "
                              "(a worker claimed it, or it ended)")


# -- queues ---------------------------------------------------------------------------------


@router.get("/queues", response_class=HTMLResponse)
async def queues(request: Request, site: SiteDep) -> Response:
    loads = await (await site.model()).queue_loads()
    return site.page(request, "queues.html", loads=loads)
