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
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from konduit.errors import (
    DatabaseUnavailable,
    ExecutionNotFound,
    InputValidationError,
    KonduitError,
)
from konduit.web.actions import back_to
from konduit.web.forms import FormField, fields_of, initial_texts, value_of
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

OPTIONS = ("idempotency_key", "tags", "run_at", "delay", "priority")
"""The start options the form offers beside the input, named as :class:`konduit.StartRequest`
names them (an error's ``field`` names the one at fault)."""


def input_fields(site: Site, workflow: str, version: str) -> tuple[str, list[FormField] | None]:
    """``name@version`` of the definition the form is for (empty when the App has no such
    workflow) and the fields of its input schema (None: raw JSON only)."""
    if site.app is None or not workflow:
        return "", None
    try:
        spec = site.app.registry.get(workflow, int(version) if version.strip() else None)
    except (KonduitError, ValueError):
        return "", None
    return f"{spec.name}@{spec.version}", fields_of(spec.input_schema)


def start_page(site: Site, request: Request, status_code: int = 200, *,
               form: dict[str, str], texts: dict[str, str] | None = None,
               mode: str | None = None, problem: str | None = None,
               errors: dict[str, str] | None = None) -> HTMLResponse:
    """The start form for ``form["workflow"]`` (default: the first), with what was typed."""
    workflows = sorted({(s.name, s.version) for s in site.app.registry}) if site.app else []
    names = sorted({n for n, _ in workflows})
    form = {"workflow": "", "version": "", "input": "", "priority": "0",
            **{k: "" for k in OPTIONS if k != "priority"}, **form}
    form["workflow"] = form["workflow"] or (names[0] if names else "")
    fields_for, fields = input_fields(site, form["workflow"], form["version"])
    if texts is None and fields:
        texts = initial_texts(fields)
    mode = mode if fields and mode in ("fields", "raw") else "fields" if fields else "raw"
    return site.page(request, "start.html", status_code, workflows=workflows, names=names,
                     form=form, fields=fields, fields_for=fields_for, texts=texts or {},
                     mode=mode, errors=errors or {}, problem=problem,
                     no_code=None if site.app else NO_CODE)


def parse_tags(text: str) -> dict[str, str] | None:
    """``key=value`` lines (blank lines skipped) as tags; raises ValueError naming the line."""
    tags: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, eq, value = line.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"line {number}: {line.strip()!r} is not key=value")
        if key.strip() in tags:
            raise ValueError(f"line {number}: tag {key.strip()!r} is given twice")
        tags[key.strip()] = value.strip()
    return tags or None


def parse_moment(text: str) -> datetime | None:
    """An ISO 8601 moment (``2030-01-02T03:04``; UTC unless it gives an offset)."""
    if not text.strip():
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a moment like 2030-01-02T03:04 "
                         "(UTC unless an offset such as +02:00 is given)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def start_options(form: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The start options typed on the form, and what is wrong with each one that is not."""
    options: dict[str, Any] = {"idempotency_key": form["idempotency_key"].strip() or None}
    errors: dict[str, str] = {}
    delay = form["delay"].strip()
    try:
        options["delay"] = float(delay) if delay else None
    except ValueError:
        options["delay"] = delay  # "10m": the engine reads it, and names it when it cannot
    for name, parse in (("tags", parse_tags), ("run_at", parse_moment)):
        try:
            options[name] = parse(form[name])
        except ValueError as exc:
            errors[name] = str(exc)
    try:
        options["priority"] = int(form["priority"]) if form["priority"].strip() else 0
    except ValueError:
        errors["priority"] = f"{form['priority']!r} is not a whole number"
    return options, errors


def refused_fields(exc: KonduitError, fields: list[FormField] | None) -> dict[str, str]:
    """The fields of the form a refused start names: each input property at fault (a nested
    fault on its top-level property), or the start option at fault."""
    named: dict[str, str] = {}
    if isinstance(exc, InputValidationError) and fields:
        known = {f.name for f in fields}
        for path, message in exc.errors.items():
            top, _, rest = path.partition(".")
            if top in known:
                named.setdefault(f"in.{top}", f"{rest}: {message}" if rest else message)
    elif exc.field in (*OPTIONS, "version"):
        named[exc.field] = str(exc)
    return named


@router.get("/start", response_class=HTMLResponse)
async def start_form(request: Request, site: SiteDep, workflow: str = "",
                     version: str = "") -> Response:
    return start_page(site, request, form={"workflow": workflow, "version": version})


@router.post("/start", response_class=HTMLResponse)
async def start(request: Request, site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "start")
    posted = await form_fields(request)
    form = {k: posted.get(k, "") for k in ("workflow", "version", "input", *OPTIONS)}
    texts = {k[3:]: v for k, v in posted.items() if k.startswith("in.")}
    mode = posted.get("mode", "")

    def again(problem: str, errors: dict[str, str] | None = None,
              fresh: bool = False) -> HTMLResponse:
        return start_page(site, request, 503 if site.app is None else 422, form=form,
                          texts=None if fresh else texts, mode=mode, problem=problem,
                          errors=errors)

    if site.app is None:
        return again(NO_CODE)
    try:
        version = int(form["version"]) if form["version"].strip() else None
    except ValueError:
        return again(f"version: {form['version']!r} is not a whole number (leave it empty for "
                     "the latest)", {"version": "not a whole number"})
    fields_for, fields = input_fields(site, form["workflow"], form["version"])
    errors: dict[str, str] = {}
    if fields and mode == "fields":
        if posted.get("fields_for") != fields_for:  # another workflow chosen (no script)
            return again(f"the fields of {fields_for} are shown now: fill them in and start "
                         "again", fresh=True)
        payload, faults = value_of(fields, texts)
        errors.update({f"in.{name}": message for name, message in faults.items()})
    else:
        try:
            payload = parse_payload(form["input"], "input")
        except ValueError as exc:
            return again(str(exc), {"input": str(exc)})
    options, faults = start_options(form)
    errors.update(faults)
    if errors:
        return again("not started: " + "; ".join(
            f"{name.removeprefix('in.')}: {message}" for name, message in errors.items()), errors)
    try:
        handle = await site.ops.start(form["workflow"], payload, version=version, **options)
    except DatabaseUnavailable:
        raise
    except KonduitError as exc:  # unknown workflow or version, input refused, too large...
        return again(str(exc), refused_fields(exc, fields if mode == "fields" else None))
    return back_to(handle.id, flash="started")


# -- send event -----------------------------------------------------------------------------


async def event_fields(site: Site, execution_id: Any, name: str,
                       key: str) -> list[FormField] | None:
    """The fields of the payload model declared for event ``name`` by the execution's step
    that may take it (else by an ``on_event`` trigger of that name): None, raw JSON only."""
    if not name.strip():
        return None
    try:
        models = await (await site.clients.get()).event_payload_models(
            name.strip(), key=key.strip() or None, execution_id=execution_id)
    except KonduitError:  # a name no event may have: the send names it
        return None
    models.sort(key=lambda row: row["step"] is None)  # the execution's own step first
    return fields_of(models[0]["schema"]) if models else None


def send_event_page(request: Request, site: Site, result: Any, status_code: int = 200, *,
                    form: dict[str, str], fields: list[FormField] | None,
                    texts: dict[str, str] | None = None, mode: str = "",
                    problem: str | None = None,
                    errors: dict[str, str] | None = None) -> HTMLResponse:
    if texts is None and fields:
        texts = initial_texts(fields)
    mode = mode if fields and mode in ("fields", "raw") else "fields" if fields else "raw"
    return site.page(request, "send_event.html", status_code, r=result, form=form,
                     fields=fields, texts=texts or {}, mode=mode, problem=problem,
                     errors=errors or {})


@router.get("/executions/{execution_id}/send-event", response_class=HTMLResponse)
async def send_event_form(request: Request, execution_id: str, site: SiteDep, name: str = "",
                          key: str = "") -> Response:
    result = await site.ops.status(execution_id)
    return send_event_page(request, site, result,
                           form={"name": name, "key": key, "payload": ""},
                           fields=await event_fields(site, result.id, name, key))


@router.post("/executions/{execution_id}/send-event", response_class=HTMLResponse)
async def send_event(request: Request, execution_id: str, site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "send-event")
    result = await site.ops.status(execution_id)
    posted = await form_fields(request)
    form = {k: posted.get(k, "") for k in ("name", "key", "payload")}
    texts = {k[3:]: v for k, v in posted.items() if k.startswith("in.")}
    fields = await event_fields(site, result.id, form["name"], form["key"])
    mode = posted.get("mode", "")

    def again(problem: str, errors: dict[str, str] | None = None) -> HTMLResponse:
        return send_event_page(request, site, result, 422, form=form, fields=fields,
                               texts=texts, mode=mode, problem=problem, errors=errors)

    if not form["name"].strip():
        return again("name: the event's name is needed")
    payload: Any
    if fields and mode == "fields":
        payload, faults = value_of(fields, texts)
        if faults:
            return again("not sent: " + "; ".join(f"{n}: {m}" for n, m in faults.items()),
                         {f"in.{n}": m for n, m in faults.items()})
    else:
        try:
            payload = parse_payload(form["payload"], "payload")
        except ValueError as exc:
            return again(str(exc), {"payload": str(exc)})
    try:
        sent = await site.ops.send_event(form["name"], key=form["key"] or None,
                                         execution_id=result.id, payload=payload)
    except (ExecutionNotFound, DatabaseUnavailable):
        raise
    except InputValidationError as exc:  # the payload model declared for the event refused it
        named = refused_fields(exc, fields if mode == "fields" else None)
        return again(f"not sent: {exc}", named or {"payload": str(exc)})
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
