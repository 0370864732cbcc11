"""The pages of a version change (real browser): an execution whose version no live worker
serves says so, and is marked in the list; its tasks show the policy they were created with."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

import konduit
from konduit.web import create_app, database_client
from tests.support.browser import csp_violations, css, screenshot, serving
from tests.support.workers import running_worker
from tests.test_versions import _policy


@pytest.mark.storage
def test_unserved_banner_list_mark_and_task_policies(
        make_app: Callable[..., konduit.App], db_url: str, browser: WebDriver) -> None:
    old = make_app(_policy(2))
    waiting = old.start("pol", {"fail": False})
    with serving(create_app(database_client(db_url, None), None)) as base:
        browser.get(f"{base}/executions/{waiting.id}")
        (banner,) = css(browser, "#unserved")
        assert "no live worker serves pol version 1" in banner.text
        assert "1 running execution of this version" in banner.text
        screenshot(browser, "versions-unserved")
        browser.get(f"{base}/")
        (mark,) = css(browser, f'tr[data-id="{waiting.id}"] .unserved')
        assert mark.text == "unserved: v1"
        assert csp_violations(browser) == []

        new = make_app(_policy(5))  # a policy-only change: the same version, revision 2
        with running_worker(new, concurrency=2):
            new.wait(waiting.id, timeout=60)
        browser.get(f"{base}/executions/{waiting.id}")
        assert css(browser, "#unserved") == []
        rows = [(r.get_attribute("data-step"), r.get_attribute("data-revision"),
                 r.find_element("css selector", ".max-tries").text)
                for r in css(browser, "#task-policies tr[data-step]")]
        assert rows == [("a", "1", "2"), ("b", "2", "5")]
        screenshot(browser, "versions-task-policies")
        browser.get(f"{base}/")
        assert css(browser, ".unserved") == []
        assert csp_violations(browser) == []
