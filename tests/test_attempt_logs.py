"""What a handler logs during an attempt is kept with the attempt: ``logging`` records from the
handler's task or thread (or its child process with ``--isolation process``) and ``ctx.log``
lines, bounded and masked, stored with the attempt's end, shown on the execution page and in the
API, and pruned with the execution."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest

import konduit
from konduit.core import attempt_logs
from konduit.core.attempt_logs import MAX_BYTES, MAX_RECORDS, AttemptLogs
from konduit.web import create_app, database_client
from tests.support.browser import css, eventually, screenshot, serving
from tests.support.workers import running_worker

user = logging.getLogger("user-code")
quiet = logging.getLogger("user-code.quiet")


def logged_workflow() -> konduit.Workflow:
    wf = konduit.Workflow("logged", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base="0.05s"))
    def flaky(ctx: konduit.Context) -> str:
        user.warning("attempt %s of flaky with %s", ctx.attempt,
                     "postgresql://app:hunter2@db.internal/app")
        ctx.log("from ctx.log: %d items", 3)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    @wf.step()
    async def chatty(ctx: konduit.Context) -> int:
        for i in range(MAX_RECORDS + 50):
            user.warning("line %s", i)
        return 1

    @wf.step()
    def silent(ctx: konduit.Context) -> int:
        quiet.debug("below the logger's level: never a record")
        return 2

    @wf.step()
    def hostile(ctx: konduit.Context) -> str:
        user.warning("nul \x00 and a lone surrogate \ud800 and %s", object())
        ctx.log("x" * 20_000, level="error")
        return "survived"

    return wf


def by_step(logs: list[Any]) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for entry in logs:
        found.setdefault(entry.step, []).append(entry)
    return found


def check_logs(logs: list[Any]) -> None:
    steps = by_step(logs)
    assert "silent" not in steps  # logged nothing: no row
    first, second = steps["flaky"]
    assert (first.attempt, first.outcome, second.attempt, second.outcome) == (
        1, "retry", 2, "succeeded")
    for entry in (first, second):
        messages = [r["message"] for r in entry.records]
        assert messages == [f"attempt {entry.attempt} of flaky with postgresql://app:***@"
                            f"db.internal/app", "from ctx.log: 3 items"], messages
        assert [r["level"] for r in entry.records] == ["WARNING", "INFO"]
        assert [r["logger"] for r in entry.records] == ["user-code", "ctx.log"]
        assert entry.dropped == 0
        assert all(abs(r["at"] - time.time()) < 600 for r in entry.records)
    (chatty,) = steps["chatty"]
    assert len(chatty.records) == MAX_RECORDS and chatty.dropped == 50
    assert chatty.records[0]["message"] == "line 0"
    (hostile,) = steps["hostile"]
    assert hostile.outcome == "succeeded"
    assert hostile.records[0]["message"].startswith("nul \\x00 and a lone surrogate ? and ")
    assert hostile.records[1]["level"] == "ERROR" and len(hostile.records[1]["message"]) < 9000


@pytest.mark.storage
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_handler_logs_are_kept_with_each_attempt(make_app: Callable[..., konduit.App],
                                                 isolation: str) -> None:
    app = make_app(logged_workflow())
    user.setLevel(logging.INFO)
    with running_worker(app, poll_interval=0.05, isolation=isolation):
        handle = app.start("logged", {})
        assert handle.wait(timeout=60).status == "succeeded"
    check_logs(app.attempt_logs(handle.id))


@pytest.mark.storage
def test_logs_show_on_the_page_in_the_api_and_go_with_the_execution(
        make_app: Callable[..., konduit.App], db_url: str, browser: Any) -> None:
    app = make_app(logged_workflow())
    user.setLevel(logging.INFO)
    with running_worker(app, poll_interval=0.05):
        handle = app.start("logged", {})
        assert handle.wait(timeout=60).status == "succeeded"
    eid = str(handle.id)
    with serving(create_app(database_client(db_url, app), app)) as base, \
            httpx.Client(base_url=base, timeout=30) as http:
        body = http.get(f"/api/v1/executions/{eid}/logs")
        assert body.status_code == 200, body.text
        steps = {(e["step"], e["attempt"]): e for e in body.json()}
        assert set(steps) == {("flaky", 1), ("flaky", 2), ("chatty", 1), ("hostile", 1)}
        assert steps[("chatty", 1)]["dropped"] == 50
        assert "hunter2" not in body.text
        assert http.get("/api/v1/executions/00000000-0000-7000-8000-000000000000/logs"
                        ).status_code == 404

        browser.get(f"{base}/executions/{eid}")
        eventually(browser, lambda d: css(d, "#logs details.attempt-log"))
        entries = css(browser, "#logs details.attempt-log")
        shown = [(e.get_attribute("data-step"), e.get_attribute("data-attempt")) for e in entries]
        assert sorted(shown) == sorted((s, str(n)) for s, n in steps)
        first = entries[shown.index(("flaky", "1"))]
        first.click()
        eventually(browser, lambda d: "from ctx.log: 3 items" in first.text)
        assert "postgresql://app:***@db.internal/app" in first.text
        assert "50 more dropped" in browser.page_source
        # Beside the traceback of the failed attempt, its logs.
        failure = css(browser, "#failures details.traceback")[0]
        failure.click()
        eventually(browser, lambda d: "first attempt fails" in failure.text)
        assert "attempt 1 of flaky" in failure.text
        browser.execute_script("document.getElementById('logs').scrollIntoView()")
        screenshot(browser, "test_attempt_logs-execution")

    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE konduit_executions SET finished_at = finished_at - interval '2 days'"
                     " WHERE id = %s", (handle.id,))
    assert app.prune(older_than="1d") == 1
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM konduit_attempt_logs").fetchone()
    assert row is not None and row[0] == 0


def test_bounds_by_bytes_and_masking() -> None:
    logs = AttemptLogs()
    assert not logs
    for _ in range(20):
        logs.add("INFO", "y" * 8000)
    records, dropped = logs.state()
    assert sum(len(r["message"]) for r in records) <= MAX_BYTES
    assert len(records) == MAX_BYTES // 8000 and dropped == 20 - len(records)
    logs = AttemptLogs()
    logs.add("INFO", "password=secret host=db")
    assert logs.state()[0][0]["message"] == "password=*** host=db"


def test_records_outside_an_attempt_are_not_collected() -> None:
    attempt_logs.install()
    logs = AttemptLogs()
    user.warning("before")
    with attempt_logs.collecting(logs):
        user.warning("during")
        logging.getLogger("konduit.worker").warning("the worker's own line")
    user.warning("after")
    with attempt_logs.collecting(logs):  # a record that does not format: kept as it is
        user.makeRecord("user-code", logging.WARNING, "f", 1, "%s %s", ("too few",), None)
    assert [r["message"] for r in logs.state()[0]] == [
        "during", "'%s %s' (its arguments could not be formatted)"]


def test_ctx_log_refuses_a_bad_level() -> None:
    import uuid

    ctx = konduit.Context(execution_id=uuid.uuid4(), workflow="w", step="s", map_index=0,
                          attempt=1, input=None)
    with pytest.raises(ValueError, match=r"ctx\.log: level must be one of"):
        ctx.log("x", level="loud")
    ctx.log("no attempt collection: only the worker's log")
