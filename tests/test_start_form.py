"""The dashboard's start form, built from the workflow's input schema, in a real browser and over
real HTTP: a field per property (an enum as a choice, a whole number with its default, an
optional text, a checkbox), a refused value named beside its field with everything typed kept,
the start options (idempotency key, tags, run at or delay, priority) passed to the one start
operation, raw JSON a click away (and the only input of a workflow without a schema), and the
same refusals as every page POST (a read-only login, another origin)."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, Field
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

import konduit
from konduit.web import create_app, database_client
from tests.support.browser import csp_violations, css, eventually, screenshot, serving, strict_csp
from tests.test_web_security import OP, RO, csrf_of, guarded, login

pytestmark = pytest.mark.storage


class Size(enum.StrEnum):
    small = "small"
    large = "large"


class Order(BaseModel):
    size: Size
    count: int = Field(2, ge=1, description="how many to make")
    note: str | None = None
    gift: bool = False


def order_flow() -> konduit.Workflow:
    wf = konduit.Workflow("form-order", version=1, input=Order)

    @wf.step()
    def make(ctx: konduit.Context) -> int:
        return int(ctx.input.count)

    return wf


def plain_flow() -> konduit.Workflow:
    wf = konduit.Workflow("form-plain", version=1)

    @wf.step()
    def echo(ctx: konduit.Context) -> Any:
        return ctx.input

    return wf


def stored(http: httpx.Client, execution_id: str) -> dict[str, Any]:
    """The execution as the API reads it back: input, idempotency key, tags, run_at, priority."""
    found = http.get(f"/api/v1/executions/{execution_id}")
    assert found.status_code == 200, found.text
    detail: dict[str, Any] = found.json()
    return detail


def value(browser: WebDriver, element_id: str) -> str | None:
    return browser.find_element(By.ID, element_id).get_attribute("value")


def test_the_start_form_has_the_fields_of_the_input_model(
        make_app: Callable[..., konduit.App], browser: WebDriver) -> None:
    app = make_app(order_flow(), plain_flow())
    web = strict_csp(create_app(database_client(app.database_url, app), app))
    with serving(web) as base, httpx.Client(base_url=base, timeout=30) as http:
        browser.get(f"{base}/start")
        assert Select(browser.find_element(By.ID, "start-workflow")).first_selected_option.text \
            == "form-order"
        rows = {r.get_attribute("data-field"): r.get_attribute("data-kind")
                for r in css(browser, "#start-fields tr[data-field]")}
        assert rows == {"size": "choice", "count": "integer", "note": "text", "gift": "boolean"}
        assert not browser.find_element(By.ID, "start-input").is_displayed()  # raw JSON: a click away
        size = Select(browser.find_element(By.ID, "in-size"))
        assert [o.text for o in size.options] == ["(choose)", "small", "large"]
        assert value(browser, "in-count") == "2"  # the default
        assert "how many to make" in browser.find_element(
            By.CSS_SELECTOR, "tr[data-field='count']").text
        assert value(browser, "in-note") == ""
        assert not browser.find_element(By.ID, "in-gift").is_selected()
        screenshot(browser, "start-form-fields")

        # A value the model refuses: named beside its field; everything typed is kept.
        size.select_by_visible_text("large")
        count = browser.find_element(By.ID, "in-count")
        count.clear()
        count.send_keys("0")
        browser.find_element(By.ID, "in-note").send_keys("rush <b>please</b>")
        browser.find_element(By.ID, "in-gift").click()
        browser.find_element(By.ID, "start-key").send_keys("order-17")
        browser.find_element(By.ID, "start-tags").send_keys("team=kitchen")
        browser.find_element(By.ID, "start-submit").click()
        eventually(browser, lambda d: css(d, "[data-error-for='in.count']"))
        said = browser.find_element(By.CSS_SELECTOR, "tr[data-field='count'] .field-error").text
        assert said.startswith("count: ") and "minimum of 1" in said, said
        assert css(browser, "tr.has-error") == css(browser, "tr[data-field='count']")
        assert "count" in browser.find_element(By.ID, "start-problem").text
        assert Select(browser.find_element(By.ID, "in-size")).first_selected_option.text == "large"
        assert value(browser, "in-count") == "0"
        assert value(browser, "in-note") == "rush <b>please</b>"
        assert browser.find_element(By.ID, "in-gift").is_selected()
        assert value(browser, "start-key") == "order-17"
        assert value(browser, "start-tags") == "team=kitchen"
        assert app.search(idempotency_key="order-17") == []  # nothing was started
        screenshot(browser, "start-form-refused")

        # Corrected: started with exactly that input, key and tag.
        count = browser.find_element(By.ID, "in-count")
        count.clear()
        count.send_keys("3")
        browser.find_element(By.ID, "start-submit").click()
        eventually(browser, lambda d: "started" in d.find_element(By.ID, "flash").text)
        started = browser.find_element(By.ID, "execution-id").text
        [found] = app.search(idempotency_key="order-17")
        assert str(found.id) == started
        assert (found.workflow_name, found.tags, found.priority, found.run_at) == (
            "form-order", {"team": "kitchen"}, 0, None)
        detail = stored(http, started)
        assert detail["input"] == {"size": "large", "count": 3, "note": "rush <b>please</b>",
                                   "gift": True}
        assert detail["idempotency_key"] == "order-17"

        # Raw JSON, a click away; its start options too: priority and a delay.
        browser.get(f"{base}/start?workflow=form-order")
        browser.find_element(By.ID, "mode-raw").click()
        box = browser.find_element(By.ID, "start-input")
        eventually(browser, lambda d: box.is_displayed())
        assert not browser.find_element(By.ID, "start-fields").is_displayed()
        box.send_keys('{"size": "small"}')
        browser.find_element(By.ID, "start-key").send_keys("order-18")
        browser.find_element(By.ID, "start-delay").send_keys("1h")
        priority = browser.find_element(By.ID, "start-priority")
        priority.clear()
        priority.send_keys("-5")
        screenshot(browser, "start-form-raw")
        browser.find_element(By.ID, "start-submit").click()
        eventually(browser, lambda d: "started" in d.find_element(By.ID, "flash").text)
        [raw] = app.search(idempotency_key="order-18")
        assert raw.priority == -5 and raw.tags is None and raw.run_at is not None
        assert timedelta(minutes=59) < raw.run_at - datetime.now(UTC) <= timedelta(hours=1)
        assert stored(http, str(raw.id))["input"] == {"size": "small"}
        assert app.status(raw.id).status == "scheduled"

        # A workflow without a schema: choosing it shows raw JSON only.
        browser.get(f"{base}/start")
        Select(browser.find_element(By.ID, "start-workflow")).select_by_visible_text("form-plain")
        eventually(browser, lambda d: d.current_url.endswith("/start?workflow=form-plain"))
        eventually(browser, lambda d: d.find_element(By.ID, "start-input").is_displayed())
        assert css(browser, "#start-fields") == [] and css(browser, "#mode-raw") == []
        browser.find_element(By.ID, "start-input").send_keys('[1, 2]')
        browser.find_element(By.ID, "start-submit").click()
        eventually(browser, lambda d: "started" in d.find_element(By.ID, "flash").text)
        assert stored(http, browser.find_element(By.ID, "execution-id").text)["input"] == [1, 2]
        assert csp_violations(browser) == []


def post_start(http: httpx.Client, csrf: str, **fields: str) -> httpx.Response:
    form = {"csrf_token": csrf, "workflow": "form-order", "mode": "fields",
            "fields_for": "form-order@1", "in.size": '"small"', "in.count": "2", "priority": "0"}
    return http.post("/start", data={**form, **fields})


def field_error(html: str, name: str) -> str:
    found = re.search(rf'data-error-for="{re.escape(name)}">([^<]*)<', html)
    assert found, (name, html)
    return found[1]


def test_the_start_options_are_checked_and_named(make_app: Callable[..., konduit.App]) -> None:
    app = make_app(order_flow(), plain_flow())
    with serving(create_app(database_client(app.database_url, app), app)) as base, \
            httpx.Client(base_url=base, timeout=30) as http:
        # What the form cannot read is named beside its field, and nothing starts.
        bad = post_start(http, "", **{"in.count": "two", "tags": "team=a\noops",
                                      "run_at": "tomorrow", "priority": "high"})
        assert bad.status_code == 422
        assert field_error(bad.text, "in.count") == "count: &#39;two&#39; is not a whole number"
        assert field_error(bad.text, "tags") == "tags: line 2: &#39;oops&#39; is not key=value"
        assert "is not a moment" in field_error(bad.text, "run_at")
        assert "not a whole number" in field_error(bad.text, "priority")
        assert 'value="two"' in bad.text and "team=a\noops" in bad.text
        # What the engine refuses, likewise: a delay it cannot read, a run_at with a delay.
        late = post_start(http, "", delay="soon")
        assert late.status_code == 422 and "delay" in field_error(late.text, "delay")
        both = post_start(http, "", delay="10m", run_at="2030-01-02T03:04")
        assert both.status_code == 422 and "run_at" in both.text
        assert app.search(workflow="form-order") == []
        # A run_at without an offset is UTC; the same key and input give the same execution.
        ok = post_start(http, "", run_at="2030-01-02T03:04", idempotency_key="k-1",
                        tags="a=1\n\nb = two ")
        assert ok.status_code == 303, ok.text
        again = post_start(http, "", run_at="2030-01-02T03:04", idempotency_key="k-1",
                           tags="a=1\n\nb = two ")
        assert again.headers["location"] == ok.headers["location"]
        [found] = app.search(idempotency_key="k-1")
        assert found.run_at == datetime(2030, 1, 2, 3, 4, tzinfo=UTC)
        assert found.tags == {"a": "1", "b": "two"}
        # Another input with that key: the engine's conflict, said on the form.
        clash = post_start(http, "", **{"in.count": "5", "idempotency_key": "k-1"})
        assert clash.status_code == 422 and "k-1" in clash.text
        # Fields posted for another workflow (no script switched them): that one's fields are
        # shown, nothing starts.
        switched = post_start(http, "", fields_for="form-plain@1")
        assert switched.status_code == 422 and "fields of form-order@1 are shown" in switched.text
        assert len(app.search(workflow="form-order")) == 1


def test_a_read_only_login_cannot_start(make_app: Callable[..., konduit.App],
                                        db_url: str) -> None:
    app = make_app(order_flow())
    with guarded(app, db_url) as (base, _), httpx.Client(base_url=base, timeout=30) as http:
        assert login(http, RO).status_code == 303
        page = http.get("/start")
        assert page.status_code == 200 and 'id="in-size"' in page.text
        refused = post_start(http, csrf_of(page.text), idempotency_key="ro-1")
        assert refused.status_code == 403 and "read-only session" in refused.text
        assert post_start(http, "0" * 20).status_code == 403  # nor without its CSRF token

        http.cookies.clear()
        assert login(http, OP).status_code == 303
        csrf = csrf_of(http.get("/start").text)
        cross = http.post("/start", data={"csrf_token": csrf, "workflow": "form-order",
                                          "mode": "fields", "fields_for": "form-order@1",
                                          "in.size": '"small"'},
                          headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403
        assert app.search(workflow="form-order") == []
        done = post_start(http, csrf, idempotency_key="op-1")  # the same form, an operator
        assert done.status_code == 303
        [found] = app.search(workflow="form-order")
        assert found.idempotency_key == "op-1"


def test_a_schema_s_words_are_text_and_its_odd_names_work(
        make_app: Callable[..., konduit.App]) -> None:
    """A JSON Schema dict with a hostile description and a property name that is markup: shown
    as text, and its field still starts the execution with that name."""
    hostile = konduit.Workflow("form-hostile", version=1, input={
        "type": "object", "required": ["<b>x</b>"], "properties": {
            "<b>x</b>": {"type": "string", "description": "<script>alert(1)</script>"}}})

    @hostile.step()
    def echo(ctx: konduit.Context) -> Any:
        return ctx.input

    app = make_app(hostile)
    with serving(create_app(database_client(app.database_url, app), app)) as base, \
            httpx.Client(base_url=base, timeout=30) as http:
        page = http.get("/start", params={"workflow": "form-hostile"})
        assert page.status_code == 200
        assert "<script>alert" not in page.text and "&lt;script&gt;alert(1)" in page.text
        assert 'name="in.&lt;b&gt;x&lt;/b&gt;"' in page.text
        missing = http.post("/start", data={"workflow": "form-hostile", "mode": "fields",
                                            "fields_for": "form-hostile@1"})
        assert missing.status_code == 422
        assert field_error(missing.text, "in.&lt;b&gt;x&lt;/b&gt;") == \
            "&lt;b&gt;x&lt;/b&gt;: field required"
        done = http.post("/start", data={"workflow": "form-hostile", "mode": "fields",
                                         "fields_for": "form-hostile@1", "in.<b>x</b>": "y"})
        assert done.status_code == 303, done.text
        [found] = app.search(workflow="form-hostile")
        assert stored(http, str(found.id))["input"] == {"<b>x</b>": "y"}
