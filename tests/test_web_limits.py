"""No unauthenticated way to exhaust the dashboard's server, and no way around its throttles.

- A request body is counted as it arrives, whatever its headers say: a chunked body (no
  Content-Length) of 200 MB sent to ``/login`` or to a page of an open server is cut off at its
  cap (a form's 64 KiB on pages, 64 MiB on the API) with 413, and the server's memory stays
  where it was. Before, the cap read only Content-Length, and the CSRF check and the login read
  whole bodies: 600 MB to ``/login`` took the server from 69 to 669 MB.
- Wrong bearer tokens are throttled per client address like wrong logins (counted apart).
- A client's own X-Forwarded-For names nobody unless the server was told to trust that proxy:
  rotating it does not reset the throttle.

Every server here is the dashboard's own configuration (:func:`konduit.web.app.server_config`,
through ``tests.support.browser.serving``) on a thread, spoken to over a real socket.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

import konduit
from konduit.web import create_app, database_client
from konduit.web.security import MAX_FORM_BYTES, Security, parse_tokens
from tests.support.browser import serving

pytestmark = [pytest.mark.storage]

OP = "op-" + "o" * 20
CHUNK = b"x" * (1 << 20)
HUGE = 200 << 20  # bytes a client tries to send


@contextmanager
def dashboard(db_url: str, *, tokens: bool, trusted_proxies: tuple[str, ...] = ()
              ) -> Iterator[tuple[str, int]]:
    """The dashboard served as ``konduit dashboard`` serves it; yields (base URL, port)."""
    security = Security(parse_tokens([f"op:{OP}"]) if tokens else ())
    web = create_app(database_client(db_url, None), None, security=security)
    with serving(web, trusted_proxies=trusted_proxies) as base:
        yield base, int(base.rsplit(":", 1)[1])


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def send_chunked(port: int, path: str, *, content_type: str, total: int = HUGE) -> tuple[int, int]:
    """POST ``total`` bytes to ``path`` as a chunked body (no Content-Length), stopping as soon as
    the server answers or closes; returns (status, bytes sent)."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    sent = 0
    try:
        conn.sendall((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                      f"Origin: http://127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n").encode())
        while sent < total:
            readable, _, _ = select.select([conn], [], [], 0)
            if readable:
                break  # an answer (or a close) before the body ended
            try:
                conn.sendall(b"%x\r\n" % len(CHUNK) + CHUNK + b"\r\n")
            except OSError:  # the server stopped reading and closed
                break
            sent += len(CHUNK)
        else:
            conn.sendall(b"0\r\n\r\n")
        answer = b""
        while b"\r\n" not in answer:
            part = conn.recv(4096)
            if not part:
                break
            answer += part
    finally:
        conn.close()
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split()[1]), sent


def test_a_chunked_body_past_the_cap_is_refused_without_being_held(db_url: str) -> None:
    before = peak_rss_mib()
    with dashboard(db_url, tokens=True) as (_, port):
        status, sent = send_chunked(port, "/login",
                                    content_type="application/x-www-form-urlencoded")
        assert status == 413
        assert sent < HUGE  # the server answered long before the body ended
    with dashboard(db_url, tokens=False) as (_, port):
        # An open server (loopback, no token): a page POST is a form, capped at a form's size.
        status, sent = send_chunked(port, "/executions/00000000-0000-0000-0000-000000000000/cancel",
                                    content_type="application/x-www-form-urlencoded")
        assert status == 413 and sent < HUGE
    grown = peak_rss_mib() - before
    assert grown < 64, f"the server's peak memory grew by {grown:.0f} MiB"


def test_bodies_within_their_caps_still_pass(db_url: str) -> None:
    with dashboard(db_url, tokens=False) as (base, port), \
            httpx.Client(base_url=base, timeout=30) as http:
        # A big API body, chunked: read whole (the API's cap is 64 MiB), then judged by the API.
        status, _ = send_chunked(port, "/api/v1/executions", content_type="application/json",
                                 total=3 << 20)
        assert status == 422  # not JSON: the API's own answer, not the cap's
        # A form just under a form's cap is read and handed on (here: the page's own 403).
        form = {"csrf_token": "x", "note": "y" * (MAX_FORM_BYTES - 100)}
        page = http.post("/executions/00000000-0000-0000-0000-000000000000/cancel", data=form,
                         headers={"Origin": base})
        assert page.status_code != 413
        too_big = http.post("/executions/00000000-0000-0000-0000-000000000000/cancel",
                            data={"note": "y" * MAX_FORM_BYTES}, headers={"Origin": base})
        assert too_big.status_code == 413


def test_wrong_bearer_tokens_are_throttled_per_client(db_url: str) -> None:
    with dashboard(db_url, tokens=True) as (base, _), \
            httpx.Client(base_url=base, timeout=30) as http:
        for _ in range(10):
            wrong = http.get("/api/v1/workers", headers={"Authorization": "Bearer " + "w" * 24})
            assert wrong.status_code == 401
        refused = http.get("/api/v1/workers", headers={"Authorization": f"Bearer {OP}"})
        assert refused.status_code == 429, refused.text
        assert 1 <= int(refused.headers["retry-after"]) <= 61
        assert "too many wrong tokens" in refused.json()["detail"]
        # The login form counts apart: wrong bearer tokens do not lock an address out of it.
        assert http.post("/login", data={"token": OP}).status_code == 303


@pytest.mark.parametrize("trusted", [False, True], ids=["no-proxy-trusted", "proxy-trusted"])
def test_a_forwarded_for_header_counts_only_from_a_trusted_proxy(db_url: str, trusted: bool) -> None:
    proxies = ("127.0.0.1",) if trusted else ()
    with dashboard(db_url, tokens=True, trusted_proxies=proxies) as (base, _), \
            httpx.Client(base_url=base, timeout=30) as http:
        for i in range(11):  # a new address in every attempt
            answer = http.post("/login", data={"token": "w" * 24},
                               headers={"X-Forwarded-For": f"203.0.113.{i}"})
            expected = 401 if trusted or i < 10 else 429
            assert answer.status_code == expected, (i, answer.status_code)


@pytest.mark.parametrize("timeout", [1e308, "999999999d", 3.2e9, "soon", -1])
def test_an_out_of_range_timeout_is_a_422_naming_the_field(
        db_url: str, make_app: Callable[..., konduit.App], timeout: object) -> None:
    """Before: 1e308 s and "999999999d" overflowed the deadline's timestamp in the database and
    answered 503 "try again", so retrying clients looped. The start checks it (as it does for
    every door) once it knows the workflow: an unknown one is the fault it names first."""
    wf = konduit.Workflow("limits", version=1)
    wf.step(name="only")(lambda ctx: 1)
    make_app(wf).start("limits", 0)  # registers it
    with dashboard(db_url, tokens=False) as (base, _), \
            httpx.Client(base_url=base, timeout=30) as http:
        answer = http.post("/api/v1/executions", headers={"Origin": base},
                           json={"workflow": "limits", "input": 1, "timeout": timeout})
        assert answer.status_code == 422, answer.text
        assert answer.json()["field"] == "body.timeout", answer.text


def test_parse_duration_refuses_more_than_a_century() -> None:
    from konduit.core.durations import MAX_DURATION_SECONDS, parse_duration
    from konduit.errors import KonduitError

    assert parse_duration("36500d") == MAX_DURATION_SECONDS
    for value in (MAX_DURATION_SECONDS + 1, "36501d", 1e308, "999999999d"):
        with pytest.raises(KonduitError, match="at most 100 years"):
            parse_duration(value, what="timeout")
