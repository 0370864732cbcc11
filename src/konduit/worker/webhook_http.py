"""One webhook POST, guarded against requests to internal addresses (SSRF).

The host is resolved when the connection is made, every address it resolves to is checked, and
the connection goes to the checked address itself, with the URL's name as Host header and TLS
server name: a name whose DNS answer changes between a check and a connect (DNS rebinding) cannot
slip an internal address past the check, because nothing resolves it a second time. Redirects are
not followed (a 3xx is a failed attempt), so a receiver cannot bounce the request inward either.
Blocking calls: the sender runs them on threads (:mod:`konduit.worker.webhook_sender`).
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from konduit.core.webhooks import Webhook

Resolver = Callable[[str, int], Sequence[tuple[Any, ...]]]
"""``socket.getaddrinfo``-shaped: (host, port) -> [(family, type, proto, canonname, sockaddr)]."""


class Refused(Exception):
    """The webhook's host resolves to an address it may not be sent to: nothing was sent."""


def forbidden_reason(address: str) -> str | None:
    """Why a webhook may not connect to ``address`` without ``allow_private`` (None: it may).
    Loopback, private (RFC 1918, unique local), link-local, multicast, unspecified, reserved and
    shared (CGNAT) addresses are internal; an IPv4 address mapped into IPv6 is judged as IPv4."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None:
            ip = mapped
    for reason, hit in (("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
                        ("multicast", ip.is_multicast), ("unspecified", ip.is_unspecified),
                        ("private", ip.is_private), ("reserved", ip.is_reserved)):
        if hit:
            return reason
    if not ip.is_global:
        return "not globally routable"
    return None


def getaddrinfo(host: str, port: int) -> Sequence[tuple[Any, ...]]:
    """The system resolver, for TCP."""
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


def resolve_checked(hook: Webhook, resolver: Resolver = getaddrinfo) -> list[tuple[int, str]]:
    """The (family, address) pairs to connect to for ``hook``. Raises :class:`Refused` when any
    address the name resolves to is internal (unless ``allow_private``): a name with one public
    and one private answer is refused, not half-trusted."""
    try:
        infos = resolver(hook.host, hook.port)
    except OSError as exc:
        raise ConnectionError(f"cannot resolve {hook.host!r}: {exc}") from exc
    found: list[tuple[int, str]] = []
    for family, *_, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = str(sockaddr[0])
        if not hook.allow_private:
            reason = forbidden_reason(address)
            if reason is not None:
                raise Refused(f"{hook.host} resolves to {address} ({reason}); refused without "
                              "allow_private=True")
        if (family, address) not in found:
            found.append((family, address))
    if not found:
        raise ConnectionError(f"{hook.host!r} resolves to no IP address")
    return found


def _connect(hook: Webhook, resolver: Resolver) -> socket.socket:
    """A socket connected to a checked address of the hook's host (the first that answers)."""
    error: OSError | None = None
    for family, address in resolve_checked(hook, resolver):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(hook.timeout)
        try:
            sock.connect((address, hook.port))
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise ConnectionError(f"cannot connect to {hook.host}:{hook.port}: {error}")


class _CheckedHTTP(http.client.HTTPConnection):
    """An HTTP connection whose connect() resolves, checks and connects to the checked address."""

    def __init__(self, hook: Webhook, resolver: Resolver):
        super().__init__(hook.host, hook.port, timeout=hook.timeout)
        self.hook = hook
        self.resolver = resolver

    def connect(self) -> None:
        self.sock = _connect(self.hook, self.resolver)


class _CheckedHTTPS(http.client.HTTPSConnection):
    """As :class:`_CheckedHTTP`, with TLS verified against the URL's host name (SNI too)."""

    def __init__(self, hook: Webhook, resolver: Resolver, context: ssl.SSLContext):
        super().__init__(hook.host, hook.port, timeout=hook.timeout, context=context)
        self.hook = hook
        self.resolver = resolver
        self.tls = context

    def connect(self) -> None:
        raw = _connect(self.hook, self.resolver)
        try:
            self.sock = self.tls.wrap_socket(raw, server_hostname=self.hook.host)
        except BaseException:
            raw.close()
            raise


@dataclass(frozen=True)
class Response:
    status: int
    reason: str


def post(hook: Webhook, body: bytes, headers: dict[str, str], *,
         resolver: Resolver = getaddrinfo,
         context: ssl.SSLContext | None = None) -> Response:
    """POST ``body`` to the hook. Raises :class:`Refused` (nothing sent) or OSError/HTTPException
    for a failed call; returns the answer's status otherwise (the caller decides what is a
    success). The response body is read (at most 64 KiB) and dropped."""
    parts = urlsplit(hook.url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn: http.client.HTTPConnection
    if hook.scheme == "https":
        conn = _CheckedHTTPS(hook, resolver, context or ssl.create_default_context())
    else:
        conn = _CheckedHTTP(hook, resolver)
    try:
        conn.request("POST", path, body=body, headers={
            "Content-Type": "application/json",
            "User-Agent": "konduit-webhooks",
            **headers,
        })
        answer = conn.getresponse()
        answer.read(65536)
        return Response(answer.status, answer.reason)
    finally:
        conn.close()


__all__ = ["Refused", "Response", "forbidden_reason", "post", "resolve_checked"]
