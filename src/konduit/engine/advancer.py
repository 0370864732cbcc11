"""The decision writer: apply fan-in decisions inside the caller's transaction.

The caller has already locked the execution row (``execution_lock``): every read of join state
below is a new statement after that lock, so under READ COMMITTED it sees every sibling
completion that committed before us, and no other completion of this execution can interleave.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from konduit.core.advance import (
    Decision,
    Event,
    ExecutionState,
    MapExpanded,
    NeedStates,
    StepState,
    advance,
)
from konduit.core.model import ExecutionStatus
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.core.workflow import StepSpec, WorkflowSpec
from konduit.db.database import Row, Tx
from konduit.engine import step_rows
from konduit.engine.deadlines import cut_columns, task_budgets
from konduit.engine.finish import ChildEnded, finish_execution
from konduit.engine.maps import CannotFanOut, create_map_tasks
from konduit.engine.outputs import final_output
from konduit.engine.registry import workflow_key


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
        # executions in one statement each (Round.write_decisions, engine/round.py) and wakes
        # their queues once.
        self.defer_writes = defer_writes
        self.deferred = False
        self.spec = spec
        self.execution_id = execution_id
        self.execution = execution
        self.stored_steps_pending = execution.steps_pending  # as the row holds it now
        self.max_payload_bytes = max_payload_bytes
        self.generation = generation  # repairs re-run steps as a new generation of their tasks
        self.loaded: dict[str, _Loaded] = {}
        # The state of each loaded step, as advance() reads it: kept beside ``loaded`` rather
        # than rebuilt from it for every event (advance never changes the mapping it is given).
        self.states: dict[str, StepState] = {}
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
        # Usually all loaded already (run_events and Round.read_join_state read ahead): no
        # await then.
        if event.step not in self.loaded \
                or any(d not in self.loaded for d in self.spec.downstream[event.step]):
            await self._load({event.step, *self.spec.downstream[event.step]})
        while True:
            decision = advance(self.spec, self.execution, self.states, event)
            if isinstance(decision, NeedStates):
                await self._load(set(decision.steps))
                continue
            return decision

    @classmethod
    def for_locked(cls, tx: Tx, spec: WorkflowSpec, execution: Row, *,
                   max_payload_bytes: int = DEFAULT_MAX_BYTES,
                   defer_writes: bool = False) -> Advancer:
        """The decision of an execution whose row the caller locked in ``tx`` (a row of
        ``execution_lock`` or ``execution_lock_many_in_id_order``)."""
        return cls(tx, spec, execution["id"],
                   ExecutionState(execution["status"], execution["steps_pending"]),
                   execution["generation"], max_payload_bytes=max_payload_bytes,
                   defer_writes=defer_writes, window_left=execution["window_left_seconds"])

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
        """Join state the caller read for several executions at once (Round.read_join_state)."""
        for row in rows:
            state = step_rows.state_of(row)
            self.loaded[row["step"]] = _Loaded(state, row["first_upstream_at"])
            self.states[row["step"]] = state

    def _remember(self, event: Event, decision: Decision, at: datetime | None) -> None:
        for name, state in decision.states.items():
            # In place: nothing else holds a _Loaded (a copy per changed step cost a
            # dataclasses.replace on every completion).
            self.loaded[name].state = state
            self.states[name] = state
            if name not in self.writes:
                self.writes[name] = _StepWrite()
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
                policy_revision=self.spec.policy_revision,
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
        """Expand a map step (:func:`konduit.engine.maps.create_map_tasks`): None when it
        cannot fan out, and the execution fails with the reason."""
        try:
            count = await create_map_tasks(
                self.tx, self.spec, spec, self.execution_id, generation=self.generation,
                window_left=self.window_left, max_payload_bytes=self.max_payload_bytes)
        except CannotFanOut as exc:
            self._fail(str(exc))
            return None
        if count:
            self.result.queues.add(spec.queue)
        return count

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
