"""What :func:`konduit.web.app.create_app` adds to the pages: the API (``/api/v1`` and its
OpenAPI), the login form, and the security layer (tokens, sessions, CSRF, headers), with the
error handlers that turn the API's refusals into ``application/problem+json``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response

from konduit.doctext import markdown
from konduit.web import api_v1, login, problems
from konduit.web.api_v1 import Refused
from konduit.web.security import Security, SecurityMiddleware
from konduit.web.site import Site


def install(web: FastAPI, site: Site, security: Security) -> None:
    """Add the API, the login form and the security layer to ``web``; errors are rendered
    as the dashboard does (:meth:`Site.problem`: a page, or problem+json for the API)."""
    web.openapi = lambda: describe(web)  # type: ignore[method-assign]
    web.add_middleware(SecurityMiddleware, security=security)
    web.include_router(api_v1.router)
    web.state.security = security  # what the login form's routes depend on
    web.include_router(login.router)

    @web.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> Response:
        # A bug of ours: said plainly, without the traceback (it is logged).
        return site.problem(request, 500, "Internal error",
                            "the server failed to answer this request")

    @web.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Response:
        return exc.response()

    @web.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        if problems.wants_problem(request):
            return problems.validation_problem(exc)
        return site.problem(request, 400, "Bad request", "; ".join(
            f"{e.field}: {e.message}" for e in problems.field_errors(exc)))


def describe(web: FastAPI) -> dict[str, Any]:
    """The OpenAPI of ``/api/v1`` only (the pages are not an API), with its bearer scheme."""
    if web.openapi_schema is None:
        spec = get_openapi(title="konduit API", version="1", routes=web.routes,
                           description="Start, inspect, cancel and repair executions; see docs/api.md.")
        spec["paths"] = {p: v for p, v in spec.get("paths", {}).items() if p.startswith("/api/v1/")}
        # Every refusal is problem+json (FastAPI describes its own 422 body otherwise).
        problem_content = {problems.PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
        for operations in spec["paths"].values():
            for operation in operations.values():
                for status, answer in operation.get("responses", {}).items():
                    if not status.startswith("2"):
                        answer["content"] = problem_content
                        answer["description"] = problems.TITLES.get(int(status), "Error")
        for unused in ("HTTPValidationError", "ValidationError"):
            spec["components"]["schemas"].pop(unused, None)
        spec.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "A token of --token / KONDUIT_API_TOKEN (needed when set)"}}
        spec["security"] = [{"bearer": []}]
        web.openapi_schema = as_markdown(spec)
    return web.openapi_schema


def as_markdown(node: Any) -> Any:
    """``node`` with every description in Markdown, as OpenAPI reads it (CommonMark): they are
    the endpoints' and the models' docstrings, written with reST's double backticks and roles."""
    if isinstance(node, dict):
        return {key: markdown(value) if key == "description" and isinstance(value, str)
                else as_markdown(value) for key, value in node.items()}
    if isinstance(node, list):
        return [as_markdown(value) for value in node]
    return node
