"""What the execution page (and the JSON of one execution) reads: :class:`Detail`.

A map step of 10,000 items must not become 10,000 timeline rows or 10,000 attempts read on every
refresh: with ``collapse_maps`` its attempts are left out and each map step comes as one
:class:`~konduit.web.summaries.MapSummary` instead, and only the first few failed attempts of a
step carry their full traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from konduit.db.database import Row
from konduit.engine.client import Client, ExecutionResult
from konduit.observe.alerts import AlertRecord
from konduit.web.summaries import MapSummary, map_summaries

FAILURES_PER_STEP = 20  # tracebacks shown per step on the page; the items page has the rest


@dataclass
class Detail:
    """Everything the execution page shows."""

    result: ExecutionResult
    row: Row
    spec_steps: list[dict[str, Any]]
    steps: list[Row]
    attempts: list[Row]  # with collapse_maps: those of the steps that are not map steps
    versions: list[Row]
    late: list[Row]
    auto_repair: str | None = None  # the repair_within line (auto-repaired at ..., pending ...)
    maps: dict[str, MapSummary] = field(default_factory=dict)
    failures: list[Row] = field(default_factory=list)  # attempts that ended with an error
    parent: Row | None = None  # the execution whose child-workflow step started this one
    children: list[Row] = field(default_factory=list)  # executions its child steps started
    stall: AlertRecord | None = None  # the open execution_stalled alert: why nothing can run
    # step -> its task's budget, and what the window cut it from (konduit.core.budgets)
    budgets: dict[str, Row] = field(default_factory=dict)


async def load_detail(client: Client, execution_id: str, *, collapse_maps: bool = False) -> Detail:
    """One execution with its steps, attempts, output versions and late results; with
    ``collapse_maps`` (the page) map steps are summarised and failed attempts listed."""
    result = await client.get(execution_id)
    row = await client.db.one("execution_get", id=result.id)
    workflow = await client.db.one("workflow_get", name=result.workflow, version=result.version)
    assert row is not None
    spec_steps = list(workflow["spec"]["steps"]) if workflow else []
    # The page's views and templates read plain dicts: the records become them here.
    steps = [s.to_dict() for s in await client.steps(result.id)]
    maps: dict[str, MapSummary] = {}
    failures: list[Row] = []
    if collapse_maps:
        mapped = [s["name"] for s in spec_steps if s.get("map")]
        attempts = await client.db.all("attempt_list_by_execution_except_steps",
                                       execution_id=result.id, steps=mapped)
        if mapped:
            maps = map_summaries(await client.db.all("task_summarize_by_step", execution_id=result.id,
                                                     steps=mapped))
        failures = await client.db.all("attempt_list_failed_by_execution", execution_id=result.id,
                                       per_step=FAILURES_PER_STEP)
    else:
        attempts = await client.db.all("attempt_list_by_execution", execution_id=result.id)
    payloads = await client.payloads(result.id)
    return Detail(result, row, spec_steps, steps, attempts,
                  [v.to_dict() for v in await client.outputs(result.id)],
                  [p.to_dict() for p in payloads if p.source == "late"],
                  await client.auto_repair_status(result.id), maps, failures,
                  await client.db.one("execution_parent_of", execution_id=result.id),
                  await client.db.all("execution_children_list", execution_id=result.id),
                  None if result.finished else await client.stall(result.id),
                  {r["step"]: r for r in await client.db.all("task_list_budgets_by_execution",
                                                             execution_id=result.id)})
