"""What the execution page (and the JSON of one execution) reads: :class:`Detail`.

A map step of 10,000 items must not become 10,000 timeline rows or 10,000 attempts read on every
refresh: with ``collapse_maps`` its attempts are left out and each map step comes as one
:class:`~konduit.web.summaries.MapSummary` instead, and only the first few failed attempts of a
step carry their full traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from konduit.engine.client import ExecutionResult
from konduit.reads import ReadModel
from konduit.records import AlertRecord, VersionState
from konduit.web.summaries import MapSummary, map_summaries

Fields = dict[str, Any]
"""A record as the page's templates read it (konduit.records, turned into a dict)."""

FAILURES_PER_STEP = 20  # tracebacks shown per step on the page; the items page has the rest
LOGGED_ATTEMPTS = 100  # attempts whose logs the page shows; the API has them all
JOURNALED_CALLS = 500  # durable calls the page shows; the API has them all


@dataclass
class Detail:
    """Everything the execution page shows."""

    result: ExecutionResult
    row: Fields
    spec_steps: list[dict[str, Any]]
    steps: list[Fields]
    attempts: list[Fields]  # with collapse_maps: those of the steps that are not map steps
    versions: list[Fields]
    late: list[Fields]
    auto_repair: str | None = None  # the repair_within line (auto-repaired at ..., pending ...)
    maps: dict[str, MapSummary] = field(default_factory=dict)
    failures: list[Fields] = field(default_factory=list)  # attempts that ended with an error
    parent: Fields | None = None  # the execution whose child-workflow step started this one
    children: list[Fields] = field(default_factory=list)  # executions its child steps started
    stall: AlertRecord | None = None  # the open execution_stalled alert: why nothing can run
    # step -> its task's budget, and what the window cut it from (konduit.core.budgets)
    budgets: dict[str, Fields] = field(default_factory=dict)
    # what handlers logged, one entry per attempt that logged (``text``: the lines to show)
    logs: list[Fields] = field(default_factory=list)
    # Its version, when it runs and no live worker serves that version (the page's banner).
    unserved: VersionState | None = None
    # The policy its tasks were created with (retries, budget, queue, priority, revision).
    task_policies: list[Fields] = field(default_factory=list)
    # A fork's origin (forked_from, forked_at_step, origin_status), and the forks of this one.
    fork_origin: Fields | None = None
    forks: list[Fields] = field(default_factory=list)
    # The durable calls its handlers recorded (ctx.call), by step, item and position.
    journal: list[Fields] = field(default_factory=list)
    # Its durable streams (ctx.stream): the page follows each live (static/streams.js).
    streams: list[Fields] = field(default_factory=list)


async def load_detail(model: ReadModel, execution_id: str, *, collapse_maps: bool = False) -> Detail:
    """One execution with its steps, attempts, output versions and late results; with
    ``collapse_maps`` (the page) map steps are summarised and failed attempts listed."""
    result = await model.view(execution_id)
    row = (await model.execution(result.id)).to_dict()
    workflow = await model.workflow(result.workflow, result.version)
    spec_steps = list(workflow.spec["steps"]) if workflow else []
    # The page's views and templates read plain dicts: the records become them here.
    steps = [s.to_dict() for s in await model.steps(result.id)]
    maps: dict[str, MapSummary] = {}
    failures: list[Fields] = []
    if collapse_maps:
        mapped = [s["name"] for s in spec_steps if s.get("map")]
        attempts = [a.to_dict() for a in await model.attempts(result.id, except_steps=mapped)]
        maps = map_summaries([c.to_dict() for c in await model.map_counts(result.id, mapped)])
        failures = [f.to_dict() for f in await model.failed_attempts(result.id,
                                                                      FAILURES_PER_STEP)]
    else:
        attempts = [a.to_dict() for a in await model.attempts(result.id)]
    payloads = await model.payloads(result.id)
    # The cheap check first: counting the version's running executions (for the banner) reads
    # them all, 0.3 s at 200,000 running, too much for every refresh of a served execution.
    unserved = None
    if not result.finished and not await model.workflow_served(result.workflow, result.version):
        unserved = next((v for v in await model.versions(result.workflow)
                         if v.version == result.version and v.unserved), None)
    detail = Detail(result, row, spec_steps, steps, attempts,
                  [v.to_dict() for v in await model.outputs(result.id)],
                  [p.to_dict() for p in payloads if p.source == "late"],
                  await model.auto_repair_status(result.id), maps, failures,
                  None if (parent := await model.parent(result.id)) is None else parent.to_dict(),
                  [c.to_dict() for c in await model.children(result.id)],
                  None if result.finished else await model.stall(result.id),
                  {b.step: b.to_dict() for b in await model.budgets(result.id)},
                  [log_fields(a.to_dict()) for a in await model.attempt_logs(
                      result.id, limit=LOGGED_ATTEMPTS if collapse_maps else None)],
                  unserved, [p.to_dict() for p in await model.task_policies(result.id)],
                  await model.fork_origin(result.id), await model.forks(result.id),
                  [e.to_dict() for e in await model.journal(
                      result.id, limit=JOURNALED_CALLS if collapse_maps else None)],
                  [st.to_dict() for st in await model.streams(result.id)])
    return detail


def log_fields(entry: Fields) -> Fields:
    """An attempt's logs as the page shows them: one line per record, its time (local, to the
    millisecond), level, logger and message, then how many were dropped."""
    lines = []
    for r in entry["records"]:
        try:
            at = datetime.fromtimestamp(float(r.get("at", 0))).strftime("%H:%M:%S.%f")[:-3]
        except (TypeError, ValueError, OverflowError, OSError):
            at = "?"
        lines.append(f"{at} {r.get('level', '')} {r.get('logger', '')}: {r.get('message', '')}")
    if entry["dropped"]:
        lines.append(f"… {entry['dropped']} more dropped (an attempt keeps 200 records, 64 KiB)")
    return entry | {"text": "\n".join(lines),
                    "key": (entry["step"], entry["map_index"], entry["generation"],
                            entry["attempt"])}
