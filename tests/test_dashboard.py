"""The dashboard (``konduit dashboard``) in a real browser, on a real history.

A real worker runs two workflows: a fan-out whose optional slow branch degrades at its deadline
(a fallback), and one whose flaky branch is dead-lettered under ``Join.all_done``. The dashboard
is served by uvicorn on a free port and driven with headless Chromium through Selenium: the
executions list, the DAG and the Gantt timeline of an execution, repair from the dead letters, a
404. Plain HTTP checks cover ``/metrics``, the JSON API, a read-only dashboard and a down database.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

import konduit
from konduit.web import create_app, database_client
from konduit.web.views import dag_layout, depths, gantt
from tests.support.browser import css, eventually, screenshot, serving
from tests.support.workers import running_worker

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/none"
DEGRADED_FILL = "rgb(240, 180, 41)"  # .s-degraded in the base template
HEALED = threading.Event()  # the flaky branch fails until this is set


def fan_out() -> konduit.Workflow:
    """start fans out to quick, brisk and slow; slow degrades at its 400 ms deadline."""
    wf = konduit.Workflow("dash-fan-out", version=1)

    @wf.step()
    def start(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[start])
    def quick(ctx: konduit.Context) -> str:
        return "quick"

    @wf.step(after=[start])
    def brisk(ctx: konduit.Context) -> str:
        time.sleep(0.05)
        return "brisk"

    @wf.step(after=[start], deadline="400ms", required=False, retry=konduit.Retry(max_attempts=1),
             fallback=lambda ctx: "fallback.png")
    async def slow(ctx: konduit.Context) -> str:
        await asyncio.sleep(30)
        return "real.png"

    @wf.step(after=[quick, brisk, slow], join=konduit.Join.required())
    def join(ctx: konduit.Context) -> dict[str, str]:
        return dict(ctx.upstream)

    return wf


def dead_letter() -> konduit.Workflow:
    """flaky fails both its attempts (until HEALED); publish goes on without it (all_done)."""
    wf = konduit.Workflow("dash-dead-letter", version=1)

    @wf.step()
    def begin(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[begin])
    def fine(ctx: konduit.Context) -> str:
        return "fine"

    @wf.step(after=[begin], retry=konduit.Retry(max_attempts=2, backoff="fixed", base="10ms",
                                                jitter=False))
    def flaky(ctx: konduit.Context) -> str:
        if not HEALED.is_set():
            raise RuntimeError("image service exploded")
        return "image"

    @wf.step(after=[fine, flaky], join=konduit.Join.all_done())
    def publish(ctx: konduit.Context) -> list[str]:
        return sorted(ctx.upstream)

    return wf


def test_layout_columns_by_depth_and_a_waiting_join_band() -> None:
    spec: list[dict[str, Any]] = [
        {"name": "a", "after": []}, {"name": "b", "after": ["a"]}, {"name": "c", "after": ["a"]},
        {"name": "d", "after": ["b", "c"], "join": {"kind": "all_done"}},
        {"name": "e", "after": ["a", "d"]}]
    assert depths(spec) == {"a": 0, "b": 1, "c": 1, "d": 2, "e": 3}
    dag = dag_layout(spec, {"b": {"status": "degraded"}})
    xs = {n.name: n.x for n in dag.nodes}
    assert xs["a"] < xs["b"] == xs["c"] < xs["d"] < xs["e"]
    assert {n.name: n.status for n in dag.nodes}["b"] == "degraded"
    assert {n.name: n.join for n in dag.nodes}["d"] == "all_done" and len(dag.edges) == 6
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    at = [t0 + timedelta(seconds=s) for s in range(10)]
    attempts = [{"step": "b", "map_index": 0, "attempt": 1, "started_at": at[0], "finished_at": at[1],
                 "outcome": "succeeded", "error": None},
                {"step": "c", "map_index": 0, "attempt": 1, "started_at": at[0], "finished_at": None,
                 "outcome": None, "error": None}]
    steps = [{"step": "d", "up_total": 2, "first_upstream_at": at[1], "fired_at": None,
              "straggler": None}]
    chart = gantt(attempts, steps, t0, at[4])
    assert [b.outcome for b in chart.bars] == ["succeeded", "running"]
    assert chart.bars[1].w > chart.bars[0].w * 3.9  # running: until now
    [band] = chart.bands
    assert band.waiting and band.wait == 3 and band.text == "fan-in wait 3.000s so far"
    assert chart.span == 4 and chart.ticks[0][1] == "0s"
    # The execution ended (at[4]) with the join unfired: it never fired, not "so far".
    [band] = gantt(attempts, steps, t0, at[4], finished=True).bands
    assert band.text == "fan-in wait 3.000s, never fired"


@pytest.mark.storage
def test_the_dashboard_in_a_browser(make_app: Callable[..., konduit.App], db_url: str,
                                    browser: WebDriver, tmp_path: Path) -> None:
    HEALED.clear()
    app = make_app(fan_out(), dead_letter())
    with running_worker(app, poll_interval=0.05), \
            serving(create_app(database_client(db_url, app), app)) as base:
        degraded, dead = app.start("dash-fan-out"), app.start("dash-dead-letter")
        assert degraded.wait(20).outcomes["slow"] == "degraded"
        assert dead.wait(20).outcomes["flaky"] == "failed"

        # The executions page lists both, the degraded and the dead-lettered branch marked.
        browser.get(base + "/")
        rows = {r.get_attribute("data-id"): r for r in css(browser, "#executions tr[data-id]")}
        assert set(rows) == {str(degraded.id), str(dead.id)}
        assert {r.get_attribute("data-status") for r in rows.values()} == {"succeeded"}
        assert "degraded: slow" in rows[str(degraded.id)].text
        assert "failed: flaky" in rows[str(dead.id)].text
        rows[str(degraded.id)].find_element(By.TAG_NAME, "a").click()

        # The execution page: the DAG, one node per step, the degraded one colored as degraded.
        eventually(browser, lambda d: d.current_url == f"{base}/executions/{degraded.id}")
        assert browser.find_element(By.ID, "status").text == "succeeded"
        nodes = {n.get_attribute("data-step"): n for n in css(browser, "#dag g.node")}
        assert set(nodes) == {"start", "quick", "brisk", "slow", "join"}
        assert {s: n.get_attribute("data-status") for s, n in nodes.items()} == {
            "start": "succeeded", "quick": "succeeded", "brisk": "succeeded", "slow": "degraded",
            "join": "succeeded"}
        assert nodes["slow"].find_element(By.TAG_NAME, "rect").value_of_css_property("fill") == \
            DEGRADED_FILL
        assert len(css(browser, "#dag path.edge")) == 6
        # The Gantt: one bar per attempt, and the join's fan-in wait naming its straggler.
        bars = css(browser, "#gantt rect.bar")
        assert len(bars) == sum(int(t.attempt) for t in app.tasks(degraded.id)) == 5
        assert {b.get_attribute("data-step"): b.get_attribute("data-outcome") for b in bars}["slow"] \
            == "degraded"
        [band] = css(browser, "#gantt g.band")
        assert band.get_attribute("data-join") == "join"
        assert band.get_attribute("data-straggler") == "slow"
        assert "straggler: slow" in band.text
        assert float(band.get_attribute("data-wait") or 0) >= 0.3  # quick/brisk ended, slow ran on
        join_row = browser.find_element(By.CSS_SELECTOR, "#steps tr[data-step='join']").text
        assert "slow" in join_row
        screenshot(browser, "dashboard-execution-degraded")

        # Dead letters: the failed task with its error; Repair, once confirmed, re-runs it.
        browser.get(base + "/dead-letters")
        [row] = css(browser, f"#dead-letters tr[data-execution='{dead.id}']")
        assert "flaky" in row.text and "RuntimeError: image service exploded" in row.text
        screenshot(browser, "dashboard-dead-letters")
        HEALED.set()
        row.find_element(By.CSS_SELECTOR, "a.repair").click()
        eventually(browser, lambda d: d.current_url == f"{base}/executions/{dead.id}/repair")
        assert [li.get_attribute("data-step") for li in css(browser, "#rerun li")] == ["flaky", "publish"]
        browser.find_element(By.ID, "confirm-repair").click()
        eventually(browser, lambda d: d.current_url.startswith(f"{base}/executions/{dead.id}?"))
        assert "re-running flaky, publish" in browser.find_element(By.ID, "flash").text
        eventually(browser, lambda d: d.find_element(By.ID, "status").text == "succeeded" and
                   d.find_element(By.CSS_SELECTOR, "#dag g.node[data-step='flaky']")
                   .get_attribute("data-status") == "succeeded")
        assert len(css(browser, "#versions tr")) == 3  # header, v1 (flaky failed), v2 (repaired)
        assert app.status(dead.id).outcomes["flaky"] == "succeeded"

        # A repaired dead letter leaves the dead-letter list (its history keeps it), and there
        # is nothing left to repair: said on the confirmation page, with no form to post.
        browser.get(base + "/dead-letters")
        assert not css(browser, f"#dead-letters tr[data-execution='{dead.id}']")
        browser.get(f"{base}/executions/{dead.id}/repair")
        eventually(browser, lambda d: "Nothing to repair" in d.find_element(By.ID, "refusal").text)
        assert not css(browser, "#confirm form")

        # An unknown execution is a 404 page that says so.
        missing = uuid4()
        browser.get(f"{base}/executions/{missing}")
        assert browser.find_element(By.ID, "problem").text == "No such execution"
        assert f"no execution with id {missing}" in browser.find_element(By.TAG_NAME, "main").text


@pytest.mark.storage
def test_metrics_api_read_only_and_a_down_database(make_app: Callable[..., konduit.App],
                                                   db_url: str) -> None:
    HEALED.clear()
    wf = dead_letter()
    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        handle = app.start(wf.name)
        handle.wait(20)
    with serving(create_app(database_client(db_url))) as base, httpx.Client(base_url=base) as http:
        metrics = http.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "konduit_scrape_error 0.0" in metrics.text
        assert 'konduit_executions{status="succeeded",workflow="dash-dead-letter"} 1.0' in metrics.text
        listed = http.get("/api/v1/executions").json()["items"]
        assert [(e["id"], e["status"]) for e in listed] == [(str(handle.id), "succeeded")]
        one = http.get(f"/api/v1/executions/{handle.id}").json()
        assert {s["step"]: s["status"] for s in one["steps"]}["flaky"] == "failed"
        assert len(one["attempts"]) == 5  # begin, fine, flaky twice, publish
        assert http.get(f"/api/v1/executions/{uuid4()}").status_code == 404
        assert http.get("/executions/not-an-id").status_code == 404
        assert http.get("/stats?history=lately").status_code == 400
        # Without the workflow code, Repair is offered disabled and refused with a reason.
        assert "disabled" in http.get("/dead-letters").text
        refused = http.post(f"/executions/{handle.id}/repair", data={"confirm": "yes"},
                            follow_redirects=True)
        assert refused.status_code == 200 and "start the dashboard with --app" in refused.text

    with serving(create_app(database_client(UNREACHABLE))) as base, httpx.Client(base_url=base) as http:
        began = time.monotonic()
        for path in ("/", "/api/v1/executions"):
            down = http.get(path, timeout=30)
            assert down.status_code == 503
            assert "database" in down.text.lower()
        assert time.monotonic() - began < 10
        assert "Traceback" not in down.text
