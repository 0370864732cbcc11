"""Declared event payloads (``wait_for_event(payload=Model)``, ``on_event(payload=Model)``):
every door that sends the event checks the payload against the registered models first,
refusing a bad one with the field named and nothing kept; the dashboard's "Send event" form
shows the model's fields. On real PostgreSQL with real workers and a real browser."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import httpx
import pydantic
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

import konduit
from tests.support.browser import css, eventually
from tests.support.waiting import until
from tests.support.workers import running_worker
from tests.test_api_v1 import refused
from tests.test_people_waits import FAST
from tests.test_web_security import OP, bearer, guarded

pytestmark = pytest.mark.storage


class Review(pydantic.BaseModel):
    """What a reviewer's tool sends."""

    verdict: Literal["ok", "redo"] = pydantic.Field(description="ok or redo")
    score: int = pydantic.Field(default=3, ge=1, le=5, description="1 to 5")


class Order(pydantic.BaseModel):
    order_id: str
    total: float = pydantic.Field(gt=0)


def review_workflow() -> konduit.Workflow:
    wf = konduit.Workflow("reviewed", version=1)

    @wf.step()
    def draft(ctx):
        return {"draft": ctx.input["n"]}

    review = wf.wait_for_event("reviewed", name="review", after=[draft], payload=Review,
                               key=lambda ctx: f"doc-{ctx.input['n']}")

    @wf.step(after=[review])
    def publish(ctx):
        return ctx.upstream["review"]

    return wf


def orders_workflow() -> konduit.Workflow:
    wf = konduit.Workflow("orders", version=1)
    wf.on_event("order-placed", payload=Order)

    @wf.step()
    def book(ctx):
        return ctx.input

    return wf


def waiting(app: konduit.App, execution_id) -> bool:
    return any(t.step == "review" and t.status == "waiting" for t in app.tasks(execution_id))


def test_a_bad_model_fails_at_definition_time_naming_the_step_or_trigger():
    wf = konduit.Workflow("bad-payload", version=1)
    with pytest.raises(konduit.WorkflowDefinitionError) as caught:
        wf.wait_for_event("e", name="hold", payload=42)
    assert "hold" in str(caught.value) and "payload=" in str(caught.value)
    with pytest.raises(konduit.WorkflowDefinitionError) as caught:
        wf.on_event("e", payload={"type": "no-such-type"})
    assert "on_event('e')" in str(caught.value)


def test_the_spec_keeps_the_model_only_when_declared():
    plain = konduit.Workflow("plain", version=1)
    plain.wait_for_event("e", name="hold", key=lambda ctx: "k")
    [step] = plain.compile().spec_json["steps"]
    assert "payload" not in step["wait"]
    typed = review_workflow().compile()
    review = next(s for s in typed.spec_json["steps"] if s["name"] == "review")
    assert review["wait"]["payload"]["properties"]["score"]["maximum"] == 5
    assert "payload" not in konduit.Workflow("x", version=1).on_event("e").to_spec()
    assert orders_workflow().triggers[0].to_spec()["payload"]["required"] == ["order_id",
                                                                            "total"]


def test_every_door_refuses_a_bad_payload_and_keeps_nothing(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(review_workflow(), orders_workflow())
    with running_worker(app, **FAST):
        handle = app.start("reviewed", input={"n": 1})
        until(lambda: waiting(app, handle.id), what="the review step waiting")
        with pytest.raises(konduit.InputValidationError) as caught:
            app.send_event("reviewed", key="doc-1", payload={"verdict": "ok", "score": 9})
        assert set(caught.value.errors) == {"score"}
        assert "step 'review' of workflow 'reviewed' version 1" in str(caught.value)
        assert caught.value.field == "payload"
        # The code-less client reads the registered model and refuses alike.
        with konduit.Client(db_url) as client:
            with pytest.raises(konduit.InputValidationError) as by_client:
                client.send_event("reviewed", key="doc-1", payload={"score": 2})
            assert set(by_client.value.errors) == {"verdict"}
            # Nothing was kept: the step still waits, and a good payload wakes it.
            assert waiting(app, handle.id)
            assert client.send_event("reviewed", key="doc-1",
                                     payload={"verdict": "redo", "score": 2}) == "woke"
        assert handle.wait(timeout=30).output == {"verdict": "redo", "score": 2}

        # A trigger's model: checked before anything starts.
        with pytest.raises(konduit.InputValidationError) as caught:
            app.send_event("order-placed", payload={"order_id": "A1", "total": -1})
        assert set(caught.value.errors) == {"total"} and "on_event trigger" in str(caught.value)
        assert app.list(workflow="orders") == []
        assert app.send_event("order-placed", payload=Order(order_id="A2", total=5)) == "started"
        [started] = until(lambda: app.list(workflow="orders"), what="the order")
        assert app.wait(started.id, timeout=30).output == {"order_id": "A2", "total": 5.0}


def test_the_api_names_the_payload_field_at_fault(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(review_workflow())
    with running_worker(app, **FAST), guarded(app, db_url) as (base, _), \
            httpx.Client(base_url=base, timeout=30) as http:
        handle = app.start("reviewed", input={"n": 2})
        until(lambda: waiting(app, handle.id), what="the review step waiting")
        bad = refused(http.post("/api/v1/events", headers=bearer(OP), json={
            "name": "reviewed", "key": "doc-2", "payload": {"verdict": "ok", "score": 0}}),
            422, "body.payload.score")
        assert [e["field"] for e in bad["errors"]] == ["body.payload.score"]
        ok = http.post("/api/v1/events", headers=bearer(OP), json={
            "name": "reviewed", "key": "doc-2", "payload": {"verdict": "ok"}})
        assert ok.status_code == 200 and ok.json()["result"] == "woke", ok.text
        assert handle.wait(timeout=30).output == {"verdict": "ok"}


def test_the_send_event_form_shows_the_models_fields_in_the_browser(
        make_app: Callable[..., konduit.App], db_url: str, browser: WebDriver) -> None:
    app = make_app(review_workflow())
    with running_worker(app, **FAST), guarded(app, db_url) as (base, _):
        handle = app.start("reviewed", input={"n": 3})
        until(lambda: waiting(app, handle.id), what="the review step waiting")
        browser.get(f"{base}/login")
        browser.find_element(By.ID, "token").send_keys(OP)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        eventually(browser, lambda d: "/login" not in d.current_url)
        browser.get(f"{base}/executions/{handle.id}")
        eventually(browser, lambda d: css(d, "a.send-event"))
        css(browser, "a.send-event")[0].click()
        eventually(browser, lambda d: css(d, "#event-fields"))
        assert browser.find_element(By.ID, "event-key").get_attribute("value") == "doc-3"
        assert browser.find_element(By.ID, "event-raw").get_attribute("hidden") is not None
        verdict = Select(browser.find_element(By.ID, "in-verdict"))
        assert [o.get_attribute("value") for o in verdict.options][-2:] == ['"ok"', '"redo"']
        assert browser.find_element(By.ID, "in-score").get_attribute("value") == "3"
        assert "1 to 5" in browser.find_element(By.CSS_SELECTOR, 'tr[data-field="score"]').text

        verdict.select_by_value('"ok"')
        score = browser.find_element(By.ID, "in-score")
        score.clear()
        score.send_keys("7")
        browser.find_element(By.ID, "send-event-submit").click()
        eventually(browser, lambda d: css(d, '[data-error-for="in.score"]'))
        said = browser.find_element(By.CSS_SELECTOR, '[data-error-for="in.score"]').text
        assert said.startswith("score:") and "maximum of 5" in said, said
        assert browser.find_element(By.ID, "in-score").get_attribute("value") == "7"
        assert waiting(app, handle.id)

        score = browser.find_element(By.ID, "in-score")
        score.clear()
        score.send_keys("4")
        browser.find_element(By.ID, "send-event-submit").click()
        eventually(browser, lambda d: "/send-event" not in d.current_url)
        assert handle.wait(timeout=30).output == {"verdict": "ok", "score": 4}

        # Raw JSON stays available: the mode switch shows the box, and it is what is sent.
        second = app.start("reviewed", input={"n": 4})
        until(lambda: waiting(app, second.id), what="the second review step waiting")
        browser.get(f"{base}/executions/{second.id}/send-event?name=reviewed&key=doc-4")
        eventually(browser, lambda d: css(d, "#mode-raw"))
        browser.find_element(By.ID, "mode-raw").click()
        eventually(browser, lambda d: d.find_element(By.ID, "event-raw").is_displayed())
        browser.find_element(By.ID, "event-payload").send_keys('{"verdict": "maybe"}')
        browser.find_element(By.ID, "send-event-submit").click()
        eventually(browser, lambda d: css(d, "#send-event-problem"))
        assert "verdict" in browser.find_element(By.ID, "send-event-problem").text
        assert waiting(app, second.id)
