"""What the dashboard's route modules share, as FastAPI dependencies: the :class:`Site` that
:func:`konduit.web.app.create_app` keeps in ``app.state`` (the client and its read model, the
operations of the doors, the page and problem renderers, the App whose code Repair re-runs).

Each route module has a module-level ``APIRouter``; a route takes ``site: SiteDep`` (or
``ops: Ops``) and reads everything else from it, so no route is a closure over the app."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, Response

from konduit.app import App
from konduit.reads import ReadModel
from konduit.web import problems
from konduit.web.clients import Clients, ServerOperations
from konduit.web.reads import footer_line
from konduit.web.templating import templates


class Site:
    """The dashboard's server: its clients, its operations and how it answers."""

    def __init__(self, clients: Clients, app: App | None):
        self.clients = clients
        self.app = app  # None: read-only, Repair disabled
        self.ops = ServerOperations(clients, app)

    async def model(self) -> ReadModel:
        """What the pages and the API show, read on the client's connections."""
        return await self.clients.model()

    def page(self, request: Request, name: str, status_code: int = 200,
             **context: Any) -> HTMLResponse:
        """The template ``name`` rendered with the dashboard's common context."""
        context.setdefault("flash", request.query_params.get("flash"))
        context.setdefault("reads", footer_line(self.clients.reads()))
        context.setdefault("error", request.query_params.get("error"))
        session = request.scope.get("state", {}).get("session")
        return templates.TemplateResponse(request, name, {
            "repair_enabled": self.app is not None,
            "csrf_token": session.csrf if session else "",
            "logged_in": session is not None, **context}, status_code=status_code)

    def problem(self, request: Request, status_code: int, title: str, message: str, *,
                code: str | None = None) -> Response:
        """An error: problem+json for the API and the JSON the pages poll, else a page."""
        if problems.wants_problem(request):
            return problems.problem(status_code, message, title=title, code=code)
        return self.page(request, "error.html", status_code, title=title,
                         message=problems.scrub(message))

    def forbidden(self, request: Request, what: str) -> Response:
        """A POST that did not come from the dashboard's own page."""
        return self.problem(request, 403, "Forbidden",
                            f"a {what} must come from the dashboard's own page")


def site_of(request: Request) -> Site:
    """The :class:`Site` of the app serving ``request``."""
    site: Site = request.app.state.site
    return site


def operations_of(request: Request) -> ServerOperations:
    """The operations of the app serving ``request`` (nothing connected yet)."""
    return site_of(request).ops


SiteDep = Annotated[Site, Depends(site_of)]
Ops = Annotated[ServerOperations, Depends(operations_of)]


async def form_fields(request: Request) -> dict[str, str]:
    """The fields of a posted urlencoded form (first value of each); no multipart needed."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


def same_origin(request: Request) -> bool:
    """Whether a POST came from the dashboard's own pages (when the browser says where from)."""
    origin = request.headers.get("origin")
    return not origin or urlsplit(origin).netloc == request.headers.get("host")
