"""The executions list's search form in a real browser (issue 18, item 6): typed filters find
by tag, key, id and input field, stay in the URL (a search is a link), are shown again in the
form, and the live refresh and the pager keep them; a bad filter is a page that says what is
wrong."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

import konduit
from konduit.web import create_app, database_client
from tests.support.browser import css, eventually, screenshot, serving

pytestmark = [pytest.mark.storage]


def show() -> konduit.Workflow:
    wf = konduit.Workflow("dash-show", version=1)

    @wf.step()
    def air(ctx: Any) -> Any:
        return ctx.input

    return wf


def listed(browser: WebDriver) -> list[str]:
    return [r.get_attribute("data-id") or "" for r in css(browser, "#executions tr[data-id]")]


def search(browser: WebDriver, **fields: str) -> None:
    """Fill the empty form fields named and submit."""
    form = browser.find_element(By.ID, "search")
    for name, value in fields.items():
        [box] = [b for b in form.find_elements(By.NAME, name) if not b.get_attribute("value")]
        box.send_keys(value)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def test_the_search_form_finds_and_keeps_its_filters_in_the_url(
        make_app: Callable[..., konduit.App], db_url: str, browser: WebDriver) -> None:
    app = make_app(show())
    acme = app.start("dash-show", {"episode": 42}, tags={"customer": "acme"},
                     idempotency_key="ep-42")
    beta = app.start("dash-show", {"episode": 7}, tags={"customer": "beta", "tier": "gold"})
    later = app.start("dash-show", {"episode": 9}, delay="1h", tags={"customer": "beta"})
    with serving(create_app(database_client(db_url, app), app)) as base:
        browser.get(base + "/")
        assert set(listed(browser)) == {str(acme.id), str(beta.id), str(later.id)}

        search(browser, tag="customer=acme")
        eventually(browser, lambda d: "tag=customer%3Dacme" in d.current_url)
        assert listed(browser) == [str(acme.id)]
        assert "customer=acme" in browser.find_element(By.ID, "executions").text

        # The form shows the tag again; a second tag narrows (both must hold).
        browser.get(base + "/?tag=customer%3Dbeta")
        assert set(listed(browser)) == {str(beta.id), str(later.id)}
        kept = [b.get_attribute("value") for b in browser.find_elements(By.NAME, "tag")]
        assert "customer=beta" in kept
        search(browser, tag="tier=gold")
        eventually(browser, lambda d: "tier%3Dgold" in d.current_url)
        assert parse_qs(urlparse(browser.current_url).query)["tag"] == [
            "customer=beta", "tier=gold"]
        assert listed(browser) == [str(beta.id)]
        screenshot(browser, "dashboard-search-tags")

        browser.get(base + "/")
        search(browser, key="ep-42")
        eventually(browser, lambda d: "key=ep-42" in d.current_url)
        assert listed(browser) == [str(acme.id)]

        browser.get(base + "/")
        search(browser, id=str(beta.id)[-12:])
        eventually(browser, lambda d: "id=" in d.current_url)
        assert listed(browser) == [str(beta.id)]

        browser.get(base + "/")
        search(browser, input="episode=9")
        eventually(browser, lambda d: "input=episode%3D9" in d.current_url)
        assert listed(browser) == [str(later.id)]
        [row] = css(browser, "#executions tr[data-id]")
        assert row.get_attribute("data-status") == "scheduled"

        # A search is a link: the pager and the live refresh keep it.
        browser.get(base + "/?limit=1&tag=customer%3Dbeta")
        assert listed(browser) == [str(later.id)]
        older = browser.find_element(By.ID, "next-page").get_attribute("href") or ""
        assert "tag=customer%3Dbeta" in older
        browser.get(older)
        assert listed(browser) == [str(beta.id)]
        live = httpx.get(base + "/?tag=customer%3Dacme").text
        assert "/api/v1/executions?" in live and "tag=customer%3Dacme" in live

        # A bad filter is a page saying what is wrong, not an empty list.
        response = httpx.get(base + "/", params={"id": "xyz"})
        assert response.status_code == 400 and "hex digits" in response.text
        browser.get(base + "/?tag=customer")
        eventually(browser, lambda d: "name=value" in d.page_source)

        # The scheduled one's page shows when it starts and its tags (each a search link),
        # and it can be cancelled before its time.
        browser.get(f"{base}/executions/{later.id}")
        assert browser.find_element(By.ID, "status").text == "scheduled"
        assert "scheduled" in browser.find_element(By.ID, "run-at").text
        tag_link = browser.find_element(By.CSS_SELECTOR, "#tags a")
        assert tag_link.text == "customer=beta"
        browser.find_element(By.ID, "cancel").click()
        eventually(browser, lambda d: d.current_url.endswith(f"/executions/{later.id}/cancel"))
        browser.find_element(By.ID, "confirm-cancel").click()
        eventually(browser, lambda d: d.current_url.startswith(f"{base}/executions/{later.id}"))
        eventually(browser, lambda d: d.find_element(By.ID, "status").text == "cancelled")
        assert app.status(later.id).status == "cancelled"
