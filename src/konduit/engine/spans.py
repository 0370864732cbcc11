"""The spans of a workflow's steps in history: how long each took from the moment its join
fired to the moment it ended, as quantiles (``step_span_quantiles_by_workflow`` in
``db/sql/plans.sql``). What forecasts weigh the steps of a running execution by (the window
alerts of :mod:`konduit.engine.alerting`) and what ``konduit plan`` weighs a new one by
(:mod:`konduit.observe.plan`)."""

from __future__ import annotations

from konduit.core.durations import Duration
from konduit.core.forecast import DEFAULT_HISTORY, StepQuantiles, history_seconds
from konduit.db.database import Database


async def load_durations(
    db: Database, workflow: str, *, history: Duration = DEFAULT_HISTORY
) -> dict[str, StepQuantiles]:
    """Per step of ``workflow`` (any version): quantiles of its span over the finished
    executions created within ``history``."""
    rows = await db.all(
        "step_span_quantiles_by_workflow", workflow_name=workflow,
        history_seconds=history_seconds(history),
    )
    return {
        row["step"]: StepQuantiles(
            p50=float(row["p50"]),
            p95=float(row["p95"]),
            p99=float(row["p99"]),
            samples=int(row["samples"]),
            degraded=int(row["degraded"]),
        )
        for row in rows
    }
