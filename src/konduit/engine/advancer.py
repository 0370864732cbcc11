"""Apply fan-in decisions inside the caller's transaction.

The caller has already locked the execution row (``execution_lock``): every read of join state
below is a new statement after that lock, so under READ COMMITTED it sees every sibling
completion that committed before us, and no other completion of this execution can interleave.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable, Iterable, Sequence
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
from konduit.core.model import ExecutionStatus
from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json
from konduit.core.waits import parent_task_of
from konduit.core.workflow import StepSpec, WorkflowSpec
from konduit.db.database import Row, Tx
from konduit.engine import step_rows, transitions
from konduit.engine.deadlines import cut_columns, task_budgets
from konduit.engine.registry import workflow_key
from konduit.errors import PayloadError

log = logging.getLogger(__name__)

MAP_CHUNK_ROWS = 5_000
"""Map tasks created per statement: each chunk's parameters are built on the event loop, so a
chunk must stay small enough not to stall heartbeats, yet big enough to keep round trips few."""

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


@dataclass(frozen=True)
class ChildEnded:
    """A child workflow's execution ended: once that transaction commits, the waiting task of
    its parent's child-workflow step may be woken (:func:`konduit.engine.waits.wake_parent`)."""

    child_id: UUID
    parent_task_id: int


@dataclass(frozen=True)
class Finished:
    """An execution ended in the caller's transaction; ``child_ended`` when it is a child."""

    child_ended: ChildEnded | None = None


@dataclass
class Advanced:
    """What one transaction changed, for the caller's logs and notifications."""

    fired: list[str] = field(default_factory=list)
    queues: set[str] = field(default_factory=set)
    finished: str | None = None  # the execution's final status, when it ended now
    # When the execution that ended now is a child workflow: its parent's step to wake once the
    # transaction has committed (the waking process's maintenance does it otherwise).
    child_ended: ChildEnded | None = None


class Advancer:
    """Loads join state under the execution lock, runs :func:`advance`, writes its decision."""

    def __init__(
        self,
        tx: Tx,
        spec: WorkflowSpec,
        execution_id: UUID,
        execution: ExecutionState,
        generation: int = 1,
        *,
        max_payload_bytes: int = DEFAULT_MAX_BYTES,
        defer_writes: bool = False,
        window_left: float | None = None,
    ):
        self.tx = tx
        # Seconds left in the execution's window when it was locked (None: no window, or a
        # repair): the budgets of the tasks created here are cut by it (konduit.core.budgets).
        self.window_left = window_left
        # With defer_writes, a decision that leaves the execution running writes nothing at the
        # end of run_events: the caller writes the step rows and counts of a whole round of
        # executions in one statement each (write_deferred) and wakes their queues once.
        self.defer_writes = defer_writes
        self.deferred = False
        self.spec = spec
        self.execution_id = execution_id
        self.execution = execution
        self.stored_steps_pending = execution.steps_pending  # as the row holds it now
        self.max_payload_bytes = max_payload_bytes
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
        self.preload(await step_rows.read(self.tx, [(self.execution_id, s) for s in wanted]))

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
        """Create the tasks of steps that were made active outside :func:`advance` (the first
        steps of a repair), with their map expansions: every plain step's task in one
        statement."""
        expanded = await self._create_tasks(steps)
        return await self.run_events([(MapExpanded(step, count), None) for step, count in expanded])

    async def run_events(self, queue: list[tuple[Event, datetime | None]]) -> Advanced:
        """Decide each event in turn (cascades append to the queue); write once at the end."""
        # The join state every event will read, in one statement: sibling branches are distinct
        # steps, so a batch of them would otherwise read one step row per outcome.
        await self._load({s for event, _ in queue
                          for s in (event.step, *self.spec.downstream[event.step])})
        while queue and self.execution.status == "running":
            current, at = queue.pop(0)
            decision = await self._decide(current)
            self._remember(current, decision, at)
            if decision.execution is not None:
                self.execution = decision.execution
            if self.execution.status != "running":
                break
            for step, count in await self._create_tasks(decision.fire):
                queue.append((MapExpanded(step, count), at))
        if self.defer_writes and self.execution.status == "running":
            self.deferred = True
            return self.result
        await self._write_steps()
        await self._write_execution()
        for queue_name in sorted(self.result.queues):
            await self.tx.one("task_notify_ready", queue=queue_name)
        return self.result

    def step_writes(self) -> list[tuple[str, StepState, datetime | None, datetime | None, str | None,
                                        bool, bool]]:
        """The step rows this decision changed, in step order: (step, state, first_upstream_at,
        last_upstream_at, straggler, fired, ended), for a caller that writes them
        (defer_writes)."""
        return [(name, self.loaded[name].state, self.loaded[name].first_upstream_at,
                 w.last_upstream_at, w.straggler, w.fired, w.ended)
                for name, w in sorted(self.writes.items())]

    def preload(self, rows: Iterable[Row]) -> None:
        """Join state read by the caller for several executions at once (see write_deferred)."""
        for row in rows:
            self.loaded[row["step"]] = _Loaded(step_rows.state_of(row), row["first_upstream_at"])

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
        await step_rows.write(self.tx, [(self.execution_id, *w) for w in self.step_writes()])

    async def _create_tasks(self, steps: Sequence[str]) -> list[tuple[str, int]]:
        """Create the tasks of steps whose join fired: the tasks of all plain steps in one
        statement (a step fanning out to 500 branches is one round trip, not 500), each map
        step through its chunked expansion. Returns each expanded map step with its item count
        (the caller feeds it back as a :class:`MapExpanded` event)."""
        plain = [self.spec[s] for s in steps if not self.spec[s].is_map]
        if plain:
            found = await task_budgets(self.tx, self.spec, plain, self.window_left)
            await self.tx.send(
                "task_insert_many",
                execution_id=self.execution_id,
                workflow=workflow_key(self.spec.name, self.spec.version),
                generation=self.generation,
                steps=[s.name for s in plain],
                map_indexes=[0] * len(plain),
                items=[None] * len(plain),
                queues=[s.queue for s in plain],
                priorities=[s.priority for s in plain],
                max_attempts=[s.retry.max_attempts for s in plain],
                deadline_seconds=[None if b is None else b.seconds for b in found],
                limiteds=[s.flow is not None for s in plain],
                **cut_columns(found),
            )
            self.result.queues.update(s.queue for s in plain)
        expanded: list[tuple[str, int]] = []
        for step in steps:
            if self.spec[step].is_map:
                count = await self._create_map_tasks(self.spec[step])
                if count is not None:
                    expanded.append((step, count))
        return expanded

    async def _create_map_tasks(self, spec: StepSpec) -> int | None:
        """Expand a map step into one task per item. The user's ``over()`` and the encoding of
        every item run on a thread, and the tasks are inserted in chunks: a map of a million
        items must not stall the event loop that also runs this worker's heartbeats and other
        tasks. The execution stays locked throughout, so the fan-out commits with its decision."""
        step = spec.name
        # The upstream payload may be the big list the map fans out over: it is decoded on the
        # thread too, not by the driver on this loop.
        rows = await self.tx.all(outputs_query(self.spec, spec.after),
                                 execution_id=self.execution_id, steps=list(spec.after))
        over = spec.map_over
        assert over is not None

        def expand() -> list[str]:
            source = map_source(self.spec, spec, rows)
            return expand_map(over, source, max_items=spec.max_items,
                              max_bytes=self.max_payload_bytes)

        try:
            items = await asyncio.to_thread(expand)
        except (MapTooLarge, PayloadError) as exc:
            self._fail(f"map step {step!r} cannot fan out: {exc}")
            return None
        except Exception as exc:
            self._fail(f"map step {step!r}: over() failed: {type(exc).__name__}: {exc}")
            return None
        if not items:
            return 0
        (budget,) = await task_budgets(self.tx, self.spec, [spec], self.window_left)
        cut = cut_columns([budget])
        for first in range(0, len(items), MAP_CHUNK_ROWS):
            await self.tx.run(
                "task_insert_map_chunk_if_running",
                execution_id=self.execution_id,
                workflow=workflow_key(self.spec.name, self.spec.version),
                generation=self.generation,
                step=step,
                first_index=first,
                # One text, not a text[]: compact JSON never holds a raw newline, and psycopg
                # escapes the elements of a text array one by one in Python, on this loop.
                items="\n".join(items[first : first + MAP_CHUNK_ROWS]),
                queue=spec.queue,
                priority=spec.priority,
                max_attempts=spec.retry.max_attempts,
                deadline_seconds=None if budget is None else budget.seconds,
                limited=spec.flow is not None,
                deadline_uncut=cut["deadline_uncuts"][0],
                deadline_reserve=cut["deadline_reserves"][0],
            )
        self.result.queues.add(spec.queue)
        return len(items)

    def _fail(self, reason: str) -> None:
        self.execution = ExecutionState(ExecutionStatus.FAILED, self.execution.steps_pending)
        self.reason = reason

    async def _write_execution(self) -> None:
        ex = self.execution
        if ex.status == "running":
            # Most completions (every item of a map but the last) end no step: leave the
            # execution row alone then. It is the hottest row of a fan-out, and rewriting it
            # unchanged would leave a dead tuple per completion.
            if ex.steps_pending != self.stored_steps_pending:
                await self.tx.run(
                    "execution_set_steps_pending_many_if_running_and_changed",
                    ids=[self.execution_id],
                    steps_pendings=[ex.steps_pending],
                )
                self.stored_steps_pending = ex.steps_pending
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
        finished = await finish_execution(
            self.tx, self.execution_id, ex.status, output, reason, ex.steps_pending
        )
        self.result.finished = ex.status
        if finished is not None:
            self.result.child_ended = finished.child_ended


UPSTREAM_PAGE_ROWS = 5_000
"""Rows of a map's upstream read (and decoded) at a time."""


def outputs_query(workflow: WorkflowSpec, steps: Iterable[str]) -> str:
    """The statement that reads the outputs of ``steps``: a map among them makes the read as
    wide as its items, and that one is planned for its own size each time (queries.py)."""
    if any(workflow[s].is_map for s in steps):
        return "output_get_for_steps_wide"
    return "output_get_for_steps"


def map_source(workflow: WorkflowSpec, spec: StepSpec, rows: list[Row]) -> Any:
    """What ``over()`` receives, from ``output_get_for_steps`` rows: the upstream payload, or a
    dict of step -> payload with several upstreams (a list in item order for a map)."""
    payloads = group_payloads(workflow, list(spec.after), rows)
    return payloads[spec.after[0]] if len(spec.after) == 1 else payloads


def group_payloads(workflow: WorkflowSpec, steps: list[str], rows: list[Row]) -> dict[str, Any]:
    """Decode ``output_get_for_steps`` rows into step -> payload of the succeeded or degraded
    steps (a list in item order for a map step)."""
    payloads: dict[str, Any] = {}
    merge_payloads(workflow, steps, rows, payloads)
    return payloads


def merge_payloads(workflow: WorkflowSpec, steps: list[str], rows: list[Row],
                   payloads: dict[str, Any]) -> None:
    """Decode a page of ``output_get_for_steps`` rows (in step and item order) into
    ``payloads``, after the pages before it."""
    for s in steps:
        if workflow[s].is_map:
            payloads.setdefault(s, [])
    for row in rows:
        if row["status"] not in OK_OUTCOMES:
            continue
        payload = None if row["payload"] is None else json.loads(row["payload"])
        if workflow[row["step"]].is_map:
            payloads[row["step"]].append(payload)
        else:
            payloads[row["step"]] = payload


class MapTooLarge(Exception):
    """``over()`` produced more items than the map step's ``max_items``."""


def expand_map(
    over: Callable[[Any], Iterable[Any]],
    source: Any,
    *,
    max_items: int,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> list[str]:
    """The items of a map step as canonical JSON texts, in order. Runs the user's ``over()``
    (on a thread: it may take a while) and stops reading it one item past ``max_items``, so an
    endless or enormous iterable fails with the limit rather than exhausting memory."""
    items: list[str] = []
    for i, item in enumerate(itertools.islice(over(source), max_items + 1)):
        if i == max_items:
            raise MapTooLarge(
                f"over() produced more than {max_items:,} items, the step's limit "
                f"(raise it with Workflow.map(max_items=...))"
            )
        items.append(canonical_json(item, what=f"item {i}", max_bytes=max_bytes))
    return items


async def finish_execution(
    tx: Tx, execution_id: UUID, status: str, output: Any, error: str | None, steps_pending: int
) -> Finished | None:
    """End a running execution; its unfinished tasks and steps are cancelled. None when it was
    not running. When it is a child workflow (its idempotency key names its parent's task, read
    back by the finish statement itself), the answer says which task to wake after commit: the
    parent's execution is older, so locking it here would break the id order of locks."""
    row = await tx.one(
        "execution_finish_if_running",
        id=execution_id,
        status=status,
        output=Jsonb(output),
        error=error,
        steps_pending=steps_pending,
    )
    if row is None:
        return None
    await tx.run("execution_output_insert", id=execution_id, version=row["output_version"])
    if row["webhooks"]:  # the outbox: deliveries commit with the finish (docs/webhooks.md)
        await tx.send("webhook_delivery_insert_for_execution_if_finished", id=execution_id)
    if status != "succeeded":
        cancelled = await transitions.cancel_unfinished(tx, execution_id, f"execution {status}")
        if cancelled:
            await tx.run("attempt_finish_open_for_tasks", task_ids=cancelled, outcome="cancelled")
            await tx.one("execution_notify_stopped", id=str(execution_id))
            await _cancel_children(tx, execution_id, status)
        await tx.run("step_cancel_unfinished", execution_id=execution_id)
    if row["finish_waited"]:
        await tx.one("execution_notify_finished", id=str(execution_id))
    parent_task = parent_task_of(row["idempotency_key"])
    return Finished(None if parent_task is None else ChildEnded(execution_id, parent_task))


async def _cancel_children(tx: Tx, execution_id: UUID, status: str) -> None:
    """A stopped execution stops the child executions its child-workflow steps started (and
    theirs, recursively); asked only when it had unfinished tasks, so an ordinary execution's
    end costs no statement more. Children are locked after their parent: a child's id is newer
    (UUIDv7), so this is the id order of executions."""
    for child in await tx.all("execution_children_running", execution_id=execution_id):
        row = await tx.one("execution_lock", id=child["id"])
        if row is not None and row["status"] == "running":
            # Its parent's waiting task was cancelled above, in this transaction: nothing to
            # wake, so the answer is dropped.
            await finish_execution(tx, child["id"], "cancelled", None,
                                   f"its parent execution {execution_id} ended {status}",
                                   row["steps_pending"])


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
    outcome_rows = await tx.all("step_get_outcomes", execution_id=execution_id, steps=steps)
    outcomes = {r["step"]: r["status"] for r in outcome_rows}
    query = outputs_query(spec, steps)
    if query == "output_get_for_steps":
        rows: list[Row] = await tx.all(query, execution_id=execution_id, steps=steps)
        return Upstream(group_payloads(spec, steps, rows), outcomes)
    # A map's items: read in pages through a cursor and decoded page by page on a thread, so
    # the worker never holds the whole result as text beside its decoded payloads, and its
    # loop (heartbeats, other tasks) keeps running while 100,000 payloads are decoded.
    payloads: dict[str, Any] = {s: [] for s in steps if spec[s].is_map}  # a map of no items too
    async for page in tx.stream(query, page_rows=UPSTREAM_PAGE_ROWS,
                                execution_id=execution_id, steps=steps):
        await asyncio.to_thread(merge_payloads, spec, steps, page, payloads)
    return Upstream(payloads, outcomes)


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
    *,
    max_payload_bytes: int = DEFAULT_MAX_BYTES,
) -> Advanced:
    """Advance a locked execution after some of its tasks ended (in the order given).
    ``errors`` maps failed steps to their error, to say why when the execution fails;
    ``max_payload_bytes`` bounds each item of a map step that fans out."""
    state = ExecutionState(execution["status"], execution["steps_pending"])
    advancer = Advancer(
        tx, spec, execution["id"], state, execution["generation"],
        max_payload_bytes=max_payload_bytes, window_left=execution.get("window_left_seconds"),
    )
    advancer.errors = dict(errors or {})
    return await advancer.run_events(list(events))
