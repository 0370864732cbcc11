"""The operator pages of the dashboard in a real browser: live step states without a reload,
cancel and repair behind a confirmation page, the workers page (alive, dead, stopped, slots,
abandoned threads), the queue strip, a 200-item map step collapsed to one row, paging that keeps
its filters, and a hostile step error shown as text.

A real worker runs the workflows on a real database; the dashboard is served by uvicorn and
driven by headless Chromium. Every page visited is kept as a screenshot (tests/browser_support.py).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

import konduit
from konduit.db.queries import q
from konduit.web import create_app, database_client
from konduit.web.summaries import BadCursor, decode_cursor, encode_cursor, map_summaries, rerun_steps
from tests.support.browser import csp_violations, css, eventually, screenshot, serving, strict_csp
from tests.support.workers import running_worker

XSS = "<img src=x onerror=alert(1)> </script><script>alert(2)</script>"
FIRST_GO = threading.Event()  # `first` of ops-gate runs until this is set
GATE = threading.Event()  # `gated` of ops-gate runs until this is set (or 30 s)
HEALED = threading.Event()  # `flaky` of ops-repair fails until this is set


def gate() -> konduit.Workflow:
    wf = konduit.Workflow("ops-gate", version=1)

    @wf.step()
    def first(ctx: konduit.Context) -> str:
        FIRST_GO.wait(30)
        return "first"

    @wf.step(after=[first])
    def gated(ctx: konduit.Context) -> str:
        GATE.wait(30)
        return "gated"

    @wf.step(after=[gated])
    def last(ctx: konduit.Context) -> str:
        return "last"

    return wf


def mapped() -> konduit.Workflow:
    wf = konduit.Workflow("ops-map", version=1)

    @wf.step()
    def numbers(ctx: konduit.Context) -> list[int]:
        return list(range(200))

    @wf.map(after=[numbers], over=lambda out: out)
    def square(ctx: konduit.Context) -> int:
        return int(ctx.item) ** 2

    @wf.step(after=[square])
    def total(ctx: konduit.Context) -> int:
        return sum(ctx.upstream["square"])

    return wf


def hostile() -> konduit.Workflow:
    wf = konduit.Workflow("ops-xss", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base="10ms", jitter=False))
    def boom(ctx: konduit.Context) -> str:
        raise RuntimeError(XSS)

    return wf


def repairable() -> konduit.Workflow:
    wf = konduit.Workflow("ops-repair", version=1)

    @wf.step()
    def begin(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[begin])
    def fine(ctx: konduit.Context) -> str:
        return "fine"

    @wf.step(after=[begin], retry=konduit.Retry(max_attempts=1))
    def flaky(ctx: konduit.Context) -> str:
        if not HEALED.is_set():
            raise RuntimeError("image service exploded")
        return "image"

    @wf.step(after=[fine, flaky], join=konduit.Join.all_done())
    def publish(ctx: konduit.Context) -> list[str]:
        return sorted(ctx.upstream)

    return wf


def unserved() -> konduit.Workflow:
    """Registered by an App no worker runs: its task waits in the queue."""
    wf = konduit.Workflow("ops-unserved", version=1)

    @wf.step()
    def wait(ctx: konduit.Context) -> None:
        return None

    return wf


def node_status(driver: WebDriver, step: str) -> str | None:
    return driver.find_element(By.CSS_SELECTOR, f"#dag g.node[data-step='{step}']").get_attribute(
        "data-status")


def no_alert(driver: WebDriver) -> bool:
    try:
        driver.switch_to.alert  # noqa: B018 - raises when there is none
    except NoAlertPresentException:
        return True
    return False


def test_cursors_map_summaries_and_the_repair_plan_shown() -> None:
    at = datetime(2026, 12, 1, 5, 0, 0, 123456, tzinfo=UTC)
    assert decode_cursor(encode_cursor(at, 42)) == (at, "42")
    for bad in ("not-a-cursor", encode_cursor(at, "")[:-4], "", "%%%"):
        with pytest.raises(BadCursor, match="start again from the first page"):
            decode_cursor(bad)
    row = {"step": "square", "tasks": 3, "tries": 4, "ready": 0, "running": 1, "succeeded": 1,
           "degraded": 0, "failed": 1, "timed_out": 0, "cancelled": 0, "skipped": 0,
           "first_started_at": at, "last_finished_at": at, "p50": 0.5, "p95": 0.9, "longest": 1.0}
    summaries = map_summaries([row | {"generation": 1, "failed": 3, "running": 0, "succeeded": 0},
                               row | {"generation": 2}])
    square = summaries["square"]
    assert square.generation == 2 and square.counts == {"running": 1, "succeeded": 1, "failed": 1}
    assert square.finished == 2 and square.to_json()["max"] == 1.0
    spec = [{"name": "a", "after": []}, {"name": "b", "after": ["a"]}, {"name": "c", "after": ["a"]},
            {"name": "d", "after": ["b", "c"]}]
    assert rerun_steps(spec, {"a": "succeeded", "b": "degraded", "c": "succeeded"}) == ["b", "d"]
    assert rerun_steps(spec, {s["name"]: "succeeded" for s in spec}) == []


def test_every_form_carries_the_csrf_token_and_no_page_inline_script_or_style() -> None:
    templates = Path(konduit.__file__).parent / "web" / "templates"
    for path in templates.glob("*.html"):
        text = path.read_text()
        forms = re.findall(r"<form\b.*?</form>", text, re.S)
        for form in forms:
            assert 'name="csrf_token" value="{{ csrf_token|default(\'\') }}"' in form, path.name
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), f"{path.name}: inline script"
        assert not re.search(r"\son[a-z]+\s*=", text), f"{path.name}: inline event handler"
        assert "style=" not in text and "<style" not in text, f"{path.name}: inline style"


@pytest.mark.storage
def test_live_states_cancel_and_workers(make_app: Callable[..., konduit.App], db_url: str,
                                        browser: WebDriver, tmp_path: Path) -> None:
    FIRST_GO.clear()
    GATE.clear()
    app = make_app(gate())
    waiting = make_app(unserved())
    # A worker that died without stopping: registered with a 1 s lease and then silent.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(q("worker_register"), {
            "id": "ghost-worker", "hostname": "ghost-host", "pid": 4242, "concurrency": 4,
            "queues": ["default"], "workflows": ["ops-gate@1"], "isolation": "thread",
            "lease_seconds": 1.0})
        conn.execute(q("worker_heartbeat"), {"id": "ghost-worker", "running": 1, "abandoned": 2,
                                            "leader": None})
    try:
        with running_worker(app, poll_interval=0.05), \
                serving(strict_csp(create_app(database_client(db_url, app), app))) as base:
            queued = waiting.start("ops-unserved")
            handle = app.start("ops-gate", input={"episode": 42, "title": "<b>bold</b>"})

            # The execution page while `first` runs: its input, and the DAG updated in place.
            browser.get(f"{base}/executions/{handle.id}")
            eventually(browser, lambda d: node_status(d, "first") == "running")
            assert browser.find_element(By.ID, "status").text == "running"
            shown_input = browser.find_element(By.ID, "input").text
            assert '"episode": 42' in shown_input and '"<b>bold</b>"' in shown_input
            browser.execute_script("window.__konduitMarker = 'before';")
            FIRST_GO.set()
            eventually(browser, lambda d: node_status(d, "first") == "succeeded"
                       and node_status(d, "gated") == "running")
            # The same document: no reload happened (the marker would be gone).
            assert browser.execute_script("return window.__konduitMarker") == "before"
            row = browser.find_element(By.CSS_SELECTOR, "#steps tr[data-step='first'] .badge")
            assert row.text == "succeeded"
            screenshot(browser, "ops-execution-running")

            # The workers page: this worker alive with one slot busy on `gated`; the ghost dead.
            browser.find_element(By.LINK_TEXT, "Workers").click()
            eventually(browser, lambda d: d.current_url == f"{base}/workers")
            eventually(browser, lambda d: len(css(d, "#workers tr[data-state='alive']")) == 1)
            # Slots in use come with the worker's heartbeat, every few seconds: updated live.
            eventually(browser, lambda d: d.find_element(
                By.CSS_SELECTOR, "#workers tr[data-state='alive'] .slots").text == "1/8")
            [alive] = css(browser, "#workers tr[data-state='alive']")
            alive.find_element(By.TAG_NAME, "summary").click()
            assert "gated" in alive.find_element(By.CSS_SELECTOR, "ul.attempts").text
            [ghost] = css(browser, "#workers tr[data-worker='ghost-worker']")
            eventually(browser, lambda d: d.find_element(
                By.CSS_SELECTOR, "#workers tr[data-worker='ghost-worker'] .state").text == "dead")
            ghost = browser.find_element(By.CSS_SELECTOR, "#workers tr[data-worker='ghost-worker']")
            assert ghost.find_element(By.CSS_SELECTOR, ".abandoned").text == "2"
            assert "ghost-host" in ghost.text
            screenshot(browser, "ops-workers")

            # The queue strip: the unserved workflow's task waits, and says for how long.
            browser.get(base + "/")
            [queue] = css(browser, "#queues tr[data-workflow='ops-unserved']")
            cells = [c.text for c in queue.find_elements(By.TAG_NAME, "td")]
            assert cells[:4] == ["default", "ops-unserved", "1", "1"] and cells[4].endswith("s")
            assert browser.find_element(By.ID, "strip-running").text == "2"
            screenshot(browser, "ops-executions")

            # Cancel: the button leads to a confirmation; going back changes nothing.
            browser.get(f"{base}/executions/{handle.id}")
            browser.find_element(By.ID, "cancel").click()
            eventually(browser, lambda d: d.current_url == f"{base}/executions/{handle.id}/cancel")
            assert str(handle.id) in browser.find_element(By.ID, "question").text
            assert browser.find_element(By.NAME, "csrf_token").get_attribute("type") == "hidden"
            screenshot(browser, "ops-confirm-cancel")
            browser.find_element(By.ID, "keep").click()
            eventually(browser, lambda d: d.current_url == f"{base}/executions/{handle.id}")
            assert app.status(handle.id).status == "running"
            # A POST without the confirmation acts on nothing either.
            with httpx.Client(base_url=base) as http:
                bare = http.post(f"/executions/{handle.id}/cancel")
                assert bare.status_code == 303
                assert bare.headers["location"] == f"/executions/{handle.id}/cancel"
            assert app.status(handle.id).status == "running"
            browser.find_element(By.ID, "cancel").click()
            browser.find_element(By.ID, "confirm-cancel").click()
            eventually(browser, lambda d: "cancelled" in d.find_element(By.ID, "flash").text)
            assert browser.find_element(By.ID, "status").text == "cancelled"
            assert app.status(handle.id).status == "cancelled"
            assert not css(browser, "#cancel")  # nothing left to cancel
            screenshot(browser, "ops-execution-cancelled")
            assert csp_violations(browser) == []  # live.js and the styles run under the CSP
            GATE.set()  # the cancelled handler's thread may end now

            # The executions list updates its rows and the queue strip in place too.
            browser.get(base + "/")
            browser.execute_script("window.__konduitMarker = 'list';")
            assert waiting.cancel(queued.id)
            eventually(browser, lambda d: d.find_element(
                By.CSS_SELECTOR, f"#executions tr[data-id='{queued.id}'] .badge.status").text
                == "cancelled")
            eventually(browser, lambda d: not css(d, "#queues tr[data-workflow='ops-unserved']")
                       and d.find_element(By.ID, "queues-empty").is_displayed())
            assert browser.find_element(By.ID, "strip-running").text == "0"
            assert browser.execute_script("return window.__konduitMarker") == "list"
    finally:
        FIRST_GO.set()
        GATE.set()


@pytest.mark.storage
def test_maps_tracebacks_repair_and_paging(make_app: Callable[..., konduit.App], db_url: str,
                                           browser: WebDriver, tmp_path: Path) -> None:
    HEALED.clear()
    app = make_app(mapped(), hostile(), repairable())
    with running_worker(app, poll_interval=0.05), \
            serving(strict_csp(create_app(database_client(db_url, app), app))) as base:
        big = app.start("ops-map")
        bad = [app.start("ops-xss", idempotency_key=f"xss-{i}") for i in range(2)]
        fixable = app.start("ops-repair")
        assert big.wait(60).output == sum(i * i for i in range(200))
        for h in bad:
            with pytest.raises(konduit.ExecutionFailed):
                h.wait(20)
        assert fixable.wait(20).outcomes["flaky"] == "failed"

        # A 200-item map step is one row with its distribution, and one timeline row.
        browser.get(f"{base}/executions/{big.id}")
        [square] = css(browser, "#steps tr.map")
        assert square.get_attribute("data-step") == "square"
        assert square.get_attribute("data-items") == "200"
        assert square.find_element(By.CSS_SELECTOR, ".map-counts").text == "200 succeeded"
        assert "p50" in square.text and "p95" in square.text and "max" in square.text
        assert len(css(browser, "#steps tr[data-step]")) == 3
        assert len(css(browser, "#gantt rect.bar[data-step='square']")) == 1
        assert len(css(browser, "#gantt rect.bar")) == 3
        screenshot(browser, "ops-execution-map")
        # Its items, a page at a time.
        square.find_element(By.CSS_SELECTOR, "a.items-link").click()
        eventually(browser, lambda d: d.current_url == f"{base}/executions/{big.id}/steps/square")
        items = css(browser, "#items tr[data-index]")
        assert [i.get_attribute("data-index") for i in items] == [str(n) for n in range(100)]
        screenshot(browser, "ops-map-items")
        browser.find_element(By.ID, "next-page").click()
        items = css(browser, "#items tr[data-index]")
        assert [i.get_attribute("data-index") for i in items] == [str(n) for n in range(100, 200)]
        assert not css(browser, "#next-page")

        # A hostile error is text: visible in full, no element made of it, no alert.
        browser.get(f"{base}/executions/{bad[0].id}")
        tracebacks = css(browser, "#failures details.traceback")
        assert [t.get_attribute("data-attempt") for t in tracebacks] == ["1", "2"]
        tracebacks[0].find_element(By.TAG_NAME, "summary").click()
        full = tracebacks[0].find_element(By.TAG_NAME, "pre").text
        assert "Traceback (most recent call last)" in full and XSS in full
        assert "RuntimeError" in full and 'raise RuntimeError(XSS)' in full
        assert not css(browser, "main img") and no_alert(browser)
        scripts = [s.get_attribute("src") for s in css(browser, "script")]
        # only the dashboard's own scripts
        assert scripts == [f"{base}/static/live.js", f"{base}/static/copy.js",
                           f"{base}/static/streams.js"]
        screenshot(browser, "ops-execution-traceback")

        # Paging keeps the filters: two failed executions, one per page.
        browser.get(f"{base}/?status=failed&limit=1")
        first_page = [r.get_attribute("data-id") for r in css(browser, "#executions tr[data-id]")]
        href = browser.find_element(By.ID, "next-page").get_attribute("href") or ""
        assert "status=failed" in href and "limit=1" in href and "cursor=" in href
        browser.find_element(By.ID, "next-page").click()
        second_page = [r.get_attribute("data-id") for r in css(browser, "#executions tr[data-id]")]
        assert sorted(first_page + second_page) == sorted(str(h.id) for h in bad)
        assert not css(browser, "#next-page") and css(browser, "#first-page")
        screenshot(browser, "ops-executions-page-2")
        browser.get(f"{base}/?cursor=not-a-cursor")
        assert browser.find_element(By.ID, "problem").text == "Bad page cursor"
        browser.get(f"{base}/dead-letters?limit=2")
        seen = [r.get_attribute("data-execution") for r in css(browser, "#dead-letters tr[data-step]")]
        browser.find_element(By.ID, "next-page").click()
        seen += [r.get_attribute("data-execution") for r in css(browser, "#dead-letters tr[data-step]")]
        assert sorted(seen) == sorted([str(h.id) for h in bad] + [str(fixable.id)])
        assert not css(browser, "#next-page")

        # Repair: confirmation names the steps that run again; only the confirmed POST acts.
        browser.get(f"{base}/executions/{fixable.id}")
        browser.find_element(By.ID, "repair").click()
        eventually(browser, lambda d: d.current_url == f"{base}/executions/{fixable.id}/repair")
        assert [li.get_attribute("data-step") for li in css(browser, "#rerun li")] == ["flaky", "publish"]
        screenshot(browser, "ops-confirm-repair")
        browser.find_element(By.ID, "keep").click()
        eventually(browser, lambda d: d.current_url == f"{base}/executions/{fixable.id}")
        assert app.status(fixable.id).outcomes["flaky"] == "failed"
        HEALED.set()
        browser.find_element(By.ID, "repair").click()
        browser.find_element(By.ID, "confirm-repair").click()
        eventually(browser, lambda d: "re-running flaky, publish" in d.find_element(By.ID, "flash").text)
        eventually(browser, lambda d: d.find_element(By.ID, "status").text == "succeeded"
                   and node_status(d, "flaky") == "succeeded")
        assert app.status(fixable.id).outcomes["flaky"] == "succeeded"
        screenshot(browser, "ops-execution-repaired")

        for path, name in (("/alerts", "alerts"), ("/stats", "stats")):
            browser.get(base + path)
            screenshot(browser, f"ops-{name}")
        assert csp_violations(browser) == []


@pytest.mark.storage
def test_live_json_and_refusals_over_http(make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(hostile())
    with running_worker(app, poll_interval=0.05):
        handle = app.start("ops-xss")
        with pytest.raises(konduit.ExecutionFailed):
            handle.wait(20)
    with serving(create_app(database_client(db_url))) as base, httpx.Client(base_url=base) as http:
        live = http.get(f"/executions/{handle.id}/live.json").json()
        assert live["status"] == "failed" and live["finished"] is True
        assert live["steps"]["boom"]["status"] == "failed"
        # The list's script reads the API's page of the same rows, and the strip on its own.
        page = http.get("/").text
        assert 'data-live="/api/v1/executions?limit=50"' in page
        assert 'data-live-strip="/strip.json"' in page
        (listed,) = http.get("/api/v1/executions", params={"limit": 50}).json()["items"]
        assert (listed["id"], listed["status"]) == (str(handle.id), "failed")
        assert "<img src=x onerror=alert(1)>" in listed["error"]
        assert http.get("/strip.json").json()["running"] == 0
        assert http.get("/executions.json").status_code == 404  # the page's own shape is gone
        missing = http.get("/executions/00000000-0000-4000-8000-000000000000/live.json")
        assert missing.status_code == 404 and "no execution" in missing.json()["detail"]
        workers = http.get("/workers.json").json()
        assert [w["state"] for w in workers["workers"]] == ["stopped"]
        # Repair and cancel from another site's page are refused, and nothing changes.
        cross = http.post(f"/executions/{handle.id}/cancel", data={"confirm": "yes"},
                          headers={"origin": "http://evil.example"})
        assert cross.status_code == 403
        # The pages escape user text: the raw payload never appears in the HTML.
        page = http.get(f"/executions/{handle.id}").text
        assert XSS not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
        assert "<script>alert" not in page
        assert http.get("/static/live.js").headers["content-type"].startswith(
            ("application/javascript", "text/javascript"))
        assert http.get("/executions/00000000-0000-4000-8000-000000000000/steps/x").status_code == 404
        assert http.get(f"/executions/{handle.id}/steps/nothing-here").status_code == 404
