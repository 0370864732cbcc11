"""The login form that turns a token into a page session (see :mod:`konduit.web.security`)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from konduit.web.security import SESSION_COOKIE, LoginThrottle, Security, session_cookie_header
from konduit.web.templating import env

__all__ = ["LoginThrottle", "router", "safe_next"]


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path of this server, never another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def security_of(request: Request) -> Security:
    """The tokens and sessions of the app serving ``request`` (kept in ``app.state``)."""
    security: Security = request.app.state.security
    return security


SecurityDep = Annotated[Security, Depends(security_of)]

router = APIRouter(include_in_schema=False)


def form(request: Request, message: str | None = None, status: int = 200) -> Response:
    html = env.get_template("login.html").render(
        request=request, message=message, csrf_token="",
        next=safe_next(request.query_params.get("next")))
    return HTMLResponse(html, status_code=status)


@router.get("/login")
async def login_page(request: Request, security: SecurityDep) -> Response:
    if not security.enabled:
        return RedirectResponse("/", status_code=303)
    return form(request)


@router.post("/login")
async def login(request: Request, security: SecurityDep) -> Response:
    if not security.enabled:
        return RedirectResponse("/", status_code=303)
    client = request.client.host if request.client else "unknown"
    wait = security.throttle.retry_after(client)
    if wait is not None:
        response = form(request, f"Too many wrong tokens from this address: try again in "
                                 f"{wait} s.", 429)
        response.headers["Retry-After"] = str(wait)
        return response
    fields = parse_qs((await request.body())[:8192].decode("utf-8", "replace"))
    token = security.token((fields.get("token") or [""])[0].strip())
    if token is None:
        security.throttle.failed(client)
        return form(request, "That token is not valid.", 401)
    target = safe_next((fields.get("next") or ["/"])[0])
    response = RedirectResponse(target, status_code=303)
    response.headers.append("set-cookie", session_cookie_header(
        security.new_session(token), max_age=int(security.session_seconds),
        secure=request.url.scheme == "https"))
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response
