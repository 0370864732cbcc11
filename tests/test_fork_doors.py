"""Fork at every door: ``POST /api/v1/executions/{id}/fork`` (201; 404, 409, 422 naming the
field), ``konduit fork ID --from-step S [--input JSON]``, and the execution page's "Fork…"
form in a real browser behind a login (CSRF token), with the link shown on both pages."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

import konduit
from tests.support.browser import browser, eventually, screenshot
from tests.support.db import rows
from tests.support.workers import running_worker
from tests.test_api_v1 import api, refused
from tests.test_cli_faces import assert_clean_error, konduit_cli
from tests.test_fork import _diamond
from tests.test_redrive_page import flash, login
from tests.test_web_security import OP, guarded

__all__ = ["browser"]

pytestmark = [pytest.mark.storage]


def _origin(app: konduit.App, calls: dict[str, int], broken: dict[str, bool]) -> str:
    h = app.start("forkable", input={"n": 1})
    with running_worker(app, concurrency=4), pytest.raises(konduit.ExecutionFailed):
        h.wait(timeout=30)
    broken["a"] = False
    calls.clear()
    return str(h.id)


def test_fork_over_http(make_app: Callable[..., konduit.App], db_url: str) -> None:
    calls: dict[str, int] = {}
    broken = {"a": True}
    app = make_app(_diamond(calls, broken))
    origin = _origin(app, calls, broken)
    with api(None, db_url) as http:  # no code: the registered definition
        done = http.post(f"/api/v1/executions/{origin[-12:]}/fork",
                         json={"from_step": "a", "input": {"n": 2}})
        assert done.status_code == 201, done.text
        body = done.json()
        assert (body["forked_from"], body["from_step"], body["status"]) == (origin, "a",
                                                                            "running")
        assert body["id"] != origin
        body = refused(http.post(f"/api/v1/executions/{origin}/fork",
                                 json={"from_step": "join"}), 409)
        assert body["code"] == "not_forkable" and "'a' is failed" in body["detail"]
        body = refused(http.post(f"/api/v1/executions/{origin}/fork",
                                 json={"from_step": "nope"}), 422)
        assert body["field"] == "body.from_step" and "'nope'" in body["detail"]
        refused(http.post(f"/api/v1/executions/{origin}/fork", json={}), 422)
        refused(http.post("/api/v1/executions/0190abcd-0000-7000-8000-000000000000/fork",
                          json={"from_step": "a"}), 404)
    with running_worker(app, concurrency=4):
        assert app.wait(body_id := done.json()["id"], timeout=30).output == {"a": 21, "b": 2}
    assert calls == {"a": 1, "b": 1, "join": 1}
    assert rows(db_url, "SELECT forked_from::text, forked_at_step FROM konduit_executions "
                "WHERE id = %s", body_id) == [(origin, "a")]


def test_fork_from_the_command_line(make_app: Callable[..., konduit.App], db_url: str) -> None:
    calls: dict[str, int] = {}
    broken = {"a": True}
    app = make_app(_diamond(calls, broken))
    origin = _origin(app, calls, broken)
    proc = konduit_cli("fork", origin[-12:], "--from-step", "a", "--input", '{"n": 3}',
                       "--json", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    assert (said["forked_from"], said["from_step"]) == (origin, "a")
    with running_worker(app, concurrency=4):
        assert app.wait(said["id"], timeout=30).output == {"a": 31, "b": 2}
    assert calls == {"a": 1, "b": 1, "join": 1}
    refused_ = konduit_cli("fork", origin, "--from-step", "join", "--database-url", db_url)
    assert_clean_error(refused_, "cannot fork from step 'join'", "'a' is failed")
    unknown = konduit_cli("fork", origin, "--from-step", "nope", "--database-url", db_url)
    assert_clean_error(unknown, "no step 'nope' to fork from")


def test_fork_in_a_browser(make_app: Callable[..., konduit.App], db_url: str,
                           browser: WebDriver) -> None:
    calls: dict[str, int] = {}
    broken = {"a": True}
    app = make_app(_diamond(calls, broken))
    origin = _origin(app, calls, broken)
    with guarded(app, db_url) as (base, _):
        login(browser, base, OP)
        target = f"{base}/executions/{origin}"
        browser.get(target)
        browser.find_element(By.ID, "fork").click()
        eventually(browser, lambda d: d.current_url == f"{target}/fork")
        # The form: the origin's steps, its input prefilled.
        assert json.loads(browser.find_element(By.ID, "fork-input").get_attribute("value")
                          or "null") == {"n": 1}
        Select(browser.find_element(By.ID, "from_step")).select_by_value("join")
        browser.find_element(By.ID, "confirm-fork").click()  # a is failed: refused, said why
        eventually(browser, lambda d: "'a' is failed" in d.find_element(By.ID, "refusal").text)
        Select(browser.find_element(By.ID, "from_step")).select_by_value("a")
        box = browser.find_element(By.ID, "fork-input")
        box.clear()
        box.send_keys('{"n": 4}')
        screenshot(browser, "fork-form")
        browser.find_element(By.ID, "confirm-fork").click()
        eventually(browser, lambda d: f"forked from {origin} at step a" in flash(d))
        forked = browser.current_url.split("/executions/")[1].split("?")[0]
        assert forked != origin
        assert origin in browser.find_element(By.ID, "forked-from").text
        assert "at step a" in browser.find_element(By.ID, "forked-from").text
        with running_worker(app, concurrency=4):
            assert app.wait(forked, timeout=30).output == {"a": 41, "b": 2}
        browser.get(target)
        [link] = browser.find_elements(By.CSS_SELECTOR, "td.fork")
        assert forked in link.text and "at step a" in link.text
        screenshot(browser, "fork-origin")
    assert calls == {"a": 1, "b": 1, "join": 1}
