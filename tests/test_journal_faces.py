"""The journal of durable calls through its doors: the execution page's Journal table (in a
real browser, behind a login), ``GET /api/v1/executions/{id}/journal``, ``konduit status
--journal`` and ``Client.journal``, all reading the same records."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

import konduit
from tests.support.browser import browser, screenshot
from tests.support.workers import running_worker
from tests.test_cli_reads import run
from tests.test_redrive_page import login
from tests.test_web_security import OP, RO, bearer, guarded

__all__ = ["browser"]

pytestmark = [pytest.mark.storage]


def _journaled(make_app: Callable[..., konduit.App]) -> tuple[konduit.App, str]:
    wf = konduit.Workflow("journal-faces", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base="50ms"))
    async def agent(ctx: konduit.Context) -> int:
        for n in range(1, 4):
            await ctx.call(f"<model> request {n}", lambda n=n: {"n": n})
        if ctx.attempt == 1:
            raise RuntimeError("dies after three calls")
        await ctx.call("tool: search", lambda: "found")
        return 4

    app = make_app(wf)
    with running_worker(app):
        eid = str(app.start("journal-faces", input={}).id)
        assert app.wait(eid, timeout=60).output == 4
    return app, eid


def test_the_journal_on_the_page_the_api_and_the_command_line(
        make_app: Callable[..., konduit.App], db_url: str, browser: WebDriver) -> None:
    app, eid = _journaled(make_app)
    with konduit.Client(db_url) as client:
        records = client.journal(eid)
    assert [(e.seq, e.name, e.attempt, e.replays) for e in records] == [
        (1, "<model> request 1", 1, 1), (2, "<model> request 2", 1, 1),
        (3, "<model> request 3", 1, 1), (4, "tool: search", 2, 0)]

    with guarded(app, db_url) as (base, _):
        with httpx.Client(base_url=base) as http:
            listed = http.get(f"/api/v1/executions/{eid}/journal", headers=bearer(RO))
            assert listed.status_code == 200, listed.text
            body = listed.json()
            assert [(e["seq"], e["name"], e["replays"]) for e in body] == [
                (e.seq, e.name, e.replays) for e in records]
            assert body[0]["last_replayed_attempt"] == 2 and body[3]["result_bytes"] == 7
            missing = http.get("/api/v1/executions/00000000-0000-0000-0000-000000000000/journal",
                               headers=bearer(RO))
            assert missing.status_code == 404
            assert missing.headers["content-type"].startswith("application/problem+json")

        login(browser, base, OP)
        browser.get(f"{base}/executions/{eid}")
        rows = browser.find_elements(By.CSS_SELECTOR, "#journal tr.journal-call")
        assert [r.get_attribute("data-seq") for r in rows] == ["1", "2", "3", "4"]
        assert [r.get_attribute("data-replays") for r in rows] == ["1", "1", "1", "0"]
        first, last = rows[0].text, rows[3].text
        assert "<model> request 1" in first and "replayed" in first and "attempt 2" in first
        assert "tool: search" in last and "not replayed" in last and "attempt 2" in last
        screenshot(browser, "journal-table")

    shown = run("status", eid, "--journal", "--json", "--database-url", db_url)
    assert shown.returncode == 0, shown.stderr
    assert [(e["seq"], e["name"]) for e in json.loads(shown.stdout)["journal"]] == [
        (e.seq, e.name) for e in records]
    text = run("status", eid, "--journal", "--database-url", db_url, columns=160)
    assert text.returncode == 0, text.stderr
    assert "journal (durable calls)" in text.stdout and "tool: search" in text.stdout
    plain = run("status", eid, "--database-url", db_url)
    assert plain.returncode == 0 and "durable calls" not in plain.stdout
