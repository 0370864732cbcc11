"""Errors as ``application/problem+json`` (RFC 9457) for the API, error pages for the pages.

Every refusal names the thing at fault: ``field`` (and ``errors``, one per fault) for a bad body
or query, ``detail`` always. Nothing here ever carries a database URL's password: details are
passed through :func:`scrub` first.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Scope

from konduit.masking import mask_password
from konduit.web.templating import env

PROBLEM_JSON = "application/problem+json"

TITLES = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
          405: "Method not allowed", 409: "Conflict", 413: "Too large", 429: "Too many requests",
          422: "Invalid request", 500: "Internal error", 503: "Service unavailable"}

def scrub(text: str) -> str:
    """``text`` with any database URL's or connection string's password masked."""
    return mask_password(text)


class FieldError(BaseModel):
    """One fault of a request: where (``body.workflow``, ``query.limit``...) and what."""

    field: str
    message: str


class Problem(BaseModel):
    """An error (RFC 9457 problem details)."""

    type: str = Field(description="A URN naming the kind of problem")
    title: str
    status: int
    detail: str
    field: str | None = Field(None, description="The request field at fault, when one is")
    errors: list[FieldError] | None = None
    step: str | None = Field(None, description="The workflow step at fault, when one is "
                             "(a refused migration)")
    code: str | None = Field(None, description="The kind of error, when konduit refused it "
                             "(KonduitError.code: workflow_not_found, input_validation_error, "
                             "idempotency_conflict, key_needs_code, ...)")


def slug(status: int) -> str:
    return TITLES.get(status, "error").lower().replace(" ", "-")


def problem(status: int, detail: str, *, title: str | None = None, field: str | None = None,
            errors: list[FieldError] | None = None, headers: dict[str, str] | None = None,
            step: str | None = None, code: str | None = None) -> JSONResponse:
    """A problem+json response."""
    body = Problem(type=f"urn:konduit:problem:{slug(status)}", title=title or TITLES.get(status, "Error"),
                   status=status, detail=scrub(detail), field=field, errors=errors, step=step,
                   code=code)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status,
                        media_type=PROBLEM_JSON, headers=headers)


def unauthorized(detail: str) -> Response:
    return problem(401, detail, headers={"WWW-Authenticate": 'Bearer realm="konduit"'})


def forbidden(detail: str) -> Response:
    return problem(403, detail)


def field_errors(exc: RequestValidationError) -> list[FieldError]:
    """Pydantic's errors as ``where: what`` pairs (``body.requests.0.workflow``)."""
    out = []
    for error in exc.errors():
        loc = [str(p) for p in error.get("loc", ())]
        out.append(FieldError(field=".".join(loc) or "body", message=str(error.get("msg", "invalid"))))
    return out


def validation_problem(exc: RequestValidationError) -> JSONResponse:
    errors = field_errors(exc)
    first = errors[0] if errors else FieldError(field="body", message="invalid")
    return problem(422, f"{first.field}: {first.message}", field=first.field, errors=errors)


def too_many(detail: str, *, retry_after: int) -> Response:
    """429 with ``Retry-After``: the client must wait before it tries again."""
    return problem(429, detail, headers={"Retry-After": str(retry_after)})


def page_refusal(status: int, message: str) -> ASGIApp:
    """An HTML error page (the dashboard's own template)."""

    html = env.get_template("error.html").render(title=TITLES.get(status, "Error"),
                                                 message=scrub(message), csrf_token="")
    return HTMLResponse(html, status_code=status)


def to_login(scope: Scope) -> ASGIApp:
    """Send a browser without a session to the login form, back here afterwards."""
    target = scope["path"] + ("?" + scope["query_string"].decode("latin-1")
                              if scope.get("query_string") else "")
    return RedirectResponse("/login?next=" + quote(target, safe=""), status_code=303)


def wants_problem(request: Request) -> bool:
    """Whether a request gets problem+json (the API) rather than an error page."""
    path = request.url.path
    return path.startswith("/api/") or path.endswith(".json")


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route that may answer these problems, for the OpenAPI."""
    return {s: {"model": Problem, "description": TITLES.get(s, "Error"),
                "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
            for s in statuses}
