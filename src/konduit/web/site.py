"""What the dashboard's route modules share: the client and its read model, the page and problem renderers of
:func:`konduit.web.app.create_app`, and the App whose code Repair re-runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from konduit.app import App
from konduit.engine.client import Client
from konduit.reads import ReadModel


class ClientSource(Protocol):
    async def get(self) -> Client: ...

    async def model(self) -> ReadModel: ...


@dataclass(frozen=True)
class Site:
    """Handed to each module's ``register(web, site)``."""

    clients: ClientSource
    page: Callable[..., HTMLResponse]  # page(request, template, status_code=200, **context)
    problem: Callable[[Request, int, str, str], Response]  # problem(request, status, title, message)
    app: App | None  # None: read-only, Repair disabled


async def form_fields(request: Request) -> dict[str, str]:
    """The fields of a posted urlencoded form (first value of each); no multipart needed."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


def same_origin(request: Request) -> bool:
    """Whether a POST came from the dashboard's own pages (when the browser says where from)."""
    origin = request.headers.get("origin")
    return not origin or urlsplit(origin).netloc == request.headers.get("host")
