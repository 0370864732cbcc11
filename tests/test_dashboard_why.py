"""The dashboard says why, in a real browser: a waiting step's event, key and deadline with a
"send event" pre-filled from them, distinct (and copyable) ids, the start form with its error
inline, "retry now" on a task in backoff, the schedules page with pause/resume, the queue page
and the workers page, live workers first. Screenshots go to the browser tests' artifacts."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

import konduit
from konduit.core.ids import short_id
from konduit.web import create_app, database_client
from tests.support.browser import csp_violations, css, eventually, screenshot, serving
from tests.support.workers import running_worker
from tests.test_cli import konduit_cli
from tests.test_waits_events import review_workflow, wait_status

pytestmark = pytest.mark.storage
FAST = {"poll_interval": 0.05, "maintenance_interval": 0.3}


def text(browser: WebDriver, selector: str) -> str:
    return browser.find_element(By.CSS_SELECTOR, selector).text


def shows(browser: WebDriver, selector: str, needle: str) -> None:
    """Wait for the page a click led to (the old one may still be read in between)."""
    eventually(browser, lambda d: needle in text(d, selector))


def test_a_waiting_step_says_what_it_waits_for_and_takes_its_event(
        make_app: Callable[..., konduit.App], db_url: str, browser: WebDriver) -> None:
    app = make_app(review_workflow(deadline="10m"))
    with running_worker(app, **FAST), \
            serving(create_app(database_client(db_url, app), app)) as base:
        handles = [app.start("review-flow", input={"episode": n}) for n in (11, 12, 13)]
        for h in handles:
            wait_status(db_url, h.id, "review", "waiting")

        # konduit status uses the same words: review waits, publish is pending (not reached).
        shown_status = konduit_cli("status", short_id(handles[0].id), "--database-url", db_url)
        assert shown_status.returncode == 0, shown_status.stderr
        words = {line.split()[0]: line.split()[1] for line in shown_status.stdout.splitlines()
                 if line.split() and line.split()[0] in ("translate", "review", "publish")}
        assert words == {"translate": "succeeded", "review": "waiting", "publish": "pending"}

        # Distinct ids: started within the same minute, their first 8 characters are the same
        # (they change every 65.5 s: at most two values, even across such a boundary).
        assert len({str(h.id)[:8] for h in handles}) <= 2
        browser.get(f"{base}/")
        shown = {a.get_attribute("title"): a.text for a in css(browser, "#executions a.short-id")}
        assert shown == {str(h.id): "…" + short_id(h.id) for h in handles}
        assert len(set(shown.values())) == 3
        # The copy button shows the whole id selected (and copies it where there is a clipboard).
        row = browser.find_element(By.CSS_SELECTOR, f"#executions tr[data-id='{handles[0].id}']")
        row.find_element(By.CSS_SELECTOR, "button.copy").click()
        full = row.find_element(By.CSS_SELECTOR, ".id-full")
        eventually(browser, lambda d: full.is_displayed() and full.text == str(handles[0].id))
        assert browser.execute_script("return window.getSelection().toString()") == str(handles[0].id)
        screenshot(browser, "why-distinct-ids")

        # The waiting step: its event, key and deadline; the step after it is pending.
        first = handles[0]
        browser.get(f"{base}/executions/{short_id(first.id)}")  # a tail names it too
        assert browser.title.startswith(f"review-flow …{short_id(first.id)}")
        why = browser.find_element(By.CSS_SELECTOR, "#steps tr[data-step='review'] .why-item")
        assert why.get_attribute("data-word") == "waiting"
        assert why.find_element(By.CSS_SELECTOR, ".wait-event").text == "translation-approved"
        assert why.find_element(By.CSS_SELECTOR, ".wait-key").text == "episode-11"
        assert "deadline" in why.find_element(By.CSS_SELECTOR, ".wait-deadline").text
        # 10 minutes from a moment ago: 9m59s, or 10m00s as rounded when the page is quick.
        assert re.search(r"in (9m|10m00s)", why.find_element(By.CSS_SELECTOR,
                                                               ".wait-deadline").text)
        assert text(browser, "#steps tr[data-step='review'] .badge") == "waiting"
        assert text(browser, "#steps tr[data-step='publish'] .badge") == "pending"
        assert text(browser, "#steps tr[data-step='translate'] .badge") == "succeeded"
        [bar] = css(browser, "#gantt g.wait[data-step='review']")
        assert bar.get_attribute("data-waiting") == "true" and bar.get_attribute("data-kind") == "event"
        # The live update keeps the words (a poll must not turn "pending" back into "waiting").
        browser.execute_script("window.__marker = 1;")
        eventually(browser, lambda d: d.execute_script(
            "return document.querySelector('#dag g.node[data-step=\"publish\"]')"
            ".getAttribute('data-status')") == "pending")
        screenshot(browser, "why-waiting-step")

        # Send event, pre-filled with the name and key; a payload that is not JSON is said inline.
        why.find_element(By.CSS_SELECTOR, "a.send-event").click()
        eventually(browser, lambda d: d.find_element(By.ID, "event-name"))
        assert browser.find_element(By.ID, "event-name").get_attribute("value") == "translation-approved"
        assert browser.find_element(By.ID, "event-key").get_attribute("value") == "episode-11"
        browser.find_element(By.ID, "event-payload").send_keys('{"de": ')
        browser.find_element(By.ID, "send-event-submit").click()
        shows(browser, "#send-event-problem", "payload is not JSON")
        assert browser.find_element(By.ID, "event-payload").get_attribute("value") == '{"de": '
        payload = browser.find_element(By.ID, "event-payload")
        payload.clear()
        payload.send_keys('{"de": "menschlich"}')
        screenshot(browser, "why-send-event")
        browser.find_element(By.ID, "send-event-submit").click()
        shows(browser, "#flash", "woke")
        assert first.wait(30).output == {"text": {"de": "menschlich"}, "outcome": "succeeded"}
        others = [app.status(h.id).status for h in handles[1:]]
        assert others == ["running", "running"]  # the event went to episode 11 only

        # The start form: input that is not JSON, then an unknown version, then a start.
        browser.get(f"{base}/start")
        Select(browser.find_element(By.ID, "start-workflow")).select_by_visible_text("review-flow")
        browser.find_element(By.ID, "start-input").send_keys("{episode: 14}")
        browser.find_element(By.ID, "start-submit").click()
        shows(browser, "#start-problem", "input is not JSON")
        box = browser.find_element(By.ID, "start-input")
        assert box.get_attribute("value") == "{episode: 14}"  # nothing typed is lost
        box.clear()
        box.send_keys('{"episode": 14}')
        browser.find_element(By.ID, "start-version").send_keys("7")
        browser.find_element(By.ID, "start-submit").click()
        shows(browser, "#start-problem", "version 7")
        screenshot(browser, "why-start-form-error")
        browser.find_element(By.ID, "start-version").clear()
        browser.find_element(By.ID, "start-submit").click()
        shows(browser, "#flash", "started")
        started = browser.find_element(By.ID, "execution-id").text
        wait_status(db_url, app.status(started).id, "review", "waiting")
        assert app.status(started).workflow == "review-flow"
        assert csp_violations(browser) == []


ATTEMPTS: list[int] = []


def flaky_and_scheduled() -> konduit.Workflow:
    wf = konduit.Workflow("flaky-nightly", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base="10m", cap="10m",
                                   jitter=False))
    def fetch(ctx: konduit.Context) -> str:
        ATTEMPTS.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("the feed answered 503")
        return "fetched"

    wf.schedule(cron="0 3 * * *", name="nightly-fetch")
    return wf


def test_retry_now_schedules_queues_and_workers(make_app: Callable[..., konduit.App], db_url: str,
                                                browser: WebDriver) -> None:
    app = make_app(flaky_and_scheduled())
    unserved = konduit.Workflow("nobody-serves", version=1)

    @unserved.step()
    def idle(ctx: konduit.Context) -> None:
        return None

    other = make_app(unserved)
    with running_worker(app, **FAST), \
            serving(create_app(database_client(db_url, app), app)) as base:
        handle = app.start("flaky-nightly")
        eventually(browser, lambda d: ATTEMPTS == [1], timeout=30)
        wait_status(db_url, handle.id, "fetch", "ready")

        # Retry now: the step waits out a 10-minute backoff; the button makes it ready now.
        browser.get(f"{base}/executions/{handle.id}")
        why = browser.find_element(By.CSS_SELECTOR, "#steps tr[data-step='fetch'] .why-item")
        assert why.get_attribute("data-word") == "retrying"
        assert "next try" in why.text and re.search(r"in (9m|10m00s)", why.text)
        assert text(browser, "#steps tr[data-step='fetch'] .badge") == "retrying"
        screenshot(browser, "why-retrying")
        why.find_element(By.CSS_SELECTOR, "button.retry-now").click()
        shows(browser, "#flash", "retrying now")
        assert handle.wait(30).output == "fetched"
        assert ATTEMPTS == [1, 2]
        # Retrying a task that is no longer in backoff changes nothing and says so.
        [task] = [t for t in app.tasks(handle.id) if t.step == "fetch"]
        client_said = app.retry_now(handle.id, task.id)
        assert client_said is False

        # The schedules page: next tick, last tick, pause and resume.
        browser.get(f"{base}/schedules")
        row = browser.find_element(By.CSS_SELECTOR, "#schedules tr[data-schedule='nightly-fetch']")
        assert row.get_attribute("data-paused") == "false"
        assert "flaky-nightly v1" in row.text and "03:00:00" in row.text
        row.find_element(By.CSS_SELECTOR, "button.pause").click()
        shows(browser, "#flash", "nightly-fetch: paused")
        row = browser.find_element(By.CSS_SELECTOR, "#schedules tr[data-schedule='nightly-fetch']")
        assert row.get_attribute("data-paused") == "true" and "(paused)" in row.text
        assert [s.paused for s in app.schedules()] == [True]
        screenshot(browser, "why-schedules-paused")
        row.find_element(By.CSS_SELECTOR, "button.resume").click()
        shows(browser, "#flash", "nightly-fetch: resumed")
        assert [s.paused for s in app.schedules()] == [False]

        # The queue page: a workflow nobody serves piles up, with its oldest-ready age.
        other.start("nobody-serves")
        other.start("nobody-serves")
        browser.get(f"{base}/queues")
        row = browser.find_element(By.CSS_SELECTOR, "#queue-loads tr[data-workflow='nobody-serves@1']")
        assert row.find_element(By.CSS_SELECTOR, ".ready").text == "2"
        assert row.find_element(By.CSS_SELECTOR, ".running").text == "0"
        assert row.find_element(By.CSS_SELECTOR, ".oldest").text not in ("", "—")
        screenshot(browser, "why-queues")

        # The workers page: the live worker first.
        browser.get(f"{base}/workers")
        states = [r.get_attribute("data-state") for r in css(browser, "#workers tr[data-worker]")]
        assert states and states[0] == "alive"
        assert csp_violations(browser) == []


GO = threading.Event()


def gated() -> konduit.Workflow:
    wf = konduit.Workflow("gated-render", version=1)

    @wf.step()
    def render(ctx: konduit.Context) -> str:
        if ctx.input.get("hold"):
            GO.wait(30)
        return "rendered"

    return wf


def test_a_running_step_shows_its_worker_heartbeat_attempt_and_usual_p95(
        make_app: Callable[..., konduit.App], db_url: str, browser: WebDriver) -> None:
    GO.clear()
    app = make_app(gated())
    with running_worker(app, **FAST), \
            serving(create_app(database_client(db_url, app), app)) as base:
        for _ in range(3):  # a history, for the step's usual p95
            assert app.start("gated-render", input={}).wait(30).output == "rendered"
        held = app.start("gated-render", input={"hold": True})
        wait_status(db_url, held.id, "render", "running")
        try:
            browser.get(f"{base}/executions/{held.id}")
            why = browser.find_element(By.CSS_SELECTOR, "#steps tr[data-step='render'] .why-item")
            assert why.get_attribute("data-word") == "running"
            assert why.find_element(By.CSS_SELECTOR, ".attempt").text == "1/3"
            assert ":" in why.find_element(By.CSS_SELECTOR, ".worker").text  # host:pid
            assert why.find_element(By.CSS_SELECTOR, ".heartbeat-age").text.endswith("ago")
            assert why.find_element(By.CSS_SELECTOR, ".elapsed").text
            assert "usually p95" in why.find_element(By.CSS_SELECTOR, ".usual-p95").text
            assert text(browser, "#steps tr[data-step='render'] .badge") == "running"
            screenshot(browser, "why-running-step")
        finally:
            GO.set()
        assert held.wait(30).output == "rendered"
