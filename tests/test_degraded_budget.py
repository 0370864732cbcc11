"""The degraded budget (issue 16; seed 004: "we accept slightly worse outputs in roughly 2% of
runs"): ``Workflow(degraded_budget="2%")`` is checked at definition time; the day's degraded
share per workflow is a metric; a ``degraded_budget`` alert opens once the share passes the
budget and resolves when it falls back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

import konduit
from konduit.core.alerts import degraded_budget
from konduit.core.shares import format_share, parse_share
from konduit.errors import KonduitError
from konduit.observe.metrics import serve
from tests.support.db import rows
from tests.support.workers import running_worker
from tests.test_alerts import evaluate
from tests.test_metrics import scrape, value


def test_shares_parse_and_bad_budgets_are_definition_errors() -> None:
    assert parse_share("2%", what="x") == pytest.approx(0.02)
    assert parse_share(" 0.5 %", what="x") == pytest.approx(0.005)
    assert parse_share("100%", what="x") == 1.0 and parse_share("0%", what="x") == 0.0
    assert parse_share(0.02, what="x") == 0.02
    assert format_share(0.02) == "2%" and format_share(2 / 51) == "3.92%"
    assert konduit.Workflow("ok", degraded_budget="2%").degraded_budget == pytest.approx(0.02)
    assert konduit.Workflow("none").degraded_budget is None
    for bad, message in [("2", "expected a share like '2%'"), ("lots%", "cannot read"),
                         ("150%", "between 0% and 100%"), ("-1%", "between 0% and 100%"),
                         (2, "between 0% and 100%"), (True, "expected a share"),
                         ("nan%", "between 0% and 100%"), ([2], "expected a share")]:
        with pytest.raises(konduit.WorkflowDefinitionError, match=message) as caught:
            konduit.Workflow("budgeted", degraded_budget=bad)  # type: ignore[arg-type]
        assert "workflow 'budgeted'" in str(caught.value) and "degraded_budget" in str(caught.value)
    with pytest.raises(KonduitError):
        parse_share(None, what="x")


def test_the_rule_fires_only_past_the_budget() -> None:
    day = 86400.0
    assert degraded_budget("w", budget=0.02, finished=0, degraded=0, window=day) is None
    assert degraded_budget("w", budget=0.02, finished=50, degraded=1, window=day) is None  # = 2%
    found = degraded_budget("w", budget=0.02, finished=51, degraded=2, window=day)
    assert found is not None and (found.kind, found.subject, found.severity) == \
        ("degraded_budget", "w", "warning")
    assert "2 of 51 executions in the last 24h went out degraded (3.92%)" in found.message
    assert "degraded budget of 2%" in found.message and found.details["finished"] == 51
    critical = degraded_budget("w", budget=0.02, finished=20, degraded=1, window=day)
    assert critical is not None and critical.severity == "critical"  # 5%: past twice the budget


def budgeted_workflow() -> konduit.Workflow:
    wf = konduit.Workflow("budgeted", version=1, degraded_budget="2%")

    @wf.step(deadline="200ms", retry=konduit.Retry(max_attempts=1), fallback=lambda ctx: "fallback")
    async def render(ctx: konduit.Context) -> str:
        if ctx.input["slow"]:
            await asyncio.sleep(5)
        return "real"

    return wf


@pytest.mark.storage
def test_the_days_degraded_share_is_a_metric_and_an_alert_past_the_budget(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf, plain = budgeted_workflow(), konduit.Workflow("unbudgeted", version=1)
    plain.step(name="only")(lambda ctx: 1)
    app = make_app(wf, plain)
    with running_worker(app, concurrency=16, poll_interval=0.05, alert_interval=0):
        handles = [app.start(wf.name, {"slow": i == 0}) for i in range(50)]
        handles.append(app.start(plain.name, {}))
        for h in handles:
            h.wait(timeout=30)
        # 1 of 50 went out degraded: 2%, within the budget.
        assert evaluate(db_url, app.registry).findings == []
        app.start(wf.name, {"slow": True}).wait(timeout=30)
    # 2 of 51: 3.9%, past it.
    [raised] = evaluate(db_url, app.registry).raised
    assert (raised.kind, raised.subject, raised.workflow) == \
        ("degraded_budget", "budgeted", "budgeted")
    assert raised.severity == "warning" and raised.details["degraded"] == 2
    assert "2 of 51 executions" in raised.message
    assert evaluate(db_url, app.registry).raised == []  # one open alert, refreshed
    with serve(db_url, port=0) as exporter:
        samples = scrape(exporter.url)
    assert value(samples, "konduit_workflow_degraded_share", workflow="budgeted") == \
        pytest.approx(2 / 51)
    assert value(samples, "konduit_workflow_degraded_executions", workflow="budgeted") == 2
    assert value(samples, "konduit_workflow_finished_executions", workflow="budgeted") == 51
    assert value(samples, "konduit_workflow_degraded_share", workflow="unbudgeted") == 0
    assert value(samples, "konduit_alerts_open", kind="degraded_budget") == 1

    # A day later the first degraded run has left the window: 1 of 50 again, resolved.
    first_slow = handles[0].id
    rows(db_url, "UPDATE konduit_executions SET finished_at = finished_at - interval '25 hours'"
         " WHERE id = %s RETURNING id", first_slow)
    began = time.monotonic()
    [resolved] = evaluate(db_url, app.registry).resolved
    assert time.monotonic() - began < 5
    assert resolved.id == raised.id and "back within the budget" in resolved.details["resolution"]
    assert app.alerts() == []
