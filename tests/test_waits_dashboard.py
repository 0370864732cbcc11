"""The execution page links a parent and its child workflow both ways (real browser)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

import konduit
from konduit.web import create_app, database_client
from tests.apps import waits_app
from tests.support.browser import csp_violations, css, screenshot, serving
from tests.support.workers import running_worker


@pytest.mark.storage
def test_parent_and_child_link_to_each_other(make_app: Callable[..., konduit.App], db_url: str,
                                            browser: WebDriver) -> None:
    app = make_app(waits_app.timer, waits_app.child, waits_app.parent)
    with running_worker(app, poll_interval=0.05, maintenance_interval=0.3), \
            serving(create_app(database_client(db_url, app), app)) as base:
        parent = app.start("gallery", input={"sleep": 0})
        assert parent.wait(30).output == {"thumbs": ["cover.png@64", "cover.png@128"]}
        browser.get(f"{base}/executions/{parent.id}")
        [link] = css(browser, "td.child a")
        child_id = link.text
        assert "thumbs" in css(browser, "td.child")[0].text
        link.click()
        assert browser.find_element(By.CSS_SELECTOR, "#status").text == "succeeded"
        assert child_id in browser.current_url
        back = browser.find_element(By.CSS_SELECTOR, "#parent a")
        assert back.text == str(parent.id)
        back.click()
        assert browser.current_url.endswith(f"/executions/{parent.id}")
        screenshot(browser, "waits-parent-child")
        assert csp_violations(browser) == []
