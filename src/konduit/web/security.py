"""Who may use the dashboard and its API: tokens, sessions, CSRF, and the headers every
response carries.

Tokens come from ``--token`` (repeatable) or ``KONDUIT_API_TOKEN`` (several separated by commas
or whitespace). Each is ``ro:SECRET`` (read-only: every GET), ``op:SECRET`` (operator: also
start, cancel, repair) or a bare ``SECRET`` (operator). With no token the server is open, and
:func:`check_bind` refuses to listen on anything but a loopback address.

With tokens:

- every ``/api`` request, ``/openapi.json`` and ``/metrics`` needs ``Authorization: Bearer
  <token>`` (401 with ``WWW-Authenticate`` without a valid one; 403 for a read-only token on a
  mutating call). A GET there is also allowed with a page session, so a logged-in browser can
  read the JSON and the API docs; a mutating ``/api`` call always needs the bearer token (a
  cookie alone is what a cross-site request would carry).
- pages need a session: ``/login`` takes a token and sets a signed cookie (HMAC-SHA256 with the
  per-server random secret, or ``KONDUIT_SESSION_SECRET`` so sessions survive restarts and are
  shared by replicas), ``HttpOnly``, ``SameSite=Strict``, ``Secure`` when the request came over
  https, expiring after ``session_seconds``. A session remembers which token opened it (by a
  keyed fingerprint), so a token taken off the list ends its sessions.
- every page POST carries a CSRF token (form field ``csrf_token``, or header ``X-CSRF-Token``)
  derived from the session; a read-only session may not POST at all.

Every POST must also come from the dashboard's own origin (``Origin`` and ``Sec-Fetch-Site``),
tokens or not; without tokens only a loopback ``Host`` is answered (DNS rebinding). Every
response gets a Content-Security-Policy without inline script,
``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy:
same-origin``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import socket
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from konduit.errors import DashboardError
from konduit.settings import settings

Kind = Literal["ro", "op"]
SESSION_COOKIE = "konduit_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
MIN_TOKEN_CHARS = 16
MAX_FORM_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest request body taken (a batch of big inputs; one input may hold 16 MiB)."""
DEFAULT_SESSION_SECONDS = 8 * 3600
PUBLIC_PATHS = ("/login", "/logout", "/static/")
"""Paths open without a session: the login form itself, logging out, and stylesheets."""

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
"""No inline script or style (nor eval): only the script and stylesheet files the server serves
itself (``/static/``); the templates have neither inline (tests/test_dashboard_ops.py checks)."""

SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


@dataclass(frozen=True)
class Token:
    """One accepted API token and what it may do."""

    kind: Kind
    secret: str = field(repr=False)

    @property
    def may_write(self) -> bool:
        return self.kind == "op"

    @property
    def label(self) -> str:
        """Who acts with this token, as recorded with an answer (``op token 1a2b3c4d``): its
        kind and a short digest of it, never the token itself. Tokens have no names: the
        digest tells them apart in the records, and the operator who holds one can tell it."""
        digest = hashlib.sha256(b"konduit-token:" + self.secret.encode()).hexdigest()[:8]
        return f"{self.kind} token {digest}"


OPEN_DASHBOARD = "open dashboard"
"""Who acts on a dashboard served without tokens (only to this machine)."""


def parse_token(spec: str) -> Token:
    """``ro:SECRET``, ``op:SECRET`` or a bare ``SECRET`` (operator)."""
    spec = spec.strip()
    kind: Kind = "op"
    prefix, sep, rest = spec.partition(":")
    if sep and prefix in ("ro", "op"):
        kind, spec = ("ro" if prefix == "ro" else "op"), rest
    elif sep and re.fullmatch(r"[a-z]{1,8}", prefix):
        raise DashboardError(f"token kind {prefix!r} is unknown: write ro:SECRET (read-only) or "
                             "op:SECRET (operator)")
    if len(spec) < MIN_TOKEN_CHARS or any(c.isspace() or c == "," for c in spec):
        raise DashboardError(
            f"a token must be at least {MIN_TOKEN_CHARS} characters without spaces or commas "
            "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return Token(kind, spec)


def parse_tokens(specs: Iterable[str]) -> tuple[Token, ...]:
    """Every token of ``specs``, each of which may hold several separated by commas or spaces."""
    out: list[Token] = []
    for spec in specs:
        out.extend(parse_token(part) for part in re.split(r"[\s,]+", spec) if part)
    return tuple(out)


def tokens_from_env(env: dict[str, str] | None = None) -> tuple[Token, ...]:
    """The tokens of ``KONDUIT_API_TOKEN``."""
    value = settings().api_token if env is None else env.get("KONDUIT_API_TOKEN", "")
    return parse_tokens([value]) if value.strip() else ()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) only ever means this machine."""
    name = host.strip("[]")
    if name in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in found)


def loopback_host(host_header: str) -> bool:
    """Whether a ``Host`` header names this machine: ``localhost`` or a loopback address
    literal, with or without a port (no name is resolved)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, tokens: Sequence[Token]) -> None:
    """Refuse to serve an address other machines can reach without a token."""
    if tokens or is_loopback(host):
        return
    raise DashboardError(
        f"refusing to listen on {host} without an API token: anyone who can reach it could read "
        "every execution's input and output, and start, cancel and repair executions. Set "
        "KONDUIT_API_TOKEN or pass --token op:SECRET (and ro:SECRET for read-only users), or "
        "listen on 127.0.0.1 behind a proxy that authenticates (docs/api.md)")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Session:
    """A logged-in browser: what it may do, when it ends, and its CSRF token."""

    kind: Kind
    expires: float
    csrf: str
    who: str = OPEN_DASHBOARD
    """The label of the token that opened it (:attr:`Token.label`)."""


class LoginThrottle:
    """At most ``failures`` wrong tokens per client address in ``window`` seconds, at the login
    form and in API bearer headers alike; past that both answer 429 until the oldest failure
    leaves the window. Tokens are long enough
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


class Security:
    """The server's tokens and session secret, and the checks made with them."""

    def __init__(self, tokens: Sequence[Token] = (), *, secret: bytes | str | None = None,
                 session_seconds: float = DEFAULT_SESSION_SECONDS,
                 throttle: LoginThrottle | None = None):
        self.tokens = tuple(tokens)
        if secret is None:
            secret = settings().session_secret or None
        if isinstance(secret, str):
            if len(secret) < MIN_TOKEN_CHARS:
                raise DashboardError(
                    f"KONDUIT_SESSION_SECRET must be at least {MIN_TOKEN_CHARS} characters")
            secret = secret.encode()
        # A random secret per server: sessions end when it restarts, which is the safe default.
        self.secret: bytes = secret or secrets.token_bytes(32)
        self.session_seconds = session_seconds
        self.throttle = throttle or LoginThrottle()
        # Counted apart from the login form's, so that a flood of wrong logins from an address
        # (a shared NAT) does not lock its operators' API clients out, nor the reverse.
        self.bearer_throttle = LoginThrottle(self.throttle.failures, self.throttle.window)

    @property
    def enabled(self) -> bool:
        """Whether anything needs a token (some token is configured)."""
        return bool(self.tokens)

    def _mac(self, *parts: str) -> str:
        return hmac.new(self.secret, "\x00".join(parts).encode(), hashlib.sha256).hexdigest()

    def token(self, presented: str | None) -> Token | None:
        """The configured token equal to ``presented`` (compared in constant time), else None."""
        if not presented:
            return None
        found = None
        for t in self.tokens:
            if hmac.compare_digest(t.secret.encode(), presented.encode()):
                found = t
        return found

    def bearer(self, headers: Headers) -> tuple[Token | None, bool]:
        """The token of an ``Authorization: Bearer`` header, and whether one was presented."""
        value = headers.get("authorization", "")
        scheme, _, presented = value.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return None, bool(value)
        return self.token(presented.strip()), True

    def new_session(self, token: Token, now: float | None = None) -> str:
        """A signed session cookie value for a login with ``token``."""
        body = {"k": token.kind, "e": int((now or time.time()) + self.session_seconds),
                "n": secrets.token_urlsafe(16), "f": self._mac("token", token.secret)[:32]}
        payload = _b64(json.dumps(body, separators=(",", ":")).encode())
        return f"{payload}.{self._mac('session', payload)}"

    def session(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session of a cookie value: None when missing, forged, expired, or opened with a
        token that is no longer configured."""
        if not cookie or "." not in cookie:
            return None
        payload, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac.encode(), self._mac("session", payload).encode()):
            return None
        try:
            body: dict[str, Any] = json.loads(_unb64(payload))
            kind, expires, nonce, fingerprint = body["k"], float(body["e"]), body["n"], body["f"]
        except (ValueError, KeyError, TypeError):
            return None
        if expires < (now or time.time()) or kind not in ("ro", "op"):
            return None
        opened_by = [t for t in self.tokens
                     if hmac.compare_digest(self._mac("token", t.secret)[:32].encode(),
                                            str(fingerprint).encode())]
        if not opened_by:
            return None
        return Session(kind, expires, self._mac("csrf", str(nonce)), opened_by[0].label)


def same_origin(headers: Headers) -> bool:
    """Whether a browser says the request comes from a page of this server (or says nothing:
    curl and the tests, which carry no cookies a forged page could ride on)."""
    origin = headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != headers.get("host"):
        return False
    if origin == "null":
        return False
    return headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")


def _is_api(path: str) -> bool:
    return path.startswith("/api/") or path in ("/api", "/openapi.json", "/metrics")


class SecurityMiddleware:
    """Headers on every response; tokens on the API; sessions and CSRF on pages."""

    def __init__(self, app: ASGIApp, security: Security):
        self.app = app
        self.security = security

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (k, v) for k, v in SECURITY_HEADERS if k not in names]
            await send(message)

        refusal, receive = await self.check(scope, receive)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    async def check(self, scope: Scope, receive: Receive) -> tuple[ASGIApp | None, Receive]:
        """A response refusing the request (or None to let it through), and the receive channel
        to hand on (the body, when it was read: every body is read here, counted as it arrives,
        and never past its cap)."""
        from konduit.web import problems

        path: str = scope["path"]
        headers = Headers(scope=scope)
        reading = scope["method"] in ("GET", "HEAD", "OPTIONS")
        api = _is_api(path)
        # A page's form needs a few fields; the API takes big inputs. The cap holds for the
        # bytes that arrive, not for what Content-Length says: a chunked body declares none.
        cap = MAX_BODY_BYTES if api else MAX_FORM_BYTES
        too_large = (problems.problem if api else problems.page_refusal)(
            413, f"a request body here may hold at most {cap} bytes")
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > cap):
            return too_large, receive
        refusal, csrf_session = self._authorize(scope, path, reading, headers)
        if refusal is not None or reading:
            return refusal, receive
        # Only past authorization: an unauthenticated client never makes the server hold more
        # than a form's worth (the login form is on a page path).
        body, receive = await _read_body(receive, cap)
        if body is None:
            return too_large, receive
        if csrf_session is not None:
            csrf = headers.get(CSRF_HEADER) or _form_field(headers, body, CSRF_FIELD)
            if not csrf or not hmac.compare_digest(csrf.encode(), csrf_session.csrf.encode()):
                return problems.page_refusal(403, "the form's CSRF token is missing or wrong: "
                                             "reload the page and send it again"), receive
        return None, receive

    def _authorize(self, scope: Scope, path: str, reading: bool, headers: Headers
                   ) -> tuple[ASGIApp | None, Session | None]:
        """A refusal, or None and the session whose CSRF token the body must carry (None when
        the request needs no CSRF check)."""
        from konduit.web import problems

        sec = self.security
        if not sec.enabled and not loopback_host(headers.get("host", "")):
            # DNS rebinding: a page of evil.example resolved to 127.0.0.1 would read the open
            # dashboard as its own origin. Without tokens only loopback names are served.
            return problems.problem(403, "this dashboard has no token, so it answers only to "
                                    "localhost or a loopback address: set a token "
                                    "(KONDUIT_API_TOKEN) to serve it under another name"), None
        if not reading and not same_origin(headers):
            if _is_api(path):
                return problems.forbidden("a cross-site request may not change anything"), None
            return problems.page_refusal(403, "a form must be sent from the dashboard's own "
                                         "pages"), None
        if _is_api(path):
            if not sec.enabled:
                return None, None
            client = _client_address(scope)
            wait = sec.bearer_throttle.retry_after(client)
            if wait is not None:
                # Wrong bearer tokens are throttled like wrong logins: per client address.
                return problems.too_many(
                    f"too many wrong tokens from this address: try again in {wait} s",
                    retry_after=wait), None
            token, presented = sec.bearer(headers)
            if token is None:
                session = sec.session(_cookie(headers))
                if reading and session is not None and not presented:
                    return None, None
                if presented:
                    sec.bearer_throttle.failed(client)
                return problems.unauthorized(
                    "a valid token is needed: send Authorization: Bearer <token>"
                    if not presented else "the token is not valid"), None
            if not reading and not token.may_write:
                return problems.forbidden(
                    "a read-only (ro:) token may only read; this call needs an operator (op:) "
                    "token"), None
            scope.setdefault("state", {})["who"] = token.label
            return None, None
        if not sec.enabled or path.startswith(PUBLIC_PATHS):
            return None, None
        session = sec.session(_cookie(headers))
        if session is None:
            if reading:
                return problems.to_login(scope), None
            return problems.page_refusal(401, "your session has ended: log in again"), None
        scope.setdefault("state", {})["session"] = session
        scope["state"]["who"] = session.who
        if reading:
            return None, None
        if session.kind != "op":
            return problems.page_refusal(403, "a read-only session cannot change anything: log "
                                         "in with an operator token"), None
        return None, session


def who_acts(scope: Scope) -> str:
    """Who makes this request, as the security middleware found it: the label of its bearer
    token or of its session's token; ``open dashboard`` on a server without tokens."""
    state = scope.get("state") or {}
    return str(state.get("who") or OPEN_DASHBOARD)


def _client_address(scope: Scope) -> str:
    """The peer's address as the server saw it (a proxy's X-Forwarded-For only where the
    dashboard was told to trust that proxy: ``serve(trusted_proxies=...)``)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _cookie(headers: Headers) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == SESSION_COOKIE:
            return value
    return None


def _form_field(headers: Headers, body: bytes, name: str) -> str | None:
    if not headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return None
    values = parse_qs(body.decode("latin-1"), keep_blank_values=True).get(name)
    return values[0] if values else None


async def _read_body(receive: Receive, cap: int) -> tuple[bytes | None, Receive]:
    """The request body, counted as it arrives, and a receive channel that hands it on again;
    None (and nothing more read) once it passes ``cap`` bytes."""
    chunks: list[bytes] = []
    messages: list[Message] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            messages.append(message)
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            return None, receive
        chunks.append(chunk)
        messages.append(message)
        more = message.get("more_body", False)

    async def replay() -> Message:
        if messages:
            return messages.pop(0)
        return await receive()

    return b"".join(chunks), replay


def session_cookie_header(value: str, *, max_age: int, secure: bool) -> str:
    """A ``Set-Cookie`` value for the session."""
    parts = [f"{SESSION_COOKIE}={value}", "Path=/", f"Max-Age={max_age}", "HttpOnly",
             "SameSite=Strict"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)
