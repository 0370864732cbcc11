"""The login form that turns a token into a page session (see :mod:`konduit.web.security`)."""

from __future__ import annotations

import time
from collections import deque
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from konduit.web.security import SESSION_COOKIE, Security, session_cookie_header


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path of this server, never another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


class LoginThrottle:
    """At most ``failures`` wrong tokens per client address in ``window`` seconds; past that
    the login answers 429 until the oldest failure leaves the window. Tokens are long enough
    that guessing is hopeless anyway; this keeps a script from trying, and from filling logs.
    Behind a proxy every client shares its address: the limit is then the proxy's."""

    def __init__(self, failures: int = 10, window: float = 60.0, clients: int = 10_000):
        self.failures = failures
        self.window = window
        self.clients = clients  # bounded memory: the oldest addresses are forgotten first
        self._seen: dict[str, deque[float]] = {}

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._seen.get(client, deque())
        while times and now - times[0] > self.window:
            times.popleft()
        return times

    def retry_after(self, client: str) -> int | None:
        """Seconds until this client may try again, None when it may now."""
        now = time.monotonic()
        times = self._recent(client, now)
        if len(times) < self.failures:
            return None
        return max(1, int(self.window - (now - times[0])) + 1)

    def failed(self, client: str) -> None:
        now = time.monotonic()
        times = self._recent(client, now)
        times.append(now)
        self._seen.pop(client, None)
        self._seen[client] = times  # most recent last, for the eviction below
        while len(self._seen) > self.clients:
            del self._seen[next(iter(self._seen))]


def login_router(security: Security, throttle: LoginThrottle | None = None) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    throttle = throttle or LoginThrottle()

    def form(request: Request, message: str | None = None, status: int = 200) -> Response:
        from konduit.web.app import env

        html = env.get_template("login.html").render(
            request=request, message=message, csrf_token="",
            next=safe_next(request.query_params.get("next")))
        return HTMLResponse(html, status_code=status)

    @router.get("/login")
    async def login_page(request: Request) -> Response:
        if not security.enabled:
            return RedirectResponse("/", status_code=303)
        return form(request)

    @router.post("/login")
    async def login(request: Request) -> Response:
        if not security.enabled:
            return RedirectResponse("/", status_code=303)
        client = request.client.host if request.client else "unknown"
        wait = throttle.retry_after(client)
        if wait is not None:
            response = form(request, f"Too many wrong tokens from this address: try again in "
                                     f"{wait} s.", 429)
            response.headers["Retry-After"] = str(wait)
            return response
        fields = parse_qs((await request.body())[:8192].decode("utf-8", "replace"))
        token = security.token((fields.get("token") or [""])[0].strip())
        if token is None:
            throttle.failed(client)
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

    return router
