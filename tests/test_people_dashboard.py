"""The dashboard's inbox and answer form for ``wait_for_input`` steps, in a real browser on a
real database with a real worker (docs/people-in-the-loop.md): the form is rendered from the
step's model (an enum as a choice, a default, a description); a bad value is refused with its
field named and what was typed kept; a good one resumes the execution, and the execution page
shows who answered (the label of the token the session was opened with). A read-only login
and another origin cannot answer."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

import konduit
from konduit.web.security import parse_tokens
from tests.support.browser import css, eventually, screenshot
from tests.support.waiting import until
from tests.support.workers import running_worker
from tests.test_people_waits import FAST, approval_workflow
from tests.test_web_security import OP, RO, csrf_of, guarded, login

pytestmark = pytest.mark.storage


def test_a_person_answers_a_typed_approval_in_the_browser(
        make_app: Callable[..., konduit.App], db_url: str, browser: WebDriver) -> None:
    app = make_app(approval_workflow())
    [op_token] = parse_tokens([f"op:{OP}"])
    with running_worker(app, **FAST), guarded(app, db_url) as (base, _):
        handle = app.start("expense", input={"claim": 12})
        until(lambda: [i for i in app.inbox() if i.execution_id == handle.id],
              what="the inbox row")
        browser.get(f"{base}/login")
        browser.find_element(By.ID, "token").send_keys(OP)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        eventually(browser, lambda d: "/login" not in d.current_url)

        browser.get(f"{base}/")
        browser.find_element(By.LINK_TEXT, "Inbox").click()
        eventually(browser, lambda d: css(d, f'#inbox tr[data-execution="{handle.id}"]'))
        row = css(browser, f'#inbox tr[data-execution="{handle.id}"]')[0]
        assert "finance team" in row.find_element(By.CSS_SELECTOR, ".who").text
        assert row.find_element(By.CSS_SELECTOR, ".deadline").text == "none"
        row.find_element(By.CSS_SELECTOR, "a.answer-link").click()

        eventually(browser, lambda d: css(d, "#answer-form"))
        decision = Select(browser.find_element(By.ID, "in-decision"))
        assert [o.get_attribute("value") for o in decision.options] == ["", '"approve"',
                                                                       '"reject"']
        assert browser.find_element(By.ID, "in-amount").get_attribute("value") == "100"
        assert "The amount approved" in browser.find_element(
            By.CSS_SELECTOR, 'tr[data-field="amount"]').text
        assert browser.find_element(By.ID, "answer-as").text == op_token.label

        decision.select_by_value('"approve"')
        amount = browser.find_element(By.ID, "in-amount")
        amount.clear()
        amount.send_keys("-5")
        browser.find_element(By.ID, "answer-submit").click()
        eventually(browser, lambda d: css(d, '[data-error-for="in.amount"]'))
        said = browser.find_element(By.CSS_SELECTOR, '[data-error-for="in.amount"]').text
        assert said.startswith("amount:") and "minimum of 0" in said, said
        assert css(browser, '[data-error-for="in.decision"]') == []
        # What was typed is kept.
        assert browser.find_element(By.ID, "in-amount").get_attribute("value") == "-5"
        assert Select(browser.find_element(By.ID, "in-decision")
                      ).first_selected_option.get_attribute("value") == '"approve"'
        assert [i.step for i in app.inbox() if i.execution_id == handle.id] == ["approve"]

        amount = browser.find_element(By.ID, "in-amount")
        amount.clear()
        amount.send_keys("40")
        browser.find_element(By.ID, "answer-submit").click()
        eventually(browser, lambda d: f"/executions/{handle.id}" in d.current_url
                   and "/answer" not in d.current_url)
        assert handle.wait(timeout=30).output == {
            "booked": {"decision": "approve", "amount": 40}, "outcome": "succeeded"}
        browser.get(f"{base}/executions/{handle.id}")
        eventually(browser, lambda d: css(d, '#steps tr[data-step="approve"] .answered-by'))
        shown = browser.find_element(By.CSS_SELECTOR, '#steps tr[data-step="approve"] .answered')
        assert f"answered by {op_token.label}" in shown.text
        screenshot(browser, "people-answered")
        browser.get(f"{base}/inbox")
        eventually(browser, lambda d: css(d, "#inbox-empty"))
    [kept] = app.answers(handle.id)
    assert kept.answered_by == op_token.label


def test_a_read_only_login_or_another_origin_cannot_answer(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(approval_workflow())
    with running_worker(app, **FAST), guarded(app, db_url) as (base, _), \
            httpx.Client(base_url=base, timeout=30) as http:
        handle = app.start("expense", input={"claim": 13})
        until(lambda: [i for i in app.inbox() if i.execution_id == handle.id],
              what="the inbox row")
        path = f"/executions/{handle.id}/steps/approve/answer"
        form = {"in.decision": '"approve"', "in.amount": "1", "in.note": ""}
        assert login(http, RO).status_code == 303
        page = http.get(path)
        assert page.status_code == 200 and 'id="in-decision"' in page.text
        refused = http.post(path, data={"csrf_token": csrf_of(page.text), **form})
        assert refused.status_code == 403 and "read-only session" in refused.text

        http.cookies.clear()
        assert login(http, OP).status_code == 303
        csrf = csrf_of(http.get(path).text)
        cross = http.post(path, data={"csrf_token": csrf, **form},
                          headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403
        assert http.post(path, data={"csrf_token": "0" * 20, **form}).status_code == 403
        assert app.answers(handle.id) == []
        done = http.post(path, data={"csrf_token": csrf, **form})
        assert done.status_code == 303, done.text
        handle.wait(timeout=30)
        again = http.get(path)
        assert again.status_code == 409 and "waits for no answer" in again.text


def test_an_answer_the_form_cannot_split_into_fields_is_typed_as_json(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = konduit.Workflow("pick", version=1)
    wf.wait_for_input("choose", model={"type": "array", "items": {"type": "integer"},
                                       "minItems": 1})
    app = make_app(wf)
    with running_worker(app, **FAST), guarded(app, db_url) as (base, _), \
            httpx.Client(base_url=base, timeout=30) as http:
        handle = app.start("pick")
        until(lambda: [i for i in app.inbox() if i.execution_id == handle.id],
              what="the inbox row")
        assert login(http, OP).status_code == 303
        inbox = http.get("/inbox")
        assert inbox.status_code == 200 and f'data-execution="{handle.id}"' in inbox.text
        path = f"/executions/{handle.id}/steps/choose/answer"
        page = http.get(path)
        assert 'id="answer-value"' in page.text and 'id="answer-fields"' not in page.text
        csrf = csrf_of(page.text)
        not_json = http.post(path, data={"csrf_token": csrf, "value": "[1,"})
        assert not_json.status_code == 422 and 'data-error-for="value"' in not_json.text
        assert "value is not JSON" in not_json.text and "[1," in not_json.text
        empty = http.post(path, data={"csrf_token": csrf, "value": "[]"})
        assert empty.status_code == 422 and "should be non-empty" in empty.text
        done = http.post(path, data={"csrf_token": csrf, "value": "[3, 4]"})
        assert done.status_code == 303, done.text
        assert handle.wait(timeout=30).output == [3, 4]
        shown = http.get(f"/executions/{handle.id}")
        assert "answered by" in shown.text and "op token" in shown.text
