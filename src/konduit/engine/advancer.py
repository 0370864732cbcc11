"""Apply fan-in decisions inside the caller's transaction.

The caller has already locked the execution row (``execution_lock``): every read of join state
below is a new statement after that lock, so under READ COMMITTED it sees every sibling
completion that committed before us, and no other completion of this execution can interleave.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from konduit.core.advance import (
    OK_OUTCOMES,
    Decision,
    Event,
    ExecutionState,
    MapExpanded,
    NeedStates,
    StepState,
    TaskEnded,
    advance,
)
from konduit.core.payloads import canonical_json
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Row, Tx
from konduit.engine import transitions
from konduit.engine.deadlines import budgets
from konduit.engine.registry import workflow_key

log = logging.getLogger("konduit.core.advance")

_STATE_FIELDS = (
    "status",
    "up_pending",
    "up_ok",
    "up_failed",
    "up_required_failed",
    "up_skipped",
    "tasks_total",
    "tasks_pending",
    "tasks_ok",
    "tasks_degraded",
    "tasks_failed",
)


def state_columns(states: list[StepState]) -> dict[str, list[Any]]:
    """Join counters as the parallel arrays the ``step_*_many`` queries unnest."""
    return {
        ("statuses" if name == "status" else f"{name}s"): [getattr(st, name) for st in states]
        for name in _STATE_FIELDS
    }


@dataclass
class _Loaded:
    state: StepState
    first_upstream_at: datetime | None


@dataclass
class _StepWrite:
    first_upstream_at: datetime | None = None
    last_upstream_at: datetime | None = None
    straggler: str | None = None
    fired: bool = False
    ended: bool = False


@dataclass
class Advanced:
    """What one transaction changed, for the caller's logs and notifications."""

    fired: list[str] = field(default_factory=list)
    queues: set[str] = field(default_factory=set)
    finished: str | None = None  # the execution's final status, when it ended now


class Advancer:
    """Loads join state under the execution lock, runs :func:`advance`, writes its decision."""

    def __init__(
        self,
        tx: Tx,
        spec: WorkflowSpec,
        execution_id: UUID,
        execution: ExecutionState,
        generation: int = 1,
    ):
        self.tx = tx
        self.spec = spec
        self.execution_id = execution_id
        self.execution = execution
        self.generation = generation  # repairs re-run steps as a new generation of their tasks
        self.loaded: dict[str, _Loaded] = {}
        self.writes: dict[str, _StepWrite] = {}
        self.result = Advanced()
        self.reason: str | None = None
        self.errors: dict[str, str] = {}  # last error line of steps that just failed, for reasons

    async def _load(self, steps: set[str]) -> None:
        wanted = sorted(s for s in steps if s not in self.loaded)
        if not wanted:
            return
        rows = await self.tx.all("step_get_many", execution_id=self.execution_id, steps=wanted)
        for row in rows:
            state = StepState(**{f: row[f] for f in _STATE_FIELDS})
            self.loaded[row["step"]] = _Loaded(state, row["first_upstream_at"])

    async def _decide(self, event: Event) -> Decision:
        await self._load({event.step, *self.spec.downstream[event.step]})
        while True:
            states = {name: item.state for name, item in self.loaded.items()}
            decision = advance(self.spec, self.execution, states, event)
            if isinstance(decision, NeedStates):
                await self._load(set(decision.steps))
                continue
            return decision

    async def handle(self, event: Event, *, ended_at: datetime | None = None) -> Advanced:
        """Apply ``event`` and every cascade it causes (map expansion), then write it all."""
        return await self.run_events([(event, ended_at)])

    async def start_steps(self, steps: list[str]) -> Advanced:
        """Create the tasks of steps that were made active outside :func:`advance` (the roots of
        a new execution, the first steps of a repair), with their map expansions."""
        queue: list[tuple[Event, datetime | None]] = []
        for step in steps:
            count = await self._create_tasks(step)
            if count is not None:
                queue.append((MapExpanded(step, count), None))
        return await self.run_events(queue)

    async def run_events(self, queue: list[tuple[Event, datetime | None]]) -> Advanced:
        """Decide each event in turn (cascades append to the queue); write once at the end."""
        while queue and self.execution.status == "running":
            current, at = queue.pop(0)
            decision = await self._decide(current)
            self._remember(current, decision, at)
            if decision.execution is not None:
                self.execution = decision.execution
            if self.execution.status != "running":
                break
            for step in decision.fire:
                count = await self._create_tasks(step)
                if count is not None:
                    queue.append((MapExpanded(step, count), at))
        await self._write_steps()
        await self._write_execution()
        for queue_name in sorted(self.result.queues):
            await self.tx.one("task_notify_ready", queue=queue_name)
        return self.result

    def _remember(self, event: Event, decision: Decision, at: datetime | None) -> None:
        for name, state in decision.states.items():
            self.loaded[name] = replace(self.loaded[name], state=state)
            self.writes.setdefault(name, _StepWrite())
        ended_step = next((s for s, _ in decision.ended if s == event.step), None)
        if ended_step is not None and at is not None:
            for d in self.spec.downstream[ended_step]:
                w = self.writes.setdefault(d, _StepWrite())
                loaded = self.loaded[d]
                if loaded.first_upstream_at is None:
                    loaded.first_upstream_at = at
                w.first_upstream_at = loaded.first_upstream_at
                if d in decision.fire:
                    w.last_upstream_at = at
                    w.straggler = ended_step
        for name in decision.fire:
            self.writes.setdefault(name, _StepWrite()).fired = True
            self.result.fired.append(name)
        for name, _ in decision.ended:
            self.writes.setdefault(name, _StepWrite()).ended = True
        if decision.reason:
            self.reason = decision.reason

    async def _write_steps(self) -> None:
        if not self.writes:
            return
        names = sorted(self.writes)
        states = [self.loaded[n].state for n in names]
        writes = [self.writes[n] for n in names]
        await self.tx.run(
            "step_update_many",
            execution_id=self.execution_id,
            steps=names,
            **state_columns(states),
            first_upstream_ats=[self.loaded[n].first_upstream_at for n in names],
            last_upstream_ats=[w.last_upstream_at for w in writes],
            stragglers=[w.straggler for w in writes],
            fireds=[w.fired for w in writes],
            endeds=[w.ended for w in writes],
        )

    async def _create_tasks(self, step: str) -> int | None:
        """Create the tasks of a step whose join fired. For a map step, returns its item count
        (the caller feeds it back as a :class:`MapExpanded` event)."""
        spec = self.spec[step]
        items: list[Any] = [None]
        if spec.is_map:
            upstream = await load_upstream(self.tx, self.spec, self.execution_id, step)
            source = (
                upstream.payloads[spec.after[0]] if len(spec.after) == 1 else upstream.payloads
            )
            try:
                items = list(spec.map_over(source))  # type: ignore[misc]
                for i, item in enumerate(items):
                    canonical_json(item, what=f"map step {step!r} item {i}")
            except Exception as exc:
                self.execution = ExecutionState("failed", self.execution.steps_pending)
                self.reason = f"map step {step!r}: over() failed: {type(exc).__name__}: {exc}"
                return None
        if items:
            budget = await budgets.budget(self.tx, self.spec.name, step, spec.deadline)
            await self.tx.run(
                "task_insert_many",
                execution_id=self.execution_id,
                workflow=workflow_key(self.spec.name, self.spec.version),
                generation=self.generation,
                steps=[step] * len(items),
                map_indexes=list(range(len(items))),
                items=[Jsonb(i) if spec.is_map else None for i in items],
                queues=[spec.queue] * len(items),
                priorities=[spec.priority] * len(items),
                max_attempts=[spec.retry.max_attempts] * len(items),
                deadline_seconds=[budget] * len(items),
            )
            self.result.queues.add(spec.queue)
        return len(items) if spec.is_map else None

    async def _write_execution(self) -> None:
        ex = self.execution
        if ex.status == "running":
            await self.tx.run(
                "execution_set_steps_pending_if_running",
                id=self.execution_id,
                steps_pending=ex.steps_pending,
            )
            return
        output = None
        if ex.status == "succeeded":
            output = await final_output(self.tx, self.spec, self.execution_id)
        reason = self.reason
        if reason is not None:
            # Name the cause, not only the step: "upstream 'charge' ended failed: CardDeclined".
            for step, error in self.errors.items():
                if f"'{step}' ended" in reason:
                    reason = f"{reason}: {error}"
                    break
        await finish_execution(
            self.tx, self.execution_id, ex.status, output, reason, ex.steps_pending
        )
        self.result.finished = ex.status


async def finish_execution(
    tx: Tx, execution_id: UUID, status: str, output: Any, error: str | None, steps_pending: int
) -> bool:
    """End a running execution; its unfinished tasks and steps are cancelled."""
    row = await tx.one(
        "execution_finish_if_running",
        id=execution_id,
        status=status,
        output=Jsonb(output),
        error=error,
        steps_pending=steps_pending,
    )
    if row is None:
        return False
    await tx.run("execution_output_insert", id=execution_id, version=row["output_version"])
    if status != "succeeded":
        cancelled = await transitions.cancel_unfinished(tx, execution_id, f"execution {status}")
        if cancelled:
            await tx.run("attempt_finish_open_for_tasks", task_ids=cancelled, outcome="cancelled")
        await tx.run("step_cancel_unfinished", execution_id=execution_id)
    await tx.one("execution_notify_finished", id=str(execution_id))
    return True


@dataclass
class Upstream:
    payloads: dict[str, Any]
    outcomes: dict[str, str]


async def load_upstream(tx: Tx, spec: WorkflowSpec, execution_id: UUID, step: str) -> Upstream:
    """Payloads of the succeeded/degraded upstream tasks of ``step`` (a list in item order for a
    map step) and the outcome of every upstream step. Read once, when the step runs."""
    after = list(spec[step].after)
    return await load_step_outputs(tx, spec, execution_id, after)


async def load_step_outputs(
    tx: Tx, spec: WorkflowSpec, execution_id: UUID, steps: list[str]
) -> Upstream:
    if not steps:
        return Upstream({}, {})
    rows: list[Row] = await tx.all("output_get_for_steps", execution_id=execution_id, steps=steps)
    outcome_rows = await tx.all("step_get_outcomes", execution_id=execution_id, steps=steps)
    payloads: dict[str, Any] = {s: [] for s in steps if spec[s].is_map}
    for row in rows:
        if row["status"] not in OK_OUTCOMES:
            continue
        if spec[row["step"]].is_map:
            payloads[row["step"]].append(row["payload"])
        else:
            payloads[row["step"]] = row["payload"]
    return Upstream(payloads, {r["step"]: r["status"] for r in outcome_rows})


async def final_output(tx: Tx, spec: WorkflowSpec, execution_id: UUID) -> Any:
    sinks = list(spec.sinks)
    found = await load_step_outputs(tx, spec, execution_id, sinks)
    if len(sinks) == 1:
        return found.payloads.get(sinks[0])
    return {s: found.payloads.get(s) for s in sinks}


async def record_events(
    tx: Tx,
    spec: WorkflowSpec,
    execution: Row,
    events: list[tuple[TaskEnded, datetime | None]],
    errors: dict[str, str] | None = None,
) -> Advanced:
    """Advance a locked execution after some of its tasks ended (in the order given).
    ``errors`` maps failed steps to their error, to say why when the execution fails."""
    state = ExecutionState(execution["status"], execution["steps_pending"])
    advancer = Advancer(tx, spec, execution["id"], state, execution["generation"])
    advancer.errors = dict(errors or {})
    return await advancer.run_events(list(events))
