"""Loading what steps produced: the upstream outputs a task runs on, the payloads a map step
fans out over, and an execution's final output.

Outputs are read once, when they are consumed (a task starts, a map expands, an execution
ends), never on each completion of a join's branches: per completion the fan-in decision reads
only the join's counters (DESIGN.md, fan-in protocol rule 5).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from konduit.core.advance import OK_OUTCOMES
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Row, Tx

UPSTREAM_PAGE_ROWS = 5_000
"""Rows of a map's upstream read (and decoded) at a time."""


@dataclass
class Upstream:
    payloads: dict[str, Any]
    outcomes: dict[str, str]


def outputs_query(workflow: WorkflowSpec, steps: Iterable[str]) -> str:
    """The statement that reads the outputs of ``steps``: a map among them makes the read as
    wide as its items, and that one is planned for its own size each time (queries.py)."""
    if any(workflow[s].is_map for s in steps):
        return "output_get_for_steps_wide"
    return "output_get_for_steps"


def group_payloads(workflow: WorkflowSpec, steps: list[str], rows: list[Row],
                   loads: Callable[[str], Any] = json.loads) -> dict[str, Any]:
    """Decode ``output_get_for_steps`` rows into step -> payload of the succeeded or degraded
    steps (a list in item order for a map step). ``loads`` decodes the JSON text: the
    transaction's ``tx.io.loads``, which opens what the payload codec sealed."""
    payloads: dict[str, Any] = {}
    merge_payloads(workflow, steps, rows, payloads, loads)
    return payloads


def merge_payloads(workflow: WorkflowSpec, steps: list[str], rows: list[Row],
                   payloads: dict[str, Any], loads: Callable[[str], Any] = json.loads) -> None:
    """Decode a page of ``output_get_for_steps`` rows (in step and item order) into
    ``payloads``, after the pages before it."""
    for s in steps:
        if workflow[s].is_map:
            payloads.setdefault(s, [])
    for row in rows:
        if row["status"] not in OK_OUTCOMES:
            continue
        payload = None if row["payload"] is None else loads(row["payload"])
        if workflow[row["step"]].is_map:
            payloads[row["step"]].append(payload)
        else:
            payloads[row["step"]] = payload


async def load_upstream(tx: Tx, spec: WorkflowSpec, execution_id: UUID, step: str) -> Upstream:
    """Payloads of the succeeded/degraded upstream tasks of ``step`` (a list in item order for a
    map step) and the outcome of every upstream step. Read once, when the step runs."""
    after = list(spec[step].after)
    return await load_step_outputs(tx, spec, execution_id, after)


async def load_step_outputs(
    tx: Tx, spec: WorkflowSpec, execution_id: UUID, steps: list[str], *, outcomes: bool = True
) -> Upstream:
    """The payloads of ``steps`` and, with ``outcomes``, how each step ended (without it,
    ``Upstream.outcomes`` is empty and that statement is not run)."""
    if not steps:
        return Upstream({}, {})
    query = outputs_query(spec, steps)
    if query == "output_get_for_steps" and outcomes:
        # Both reads in one statement: one round trip fewer for every join that starts.
        both = await tx.all("output_get_for_steps_with_outcomes",
                            execution_id=execution_id, steps=steps)
        return Upstream(group_payloads(spec, steps, both, tx.io.loads),
                        {r["step"]: r["step_status"] for r in both if r["step_status"] is not None})
    ended: dict[str, str] = {}
    if outcomes:
        outcome_rows = await tx.all("step_get_outcomes", execution_id=execution_id, steps=steps)
        ended = {r["step"]: r["status"] for r in outcome_rows}
    if query == "output_get_for_steps":
        rows: list[Row] = await tx.all(query, execution_id=execution_id, steps=steps)
        return Upstream(group_payloads(spec, steps, rows, tx.io.loads), ended)
    # A map's items: read in pages through a cursor and decoded page by page on a thread, so
    # the worker never holds the whole result as text beside its decoded payloads, and its
    # loop (heartbeats, other tasks) keeps running while 100,000 payloads are decoded.
    payloads: dict[str, Any] = {s: [] for s in steps if spec[s].is_map}  # a map of no items too
    async for page in tx.stream(query, page_rows=UPSTREAM_PAGE_ROWS,
                                execution_id=execution_id, steps=steps):
        await asyncio.to_thread(merge_payloads, spec, steps, page, payloads, tx.io.loads)
    return Upstream(payloads, ended)


async def final_output(tx: Tx, spec: WorkflowSpec, execution_id: UUID) -> Any:
    """What ``ExecutionResult.output`` holds: the single final step's payload, or a dict of
    final step -> payload when there are several."""
    sinks = list(spec.sinks)
    # Only the payloads: the steps' outcomes are a statement (a round trip in the round's
    # transaction, under the execution lock) that nothing here reads.
    found = await load_step_outputs(tx, spec, execution_id, sinks, outcomes=False)
    if len(sinks) == 1:
        return found.payloads.get(sinks[0])
    return {s: found.payloads.get(s) for s in sinks}
