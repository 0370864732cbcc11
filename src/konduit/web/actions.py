"""Cancel, Repair, Redrive and Fork from the dashboard, one execution or many (Fork: one), each
confirm-then-POST:
the button on a page leads (GET, no side effect) to a confirmation page that says what will
happen (for many: how many executions it will touch), whose form POSTs the action with
``confirm=yes`` and the CSRF token. A POST without ``confirm=yes`` changes nothing and shows the
confirmation page instead, so no single click or forged request acts.
"""

from __future__ import annotations

import json
from typing import Annotated
from urllib.parse import parse_qs, quote, urlencode
from uuid import UUID

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from konduit.core.search import ExecutionFilter, search_filter
from konduit.core.words import NOT_REACHED, step_word
from konduit.engine.bulk import CANCEL_FROM
from konduit.engine.repairs import REDRIVE_FROM
from konduit.errors import DatabaseError, DatabaseUnavailable, ExecutionNotFound, KonduitError
from konduit.web import views
from konduit.web.site import SiteDep, form_fields, same_origin
from konduit.web.summaries import rerun_steps

REPAIRABLE_STATUSES = ("succeeded", "failed", "timed_out")
REDRIVABLE_STATUSES = tuple(REDRIVE_FROM)
MAX_PICKED = 500
"""The most executions a page's multi-select may name (a page of the list holds at most 500)."""
BULK_BATCH = 100
"""Executions per transaction of a bulk action started from a page."""


def back_to(execution_id: object, **message: str) -> RedirectResponse:
    query = "?" + urlencode(message) if message else ""
    return RedirectResponse(f"/executions/{quote(str(execution_id), safe='')}{query}", status_code=303)


router = APIRouter()


@router.get("/executions/{execution_id}/cancel", response_class=HTMLResponse)
async def confirm_cancel(request: Request, execution_id: str, site: SiteDep) -> Response:
    result = await site.ops.status(execution_id)
    running = result.status in ("running", "scheduled")  # scheduled: before its time
    return site.page(
        request, "confirm.html", r=result, action="cancel", verb="Cancel execution",
        question=f"Cancel execution {result.id} of {result.workflow} v{result.version}?",
        consequences=["Its ready tasks will never be claimed; running handlers lose their lease "
                      "and are asked to stop (ctx.cancelled).",
                      "Nothing downstream runs. This cannot be undone."],
        steps=[], allowed=running,
        refusal=None if running else f"It is {result.status}: only a running or scheduled "
        "execution can be cancelled.")


@router.post("/executions/{execution_id}/cancel")
async def cancel(request: Request, execution_id: str, site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "cancel")
    result = await site.ops.status(execution_id)
    if (await form_fields(request)).get("confirm") != "yes":
        return RedirectResponse(f"/executions/{result.id}/cancel", status_code=303)
    try:
        done = await site.ops.cancel(result.id, reason="cancelled from the dashboard")
    except (ExecutionNotFound, DatabaseUnavailable):
        raise
    except KonduitError as exc:  # a read-only replica, say: said on the page, not a 500
        return back_to(result.id, error=f"not cancelled: {exc}")
    if done:
        return back_to(result.id, flash="cancelled: no further step of it will run")
    now = await site.ops.status(result.id)
    return back_to(result.id, error=f"not cancelled: it had already ended ({now.status})")


@router.get("/executions/{execution_id}/repair", response_class=HTMLResponse)
async def confirm_repair(request: Request, execution_id: str, site: SiteDep) -> Response:
    result = await site.ops.status(execution_id)
    model = await site.model()
    steps = await model.steps(result.id)
    workflow = await model.workflow(result.workflow, result.version)
    statuses = {s.step: s.status for s in steps}
    rerun = rerun_steps(list(workflow.spec["steps"]) if workflow else [], statuses)
    refusal = None
    if site.app is None:
        refusal = "Repair re-runs workflow code: start the dashboard with --app MODULE:ATTR."
    elif result.status not in REPAIRABLE_STATUSES:
        refusal = f"It is {result.status}: only a finished, not cancelled, execution can be repaired."
    elif not rerun:
        refusal = "Nothing to repair: no step ended degraded, failed, timed out or cancelled."
    return site.page(
        request, "confirm.html", r=result, action="repair", verb="Repair execution",
        question=f"Repair execution {result.id} of {result.workflow} v{result.version}?",
        consequences=["These steps run again, as a new generation of their tasks (their "
                      "handlers are called again):",
                      "When it finishes, its output becomes a new version; the earlier "
                      "versions stay visible."],
        steps=[(s, step_word(statuses.get(s, NOT_REACHED)), statuses.get(s) in views.REPAIRABLE)
               for s in rerun],
        allowed=refusal is None, refusal=refusal)


@router.post("/executions/{execution_id}/repair")
async def repair(request: Request, execution_id: str, site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "repair")
    if site.app is None:
        message = "repair re-runs workflow code: start the dashboard with --app MODULE:ATTR"
        return back_to(execution_id, error=message)
    if (await form_fields(request)).get("confirm") != "yes":
        return RedirectResponse(f"/executions/{execution_id}/repair", status_code=303)
    execution_id = str(await (await site.clients.get()).resolve(execution_id))
    try:
        rerun = await site.ops.repair(execution_id)  # with the App's code
    except (ExecutionNotFound, DatabaseUnavailable):
        raise
    except KonduitError as exc:  # nothing to repair, still running, unknown workflow...
        return back_to(execution_id, error=str(exc))
    return back_to(execution_id, flash=f"repair started: re-running {', '.join(rerun)}")


@router.get("/executions/{execution_id}/redrive", response_class=HTMLResponse)
async def confirm_redrive(request: Request, execution_id: str, site: SiteDep) -> Response:
    result = await site.ops.status(execution_id)
    model = await site.model()
    steps = await model.steps(result.id)
    workflow = await model.workflow(result.workflow, result.version)
    statuses = {s.step: s.status for s in steps}
    rerun = rerun_steps(list(workflow.spec["steps"]) if workflow else [], statuses, redrive=True)
    refusal = None
    if result.status not in REDRIVABLE_STATUSES:
        refusal = (f"It is {result.status}: only a failed, timed-out or cancelled execution "
                   "can be redriven" + (" (Repair re-runs the degraded steps of a succeeded one)."
                                        if result.status == "succeeded" else "."))
    elif not rerun:
        refusal = "Nothing to redrive: no step ended failed, timed out or cancelled."
    return site.page(
        request, "confirm.html", r=result, action="redrive", verb="Redrive execution",
        question=f"Redrive execution {result.id} of {result.workflow} v{result.version}?",
        consequences=["These steps run again, as a new generation of their tasks (their "
                      "handlers are called again):",
                      "Every succeeded and degraded step keeps its output; nothing of it "
                      "runs again."],
        steps=[(s, step_word(statuses.get(s, NOT_REACHED)), statuses.get(s) in views.REDRIVABLE)
               for s in rerun],
        allowed=refusal is None, refusal=refusal)


@router.post("/executions/{execution_id}/redrive")
async def redrive(request: Request, execution_id: str, site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "redrive")
    if (await form_fields(request)).get("confirm") != "yes":
        return RedirectResponse(f"/executions/{quote(execution_id, safe='')}/redrive",
                                status_code=303)
    execution_id = str(await (await site.clients.get()).resolve(execution_id))
    try:
        rerun = await site.ops.redrive(execution_id)
    except (ExecutionNotFound, DatabaseError):
        raise
    except KonduitError as exc:  # running or succeeded, nothing to re-run, no definition...
        return back_to(execution_id, error=str(exc))
    return back_to(execution_id, flash=f"redrive started: re-running {', '.join(rerun)}")


async def _fork_form(request: Request, site: SiteDep, execution_id: str, *,
                     chosen: str | None = None, input_text: str | None = None,
                     fork_error: str | None = None, status_code: int = 200) -> Response:
    """The fork's form: the origin's steps to pick from, its input (as JSON) to edit."""
    result = await site.ops.status(execution_id)
    model = await site.model()
    workflow = await model.workflow(result.workflow, result.version)
    names = [s["name"] for s in workflow.spec["steps"]] if workflow else []
    if input_text is None:
        row = (await model.execution(result.id)).to_dict()
        input_text = json.dumps(row["input"], indent=2, ensure_ascii=False)
    return site.page(request, "fork.html", status_code=status_code, r=result, step_names=names,
                     chosen=chosen, input_text=input_text, fork_error=fork_error)


@router.get("/executions/{execution_id}/fork", response_class=HTMLResponse)
async def confirm_fork(request: Request, execution_id: str, site: SiteDep) -> Response:
    return await _fork_form(request, site, execution_id)


@router.post("/executions/{execution_id}/fork")
async def fork(request: Request, execution_id: str, site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "fork")
    fields = await form_fields(request)
    if fields.get("confirm") != "yes":
        return RedirectResponse(f"/executions/{quote(execution_id, safe='')}/fork",
                                status_code=303)
    execution_id = str(await (await site.clients.get()).resolve(execution_id))
    from_step, text = fields.get("from_step", ""), fields.get("input", "")
    try:
        new_input = json.loads(text) if text.strip() else None
    except ValueError as exc:
        return await _fork_form(request, site, execution_id, chosen=from_step, input_text=text,
                                fork_error=f"input: not JSON ({exc})", status_code=422)
    try:
        forked = await site.ops.fork(execution_id, from_step=from_step, input=new_input)
    except (ExecutionNotFound, DatabaseError):
        raise
    except KonduitError as exc:  # an upstream that did not succeed, an input refused...
        return await _fork_form(request, site, execution_id, chosen=from_step, input_text=text,
                                fork_error=str(exc), status_code=422)
    return back_to(forked.id, flash=f"forked from {execution_id} at step {from_step}")


# -- many at once: the executions list's multi-select -----------------------------------------

BULK_WORDS = {"cancel": ("Cancel", "cancelled"), "redrive": ("Redrive", "redriven")}


def _picked(values: list[str]) -> list[UUID] | str:
    """The executions a multi-select names, or why it cannot be used."""
    if len(values) > MAX_PICKED:
        return f"at most {MAX_PICKED} executions can be selected at once (use the search's)"
    try:
        return sorted({UUID(v) for v in values})
    except ValueError:
        return "a selected execution is not an execution id"


def _filter_of(fields: dict[str, list[str]]) -> ExecutionFilter:
    """The search a bulk form carries (the list's own field names); raises naming the field."""
    one = {k: (v[0] if v else None) or None for k, v in fields.items()}
    return search_filter(id=one.get("id"), key=one.get("key"), tags=fields.get("tag"),
                         inputs=fields.get("input"), status=one.get("status"),
                         workflow=one.get("workflow"), since=one.get("since"),
                         until=one.get("until"), fair_key=one.get("fair_key"))


def _described(where: ExecutionFilter) -> str:
    return ", ".join(f"{k}={v}" for k, v in where.query_args())


@router.get("/bulk", response_class=HTMLResponse)
async def confirm_bulk(request: Request, site: SiteDep,
                       action: str = "", scope: str = "picked",
                       pick: Annotated[list[str] | None, Query()] = None) -> Response:
    """The confirmation of a bulk action: how many executions it will touch, before anything
    is done (the selected ones by their status; a whole search by a dry run)."""
    if action not in BULK_WORDS:
        return site.problem(request, 400, "Bad request", "action: cancel or redrive")
    verb, _ = BULK_WORDS[action]
    applies = CANCEL_FROM if action == "cancel" else REDRIVE_FROM
    refusal, count, matched, skipped, described = None, 0, 0, {}, ""
    picked: list[UUID] = []
    where: ExecutionFilter | None = None
    if scope == "all":
        try:
            where = _filter_of(parse_qs(request.url.query, keep_blank_values=True))
            dry = await site.ops.bulk(action, where, dry_run=True, batch_size=1000)
        except DatabaseError:
            raise
        except KonduitError as exc:  # a bad search, or none at all
            refusal = str(exc)
        else:
            count, matched, skipped, described = dry.done, dry.matched, dry.skipped, \
                _described(where)
    else:
        chosen = _picked(pick or [])
        if isinstance(chosen, str):
            refusal = chosen
        elif not chosen:
            refusal = "No execution is selected: tick the ones to act on, or choose every " \
                "execution the search finds."
        else:
            picked = chosen
            statuses = await site.ops.progress(picked)
            matched = len(picked)
            for eid in picked:
                status = statuses.get(eid, "gone")
                if status in applies:
                    count += 1
                else:
                    skipped[status] = skipped.get(status, 0) + 1
    if refusal is None and count == 0:
        refusal = f"None of the {matched} execution(s) can be {BULK_WORDS[action][1]}."
    return site.page(
        request, "bulk_confirm.html", action=action, verb=verb, scope=scope, count=count,
        matched=matched, skipped=skipped, described=described, picked=picked,
        where_args=[] if where is None else where.query_args(), refusal=refusal,
        batch=BULK_BATCH)


@router.post("/bulk")
async def bulk(request: Request, site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "bulk action")
    body = (await request.body()).decode("utf-8", "replace")
    fields = parse_qs(body, keep_blank_values=True)
    action = (fields.pop("action", [""]) or [""])[0]
    scope = (fields.pop("scope", ["picked"]) or ["picked"])[0]
    picks = fields.pop("pick", [])
    confirmed = (fields.pop("confirm", [""]) or [""])[0] == "yes"
    fields.pop("csrf_token", None)
    if action not in BULK_WORDS:
        return site.problem(request, 400, "Bad request", "action: cancel or redrive")
    _, did = BULK_WORDS[action]
    if not confirmed:
        query = urlencode([("action", action), ("scope", scope), *(("pick", p) for p in picks),
                           *((k, v) for k, vs in fields.items() for v in vs)])
        return RedirectResponse(f"/bulk?{query}", status_code=303)
    if scope == "all":
        try:
            where = _filter_of(fields)
            result = await site.ops.bulk(action, where, batch_size=BULK_BATCH,
                                         reason=f"{did} from the dashboard")
        except DatabaseError:
            raise
        except KonduitError as exc:
            return RedirectResponse("/?" + urlencode({"error": f"nothing {did}: {exc}"}),
                                    status_code=303)
        done, matched, skipped = result.done, result.matched, result.skipped
        back = where.query_args()
        timing = (f" in {result.batches} batch(es) of at most {BULK_BATCH}, {result.seconds:.1f} s;"
                  f" longest batch {result.longest_batch_seconds * 1000:.0f} ms")
    else:
        chosen = _picked(picks)
        if isinstance(chosen, str):
            return RedirectResponse("/?" + urlencode({"error": chosen}), status_code=303)
        done, matched, skipped, back, timing = 0, len(chosen), {}, [], ""
        for eid in chosen:  # each on its own: a page's selection is small
            try:
                if action == "cancel":
                    acted = await site.ops.cancel(eid, reason=f"{did} from the dashboard")
                    reason = "not_running"
                else:
                    acted = bool(await site.ops.redrive(eid))
                    reason = ""
            except DatabaseError:
                raise
            except KonduitError as exc:
                acted, reason = False, exc.code
            if acted:
                done += 1
            else:
                skipped[reason] = skipped.get(reason, 0) + 1
    note = f"{did} {done} of {matched} execution(s){timing}"
    if skipped:
        note += "; skipped " + ", ".join(f"{n} ({why})" for why, n in sorted(skipped.items()))
    return RedirectResponse("/?" + urlencode([*back, ("flash", note)]), status_code=303)
