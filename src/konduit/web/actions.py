"""Cancel and Repair from the dashboard, each confirm-then-POST: the button on a page leads (GET,
no side effect) to a confirmation page that says what will happen, whose form POSTs the action
with ``confirm=yes`` and the CSRF token. A POST without ``confirm=yes`` changes nothing and
shows the confirmation page instead, so no single click or forged request acts.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from konduit.core.words import NOT_REACHED, step_word
from konduit.errors import DatabaseUnavailable, ExecutionNotFound, KonduitError
from konduit.web import views
from konduit.web.site import SiteDep, form_fields, same_origin
from konduit.web.summaries import rerun_steps

REPAIRABLE_STATUSES = ("succeeded", "failed", "timed_out")


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
