"""``konduit dashboard``: executions, the DAG with live step states, a Gantt timeline that makes
the latency composition visible, dead letters with repair, workers, alerts, the stats and
``/metrics`` (docs/dashboard.md).

This module builds the app and its error pages; the routes live in :mod:`konduit.web.pages`
(executions, one execution, map items, dead letters), :mod:`konduit.web.actions` (cancel and
repair, confirm-then-POST) and :mod:`konduit.web.ops` (workers, the queue strip).

Server-rendered (FastAPI + Jinja2, no JavaScript framework, nothing fetched from elsewhere; one
small static script, ``static/live.js``, updates status cells in place without inline script). Every
page reads the database through one :class:`~konduit.engine.client.Client` (what it shows through
the :class:`~konduit.reads.ReadModel` on its connections), created on first use in the
server's event loop and dropped when the database fails, so a page answers 503 while it is down
and works again once it is back. Repair re-runs workflow code, so it is offered only when the
dashboard knows the workflows (``--app``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from importlib import resources

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from konduit.app import App
from konduit.engine.client import Client
from konduit.errors import (
    AmbiguousExecutionId,
    DashboardError,
    DatabaseError,
    DatabaseUnavailable,
    ExecutionInHistory,
    ExecutionNotFound,
    KonduitError,
    SchemaOutdated,
)
from konduit.web import actions, operate, ops, pages, people, problems, wiring
from konduit.web.clients import ClientFactory as ClientFactory
from konduit.web.clients import Clients as Clients
from konduit.web.detail import Detail as Detail
from konduit.web.reads import ReadSourceHeaders
from konduit.web.security import Security, Token, check_bind
from konduit.web.site import Site
from konduit.web.templating import env as env
from konduit.web.templating import templates as templates


def database_client(database_url: str | None = None, app: App | None = None, *,
                    read_database_url: str | None = None,
                    read_max_lag: float | None = None) -> ClientFactory:
    """Make a fresh client (with ``app``'s workflows, for repair) on each call, in the caller's
    event loop; the URL is ``database_url``, else ``app``'s, else the usual fallbacks. The
    pages' and the API's reads go to ``read_database_url`` (else ``app``'s, else
    ``KONDUIT_READ_DATABASE_URL``) within ``read_max_lag`` (docs/read-replicas.md)."""

    async def make() -> Client:
        url = database_url
        if url is None and app is not None:
            url = await asyncio.to_thread(lambda: app.database_url)
        read_url = read_database_url or (app.read_database_url if app is not None else None)
        lag = read_max_lag if read_max_lag is not None or app is None else app.read_max_lag
        fresh = App([], database_url=url, read_database_url=read_url, read_max_lag=lag)
        if app is not None:
            fresh.registry = app.registry
            fresh.payload_io = app.payload_io  # the App's codec: its payloads shown decoded
            fresh.max_payload_bytes = app.max_payload_bytes
        return await fresh.client_async()  # a down server answers now (open_database)

    return make


def create_app(client_factory: ClientFactory, app: App | None = None, *,
               security: Security | None = None) -> FastAPI:
    """The dashboard as an ASGI app. ``client_factory`` makes the client the pages read with
    (see :func:`database_client`); ``app`` supplies the workflow code that Repair and the API's
    starts run; ``security`` holds the tokens (none: open, for a loopback address only)."""
    clients = Clients(client_factory)
    site = Site(clients, app)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await clients.close()

    web = FastAPI(title="konduit", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    web.state.site = site  # what the routes' dependencies read (konduit.web.site)
    # The API (/api/v1, /openapi.json), the login form, tokens, CSRF and security headers.
    wiring.install(web, site, security or Security())
    web.add_middleware(ReadSourceHeaders, reads=clients.reads)  # X-Konduit-Read-From
    error_handlers(web, site)
    for routes in (pages, actions, ops, operate, people):
        web.include_router(routes.router)
    web.mount("/static", StaticFiles(directory=str(resources.files("konduit.web") / "static")),
              name="static")
    return web


def error_handlers(web: FastAPI, site: Site) -> None:
    """How the dashboard answers what goes wrong: a page, or problem+json for the API."""

    @web.exception_handler(ExecutionNotFound)
    async def not_found(request: Request, exc: ExecutionNotFound) -> Response:
        return site.problem(request, 404, "No such execution", str(exc), code=exc.code)

    @web.exception_handler(ExecutionInHistory)
    async def in_history(request: Request, exc: ExecutionInHistory) -> Response:
        # It exists and reads as before: a write to it conflicts with where it is.
        return site.problem(request, 409, "Execution in the history", str(exc), code=exc.code)

    @web.exception_handler(AmbiguousExecutionId)
    async def ambiguous(request: Request, exc: AmbiguousExecutionId) -> Response:
        return site.problem(request, 409, "Ambiguous execution id", str(exc), code=exc.code)

    @web.exception_handler(KonduitError)
    async def failed(request: Request, exc: KonduitError) -> Response:
        if isinstance(exc, DatabaseUnavailable | SchemaOutdated):
            await site.clients.drop()  # a fresh connection next time
            return site.problem(request, 503, "The database is unavailable",
                                f"{exc} — the dashboard retries on the next request.")
        if isinstance(exc, DatabaseError):  # a conflict that outlasted its retries, a full pool
            return site.problem(request, 503, "The database could not answer",
                                f"{exc} — try again.")
        if problems.wants_problem(request):  # what a caller sent (the API's own are Refused)
            return problems.problem(422, str(exc), code=exc.code)
        return site.problem(request, 500, "Konduit error", str(exc))

    @web.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return site.problem(request, exc.status_code,
                            problems.TITLES.get(exc.status_code, "Error"),
                            f"{exc.detail}: {request.url.path}")


def server_config(web: ASGIApp, *, trusted_proxies: Sequence[str] = ()) -> uvicorn.Config:
    """How the dashboard's server runs ``web``. A client's own ``X-Forwarded-For`` is believed
    only from ``trusted_proxies`` (addresses or networks; none by default): the login and token
    throttles count wrong tokens per client address, and an address a client may choose for
    itself would let it rotate around them. (uvicorn alone trusts the header from any local
    process.)"""
    return uvicorn.Config(web, log_level="warning", lifespan="on", server_header=False,
                          proxy_headers=bool(trusted_proxies),
                          forwarded_allow_ips=list(trusted_proxies) or None)


def serve(database_url: str | None = None, app: App | None = None, *, host: str = "127.0.0.1",
          port: int = 8090, announce: Callable[[str], None] = print,
          tokens: tuple[Token, ...] = (), trusted_proxies: Sequence[str] = (),
          read_database_url: str | None = None, read_max_lag: float | None = None) -> None:
    """Serve the dashboard on ``host:port`` until SIGINT/SIGTERM (port 0: any free one).

    ``tokens`` (see :mod:`konduit.web.security`) are required on the API and for the pages;
    without any, only a loopback ``host`` is allowed. ``trusted_proxies``: the reverse proxies
    whose ``X-Forwarded-For`` names the client (:func:`server_config`)."""
    check_bind(host, tokens)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise DashboardError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    announce(f"http://{f'[{host}]' if family == socket.AF_INET6 else host}:{bound}/")
    factory = database_client(database_url, app, read_database_url=read_database_url,
                              read_max_lag=read_max_lag)
    config = server_config(create_app(factory, app, security=Security(tokens)),
                           trusted_proxies=trusted_proxies)
    uvicorn.Server(config).run(sockets=[sock])
