"""Waits for people on the dashboard (docs/people-in-the-loop.md): the inbox of every
``wait_for_input`` step waiting for an answer, and the answer form each one links to, rendered
from the step's JSON Schema with :mod:`konduit.web.forms`.

An answer is a POST from the dashboard's own page: the security middleware checks its CSRF
token and refuses a read-only session; the handler checks the origin, as every action does. It
runs the operation every door runs (:meth:`konduit.App.answer`), recording who answered as the
middleware knows them (:func:`konduit.web.security.who_acts`: the label of the token that
opened the session). A bad value is shown again with each field at fault named and what was
typed kept; a step that waits for no answer any more is said on the page, never a 500.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from konduit.errors import (
    DatabaseUnavailable,
    ExecutionNotFound,
    InputValidationError,
    KonduitError,
    NotAnswerable,
)
from konduit.records import OpenInput
from konduit.web.actions import back_to
from konduit.web.forms import FormField, fields_of, initial_texts, value_of
from konduit.web.operate import parse_payload
from konduit.web.security import who_acts
from konduit.web.site import Site, SiteDep, form_fields, same_origin

router = APIRouter()


@router.get("/inbox", response_class=HTMLResponse)
async def inbox(request: Request, site: SiteDep) -> Response:
    waiting = await site.ops.inbox(limit=500)
    return site.page(request, "inbox.html", waiting=waiting, who=who_acts(request.scope))


def answer_page(site: Site, request: Request, open_input: OpenInput, status_code: int = 200,
                *, texts: dict[str, str] | None = None, raw: str = "",
                problem: str | None = None,
                errors: dict[str, str] | None = None) -> HTMLResponse:
    """The answer form of a waiting step, with what was typed (``texts``, ``raw``)."""
    fields = fields_of(open_input.schema)
    if texts is None and fields:
        texts = initial_texts(fields)
    return site.page(request, "answer.html", status_code, w=open_input, fields=fields,
                     texts=texts or {}, raw=raw, problem=problem, errors=errors or {},
                     who=who_acts(request.scope))


async def waiting_input(site: Site, execution_id: str, step: str) -> OpenInput | None:
    return next((i for i in await site.ops.inbox(execution_id=execution_id, limit=1000)
                 if i.step == step), None)


def not_waiting(site: Site, request: Request, execution_id: str, step: str) -> Response:
    return site.page(request, "answer.html", 409, w=None, step=step, execution_id=execution_id,
                     fields=None, texts={}, raw="", errors={}, who=who_acts(request.scope),
                     problem=f"step {step!r} of execution {execution_id} waits for no answer "
                             "now: answered already, not reached yet, past its deadline, or "
                             "its execution ended")


@router.get("/executions/{execution_id}/steps/{step}/answer", response_class=HTMLResponse)
async def answer_form(request: Request, execution_id: str, step: str,
                      site: SiteDep) -> Response:
    found = await waiting_input(site, execution_id, step)
    if found is None:
        return not_waiting(site, request, execution_id, step)
    return answer_page(site, request, found)


def named_fields(exc: InputValidationError, fields: list[FormField] | None) -> dict[str, str]:
    """The form's fields an answer's refusal names (a nested fault on its top-level field)."""
    named: dict[str, str] = {}
    known = {f.name for f in fields or ()}
    for path, message in exc.errors.items():
        top, _, rest = path.partition(".")
        key = f"in.{top}" if top in known else "value"
        named.setdefault(key, f"{rest}: {message}" if rest and key != "value" else
                         (message if key != "value" else f"{path}: {message}"))
    return named


@router.post("/executions/{execution_id}/steps/{step}/answer", response_class=HTMLResponse)
async def answer(request: Request, execution_id: str, step: str, site: SiteDep) -> Response:
    if not same_origin(request):
        return site.forbidden(request, "answer")
    found = await waiting_input(site, execution_id, step)
    if found is None:
        return not_waiting(site, request, execution_id, step)
    posted = await form_fields(request)
    fields = fields_of(found.schema)
    texts = {k[3:]: v for k, v in posted.items() if k.startswith("in.")}
    raw = posted.get("value", "")

    def again(problem: str, errors: dict[str, str], status_code: int = 422) -> HTMLResponse:
        return answer_page(site, request, found, status_code, texts=texts, raw=raw,
                           problem=problem, errors=errors)

    value: Any
    if fields:
        value, faults = value_of(fields, texts)
        if faults:
            errors = {f"in.{name}": message for name, message in faults.items()}
            return again("not answered: " + "; ".join(
                f"{name}: {message}" for name, message in faults.items()), errors)
    else:
        try:
            value = parse_payload(raw, "value")
        except ValueError as exc:
            return again(str(exc), {"value": str(exc)})
    try:
        done = await site.ops.answer(found.execution_id, step, value,
                                     answered_by=who_acts(request.scope))
    except (ExecutionNotFound, DatabaseUnavailable):
        raise
    except InputValidationError as exc:
        return again(f"not answered: {exc}", named_fields(exc, fields))
    except NotAnswerable as exc:
        return again(str(exc), {}, 409)
    except KonduitError as exc:  # a value too large to store, text PostgreSQL cannot hold
        return again(str(exc), {"value": str(exc)})
    return back_to(done.execution_id, flash=f"answered {step} as {done.answered_by}")
