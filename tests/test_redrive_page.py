"""Redrive on the dashboard, in a real browser behind a login (CSRF token, origin check): the
execution page's Redrive button and its confirmation, the generation the page shows after it,
and the executions list's multi-select, whose confirmation says how many executions it will
touch (the selected ones, or every execution the search finds)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

import konduit
from tests.support.browser import browser, eventually, screenshot
from tests.support.workers import running_worker
from tests.test_bulk import payments, start_failed
from tests.test_web_security import OP, RO, guarded

__all__ = ["browser"]

pytestmark = [pytest.mark.storage]


def login(driver: WebDriver, base: str, token: str) -> None:
    driver.get(f"{base}/")
    eventually(driver, lambda d: d.current_url.startswith(f"{base}/login"))
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    eventually(driver, lambda d: "/login" not in d.current_url)


def flash(driver: WebDriver) -> str:
    found = driver.find_elements(By.ID, "flash")
    return found[0].text if found else ""


def test_redrive_one_and_many_in_a_browser(make_app: Callable[..., konduit.App], db_url: str,
                                           browser: WebDriver) -> None:
    healthy = {"on": False}
    app = make_app(payments(healthy))
    one = app.start("bulk-pay", {"n": 1}).id
    with running_worker(app, concurrency=4), pytest.raises(konduit.ExecutionFailed):
        app.wait(one, timeout=30)
    cohort = start_failed(app, 20, {"cohort": "p1"})
    healthy["on"] = True
    with guarded(app, db_url) as (base, _):
        login(browser, base, OP)
        # One execution: the button, its confirmation (the steps that run again), the POST.
        target = f"{base}/executions/{one}"
        browser.get(target)
        assert not browser.find_elements(By.ID, "generation")  # the first run
        browser.find_element(By.ID, "redrive").click()
        eventually(browser, lambda d: d.current_url == f"{target}/redrive")
        steps = [e.get_attribute("data-step") for e in
                 browser.find_elements(By.CSS_SELECTOR, "#rerun li")]
        assert steps == ["charge", "notify"]
        screenshot(browser, "redrive-confirm")
        browser.find_element(By.ID, "confirm-redrive").click()
        eventually(browser, lambda d: "redrive started: re-running charge, notify" in flash(d))
        with running_worker(app, concurrency=4):
            assert app.wait(one, timeout=30).status == "succeeded"
        browser.get(target)
        assert browser.find_element(By.ID, "generation").text.startswith("2 ")
        screenshot(browser, "redrive-generation")
        # Started with no worker running: they stay running.
        running = [app.start("bulk-pay", {"n": i}, tags={"cohort": "p1"}).id for i in range(2)]

        # Several picked on the list: the confirmation counts those the action applies to.
        browser.get(f"{base}/?tag=cohort%3Dp1")
        picked = [str(e) for e in cohort[:3]] + [str(running[0])]
        for eid in picked:
            browser.find_element(By.CSS_SELECTOR, f"input.pick[value='{eid}']").click()
        browser.find_element(By.ID, "bulk-redrive").click()
        eventually(browser, lambda d: "/bulk?" in d.current_url)
        assert browser.find_element(By.ID, "question").text == "Redrive 3 executions?"
        assert browser.find_element(By.ID, "confirm").get_attribute("data-count") == "3"
        assert "1 running" in browser.find_element(By.CSS_SELECTOR, ".skipped").text
        screenshot(browser, "redrive-bulk-picked")
        browser.find_element(By.ID, "confirm-bulk").click()
        eventually(browser, lambda d: "redriven 3 of 4 execution(s); skipped 1 (not_redrivable)"
                   in flash(d))
        assert {app.status(e).status for e in cohort[:3]} == {"running"}

        # Every execution the search finds: the count comes from a dry run of the same filter.
        browser.get(f"{base}/?status=failed&tag=cohort%3Dp1")
        browser.find_element(By.ID, "scope-all").click()
        browser.find_element(By.ID, "bulk-redrive").click()
        eventually(browser, lambda d: "/bulk?" in d.current_url)
        assert browser.find_element(By.ID, "question").text == "Redrive 17 executions?"
        assert "status=failed" in browser.find_element(By.ID, "scope").text
        screenshot(browser, "redrive-bulk-search")
        assert {app.status(e).status for e in cohort[3:]} == {"failed"}  # nothing yet
        browser.find_element(By.ID, "confirm-bulk").click()
        eventually(browser, lambda d: "redriven 17 of 17 execution(s)" in flash(d))
        assert {app.status(e).status for e in cohort} == {"running"}
        # Nothing left to redrive: the confirmation refuses, and says why.
        browser.get(f"{base}/bulk?action=redrive&scope=all&status=failed&tag=cohort%3Dp1")
        assert "None of the 0 execution(s)" in browser.find_element(By.ID, "refusal").text

        # A read-only session is refused the bulk POST; nothing is cancelled.
        browser.delete_all_cookies()
        login(browser, base, RO)
        browser.get(f"{base}/bulk?action=cancel&pick={running[1]}")
        assert browser.find_element(By.ID, "question").text == "Cancel 1 execution?"
        browser.find_element(By.ID, "confirm-bulk").click()
        eventually(browser, lambda d: "read-only session" in d.find_element(By.TAG_NAME,
                                                                             "main").text)
        assert app.status(running[1]).status == "running"
