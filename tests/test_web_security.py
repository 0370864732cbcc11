"""The dashboard's security over real HTTP: tokens on the API (none, wrong, read-only on a
mutating call), the login form and its session cookie, CSRF on every page POST, the refusal to
listen beyond loopback without a token, the headers of every response, escaping, and database
passwords kept out of every answer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from uuid import uuid4

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

import konduit
from konduit.db import describe_url
from konduit.errors import DashboardError, DatabaseUnavailable
from konduit.masking import mask_password
from konduit.web import create_app, database_client, serve
from konduit.web.security import (
    SESSION_COOKIE,
    LoginThrottle,
    Security,
    check_bind,
    is_loopback,
    parse_tokens,
    tokens_from_env,
)
from tests.apps import api_app
from tests.support.browser import browser, eventually, screenshot, serving
from tests.support.workers import running_worker

__all__ = ["browser"]  # the browser fixture, shared with the dashboard's tests

RO, OP = "ro-" + "r" * 20, "op-" + "o" * 20
PROBLEM = "application/problem+json"
HEADERS = {"x-frame-options": "DENY", "x-content-type-options": "nosniff",
           "referrer-policy": "same-origin"}


@contextmanager
def guarded(app: konduit.App | None, db_url: str, *, trusted_proxies: tuple[str, ...] = (),
            **options: object) -> Iterator[tuple[str, Security]]:
    security = Security(parse_tokens([f"ro:{RO}", f"op:{OP}"]), **options)  # type: ignore[arg-type]
    with serving(create_app(database_client(db_url, app), app, security=security),
                 trusted_proxies=trusted_proxies) as base:
        yield base, security


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def secure_headers(response: httpx.Response) -> None:
    for name, value in HEADERS.items():
        assert response.headers.get(name) == value, (response.url, name, response.headers)
    csp = response.headers["content-security-policy"]
    script = next(d for d in csp.split(";") if d.strip().startswith("script-src"))
    assert script.split() == ["script-src", "'self'"] and "frame-ancestors 'none'" in csp


def login(http: httpx.Client, token: str) -> httpx.Response:
    return http.post("/login", data={"token": token, "next": "/dead-letters"})


def csrf_of(html: str) -> str:
    found = re.findall(r'name="csrf_token" value="([^"]*)"', html)
    assert found and len(set(found)) == 1, html
    return found[0]


def test_tokens_parse_and_refuse_weak_ones() -> None:
    ro, op, bare = parse_tokens([f"ro:{RO}", f"op:{OP},{'b' * 16}"])
    assert (ro.kind, op.kind, bare.kind) == ("ro", "op", "op") and not ro.may_write
    assert tokens_from_env({"KONDUIT_API_TOKEN": f" ro:{RO}  op:{OP} "}) == (ro, op)
    assert tokens_from_env({}) == ()
    with pytest.raises(DashboardError, match="at least 16 characters"):
        parse_tokens(["op:short"])
    with pytest.raises(DashboardError, match="token kind 'rw' is unknown"):
        parse_tokens([f"rw:{OP}"])
    assert "secret" not in repr(ro) and RO not in repr(ro)


def test_non_loopback_bind_without_a_token_is_refused(db_url: str) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    with pytest.raises(DashboardError, match=r"refusing to listen on 0\.0\.0\.0 without an API token"):
        serve(db_url, host="0.0.0.0", port=0)
    check_bind("0.0.0.0", parse_tokens([f"ro:{RO}"]))  # with a token it may
    env = {k: v for k, v in os.environ.items() if k != "KONDUIT_API_TOKEN"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "konduit.cli", "dashboard", "--host", "0.0.0.0",
                           "--port", "0", "--database-url", db_url],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert "refusing to listen on 0.0.0.0 without an API token" in done.stderr
    assert "KONDUIT_API_TOKEN" in done.stderr and time.monotonic() - began < 60
    # With tokens (the environment's and --token's) it listens everywhere and asks for them.
    served = subprocess.Popen(
        [sys.executable, "-m", "konduit.cli", "dashboard", "--host", "0.0.0.0", "--port", "0",
         "--token", f"op:{OP}", "--database-url", db_url],
        env=env | {"KONDUIT_API_TOKEN": f"ro:{RO}"}, stderr=subprocess.PIPE, text=True)
    try:
        assert served.stderr is not None
        line = served.stderr.readline()
        assert "2 token(s) required" in line and RO not in line and OP not in line, line
        port = int(re.search(r"http://0\.0\.0\.0:(\d+)/", line).group(1))  # type: ignore[union-attr]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            began = time.monotonic()
            while True:  # the address is announced before the server starts listening on it
                try:
                    first = http.get("/api/v1/workflows")
                    break
                except httpx.ConnectError:
                    assert served.poll() is None and time.monotonic() - began < 30
                    time.sleep(0.1)
            assert first.status_code == 401
            assert http.get("/api/v1/workflows", headers=bearer(RO)).status_code == 200
            assert http.post("/api/v1/executions/x/cancel", headers=bearer(RO)).status_code == 403
            assert http.post(f"/api/v1/executions/{uuid4()}/cancel",
                             headers=bearer(OP)).status_code == 404
    finally:
        served.terminate()
        served.wait(timeout=30)
    weak = subprocess.run([sys.executable, "-m", "konduit.cli", "dashboard", "--token", "op:abc",
                           "--database-url", db_url], env=env, capture_output=True, text=True,
                          timeout=60)
    assert weak.returncode == 1 and "at least 16 characters" in weak.stderr


@pytest.mark.storage
def test_api_tokens(make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(*api_app.WORKFLOWS)
    # Two wrong credentials per path: more than the default throttle lets one address try
    # (tests/test_web_limits.py tests the throttle).
    with guarded(app, db_url, throttle=LoginThrottle(failures=100)) as (base, _), \
            httpx.Client(base_url=base, timeout=30) as http:
        for path in ("/api/v1/executions", "/api/v1/alerts", "/openapi.json", "/metrics",
                     "/api/v1/docs"):
            missing = http.get(path)
            assert missing.status_code == 401, path
            assert missing.headers["www-authenticate"] == 'Bearer realm="konduit"'
            assert missing.headers["content-type"].startswith(PROBLEM)
            secure_headers(missing)
            wrong = http.get(path, headers=bearer("x" * 20))
            assert wrong.status_code == 401 and "not valid" in wrong.json()["detail"]
            assert http.get(path, headers={"Authorization": f"Basic {RO}"}).status_code == 401
            assert http.get(path, headers=bearer(RO)).status_code == 200, path
        start = {"workflow": "api-flow", "input": 1}
        denied = http.post("/api/v1/executions", json=start, headers=bearer(RO))
        assert denied.status_code == 403 and "operator (op:) token" in denied.json()["detail"]
        assert http.post("/api/v1/executions", json=start).status_code == 401
        started = http.post("/api/v1/executions", json=start, headers=bearer(OP))
        assert started.status_code == 201
        eid = started.json()["id"]
        assert http.post(f"/api/v1/executions/{eid}/cancel", headers=bearer(RO)).status_code == 403
        assert http.post(f"/api/v1/executions/{eid}/cancel", headers=bearer(OP)).json()["cancelled"]
        assert http.get("/api/v1/executions", headers=bearer(RO)).json()["items"][0]["id"] == eid
        # A page session may read the API, but never change anything through it.
        assert login(http, OP).status_code == 303
        assert http.get("/api/v1/executions").status_code == 200
        assert http.post("/api/v1/executions", json=start).status_code == 401


@pytest.mark.storage
def test_logout_and_a_throttled_login(db_url: str) -> None:
    """Every page of a session has a Log out button (a POST with the CSRF token) that ends it;
    ten wrong tokens from one address in a minute and the login answers 429, right token or not."""
    with guarded(None, db_url) as (base, _), httpx.Client(base_url=base, timeout=30) as http:
        assert login(http, OP).status_code == 303
        page = http.get("/")
        assert page.status_code == 200 and 'id="logout"' in page.text
        out = http.post("/logout", data={"csrf_token": csrf_of(page.text)})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert SESSION_COOKIE not in http.cookies
        assert http.get("/").status_code == 303  # back to the login
        assert 'id="logout"' not in http.get("/login").text

        for _ in range(10):
            assert login(http, "w" * 20).status_code == 401
        refused = login(http, OP)  # the right token, too soon
        assert refused.status_code == 429 and "Too many wrong tokens" in refused.text
        assert 1 <= int(refused.headers["retry-after"]) <= 61
        assert SESSION_COOKIE not in http.cookies
        # The API is not behind the login form: a bearer token still works meanwhile.
        assert http.get("/api/v1/workers", headers=bearer(RO)).status_code == 200


def test_login_session_and_csrf(make_app: Callable[..., konduit.App], db_url: str) -> None:
    api_app.HEALED.clear()
    app = make_app(*api_app.WORKFLOWS)
    with running_worker(app, poll_interval=0.05):
        handle = app.start("api-flow", {"fail": True})
        handle.wait(30)
        eid = handle.id
    # Served behind a TLS proxy on this machine (--trusted-proxy 127.0.0.1), for the last check.
    with guarded(app, db_url, trusted_proxies=("127.0.0.1",)) as (base, security), \
            httpx.Client(base_url=base, timeout=30) as http:
        away = http.get("/dead-letters?limit=5")
        assert away.status_code == 303
        assert away.headers["location"] == "/login?next=%2Fdead-letters%3Flimit%3D5"
        page = http.get("/login")
        assert page.status_code == 200 and 'name="token"' in page.text
        secure_headers(page)
        bad = login(http, "x" * 20)
        assert bad.status_code == 401 and "not valid" in bad.text and SESSION_COOKIE not in http.cookies
        ok = login(http, OP)
        assert ok.status_code == 303 and ok.headers["location"] == "/dead-letters"
        cookie = ok.headers["set-cookie"]
        for flag in ("HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={int(security.session_seconds)}"):
            assert flag in cookie, cookie
        assert "Secure" not in cookie  # plain http here; https (behind a proxy) adds it
        assert http.get("/dead-letters").status_code == 200
        repair = f"/executions/{eid}/repair"
        confirm = http.get(repair)  # the confirmation page, whose form carries the token
        assert confirm.status_code == 200
        csrf = csrf_of(confirm.text)
        assert csrf and csrf == csrf_of(http.get("/").text)  # one token per session

        no_csrf = http.post(repair, data={"confirm": "yes"})
        assert no_csrf.status_code == 403 and "CSRF" in no_csrf.text
        wrong = http.post(repair, data={"confirm": "yes", "csrf_token": "0" * len(csrf)})
        assert wrong.status_code == 403
        cross = http.post(repair, data={"confirm": "yes", "csrf_token": csrf},
                          headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403
        site = http.post(repair, data={"confirm": "yes", "csrf_token": csrf},
                         headers={"Sec-Fetch-Site": "cross-site"})
        assert site.status_code == 403
        assert app.status(eid).outcomes["flaky"] == "failed"  # none of them repaired anything
        api_app.HEALED.set()
        done = http.post(repair, data={"confirm": "yes", "csrf_token": csrf})
        assert done.status_code == 303 and "repair+started" in done.headers["location"]

        # Another login gets another CSRF token; the old one no longer works with it.
        http.cookies.clear()
        assert login(http, OP).status_code == 303
        assert csrf_of(http.get("/").text) != csrf
        assert http.post(repair, data={"confirm": "yes", "csrf_token": csrf}).status_code == 403

        # A read-only session looks but cannot POST, even with its CSRF token.
        http.cookies.clear()
        assert login(http, RO).status_code == 303
        ro_csrf = csrf_of(http.get("/").text)
        refusal = http.post(repair, data={"confirm": "yes", "csrf_token": ro_csrf})
        assert refusal.status_code == 403 and "read-only session" in refusal.text

        # A forged, tampered or expired cookie is no session.
        value = http.cookies[SESSION_COOKIE]
        for forged in (value[:-1] + ("0" if value[-1] != "0" else "1"), "x.y", ""):
            http.cookies.clear()
            http.cookies.set(SESSION_COOKIE, forged)
            assert http.get("/").status_code == 303
        http.cookies.clear()
        http.cookies.set(SESSION_COOKIE, security.new_session(security.tokens[1], now=time.time() - 9 * 3600))
        assert http.get("/").status_code == 303
        assert http.post(repair, data={"confirm": "yes", "csrf_token": csrf}).status_code == 401

        # A session opened elsewhere with a token this server does not have is refused.
        other = Security(parse_tokens([f"op:{'z' * 20}"]), secret=security.secret)
        http.cookies.clear()
        http.cookies.set(SESSION_COOKIE, other.new_session(other.tokens[0]))
        assert http.get("/").status_code == 303
        # An open redirect is not: next= only goes to this server's paths.
        http.cookies.clear()
        away_next = http.post("/login", data={"token": OP, "next": "//evil.example/x"})
        assert away_next.headers["location"] == "/"
        assert http.post("/logout").headers["location"] == "/login"
        # Behind that TLS proxy (X-Forwarded-Proto trusted from 127.0.0.1): Secure.
        secure = http.post("/login", data={"token": OP}, headers={"X-Forwarded-Proto": "https"})
        assert secure.status_code == 303 and "; Secure" in secure.headers["set-cookie"]


@pytest.mark.storage
def test_headers_escaping_and_no_password_in_answers(db_url: str) -> None:
    with serving(create_app(database_client(db_url))) as base, httpx.Client(base_url=base) as http:
        for path in ("/", "/dead-letters", "/stats", "/alerts", "/metrics", "/api/v1/executions",
                     "/api/v1/alerts", "/executions/nope", "/openapi.json", "/api/v1/docs",
                     "/login"):
            answer = http.get(path)
            assert answer.status_code < 500, path
            secure_headers(answer)
        # Without tokens: loopback names only (DNS rebinding), and no cross-site change.
        for name in ("evil.example", "evil.example:80", "10.0.0.1", "127.0.0.1.evil.example"):
            rebound = http.get("/api/v1/executions", headers={"Host": name})
            assert rebound.status_code == 403 and "loopback" in rebound.json()["detail"], name
            assert http.get("/", headers={"Host": name}).status_code == 403
        for name in ("localhost", "localhost:8090", "[::1]:8090", "127.0.0.2"):
            assert http.get("/api/v1/executions", headers={"Host": name}).status_code == 200, name
        forged = http.post("/api/v1/executions/x/cancel", headers={"Origin": "http://evil.example"})
        assert forged.status_code == 403 and forged.headers["content-type"].startswith(PROBLEM)
        hostile = "<script>alert(1)</script>"
        stats = http.get("/stats", params={"history": hostile})
        assert stats.status_code == 400 and hostile not in stats.text and "&lt;script&gt;" in stats.text
        listed = http.get("/", params={"workflow": hostile})
        assert hostile not in listed.text
        for html in (stats.text, listed.text, http.get("/api/v1/docs").text):
            tags = re.findall(r"<script[^>]*>", html, re.IGNORECASE)
            assert all(' src="/static/' in t for t in tags), tags  # no inline script
            assert " on" + "click=" not in html.lower()

    for url in ("postgresql://bob:s3cretpw@127.0.0.1:1/none", "postgresql://bob:s3cretpw@[::1/none",
                "host=127.0.0.1 port=1 user=bob password=s3cretpw"):
        with serving(create_app(database_client(url))) as base, httpx.Client(base_url=base) as http:
            for path in ("/", "/api/v1/executions", "/strip.json", "/dead-letters"):
                down = http.get(path, timeout=30)
                assert down.status_code == 503, (url, path, down.text)
                assert "s3cretpw" not in down.text, (url, path, down.text)
            assert http.get("/api/v1/executions").headers["content-type"].startswith(PROBLEM)


@pytest.mark.storage
def test_login_and_repair_in_a_browser(make_app: Callable[..., konduit.App], db_url: str,
                                       browser: WebDriver) -> None:
    """A real browser logs in through the form, keeps its session cookie, and its Repair form
    carries the CSRF token and passes the origin check; logging in read-only, it is refused."""
    api_app.HEALED.clear()
    app = make_app(*api_app.WORKFLOWS)
    with running_worker(app, poll_interval=0.05), guarded(app, db_url) as (base, _):
        handle = app.start("api-flow", {"fail": True})
        assert handle.wait(30).outcomes["flaky"] == "failed"
        target = f"{base}/executions/{handle.id}"
        browser.get(target)
        eventually(browser, lambda d: d.current_url.startswith(f"{base}/login"))
        screenshot(browser, "security-login")
        browser.find_element(By.ID, "token").send_keys("x" * 20)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        eventually(browser, lambda d: "not valid" in d.find_element(By.ID, "login-error").text)
        browser.get(target)
        browser.find_element(By.ID, "token").send_keys(OP)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        eventually(browser, lambda d: d.current_url == target)
        cookie = browser.get_cookie(SESSION_COOKIE)
        assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        api_app.HEALED.set()
        browser.find_element(By.ID, "repair").click()  # the confirmation page
        eventually(browser, lambda d: d.current_url == f"{target}/repair")
        browser.find_element(By.ID, "confirm-repair").click()  # its form: CSRF token, Origin
        eventually(browser, lambda d: "re-running" in d.find_element(By.ID, "flash").text)
        assert handle.wait(30).outcomes["flaky"] == "succeeded"
        for path, name in (("/webhooks", "webhooks"), ("/api/v1/docs", "api-docs")):
            browser.get(base + path)
            eventually(browser, lambda d, url=base + path: d.current_url == url)
            screenshot(browser, f"security-{name}")

        browser.delete_all_cookies()
        browser.get(target)
        browser.find_element(By.ID, "token").send_keys(RO)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        eventually(browser, lambda d: d.current_url == target)
        api_app.RELEASE.clear()
        holding = app.start("api-hold")
        try:
            browser.get(f"{base}/executions/{holding.id}/cancel")
            browser.find_element(By.ID, "confirm-cancel").click()
            eventually(browser, lambda d: "read-only session" in d.find_element(By.TAG_NAME, "main").text)
            assert app.status(holding.id).status == "running"
        finally:
            api_app.RELEASE.set()


def test_database_passwords_are_masked_in_messages(tmp_path: Path) -> None:
    for url in ("postgresql://bob:s3cretpw@db.example:5432/app",
                "postgres://bob:s3cretpw@[::1/none", "host=db port=5432 password=s3cretpw",
                "host=db password='s3cret pw' user=bob"):
        assert "s3cret" not in describe_url(url), url
        assert "s3cret" not in mask_password(f"cannot parse {url!r}: bad"), url
        assert "s3cret" not in str(DatabaseUnavailable(f"in URI: \"{url}\"")), url
    assert mask_password("postgresql://bob@db/app") == "postgresql://bob@db/app"  # no password
    env = {k: v for k, v in os.environ.items() if k != "KONDUIT_DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run([sys.executable, "-m", "konduit.cli", "list", "--database-url",
                           "postgresql://bob:s3cretpw@[::1/none"], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1 and "cannot connect" in done.stderr, done
    assert "s3cretpw" not in done.stdout + done.stderr and "bob:***@" in done.stderr
