"""The engine side of durable waits: arming, events, and waking (docs/durable-waits.md).

* **Arm** (:func:`arm`): the arming attempt's :class:`~konduit.core.waits.Armed` moves its task
  running -> ``waiting`` under its lease (``task_wait_if_leased``), storing what it waits for. An
  event step takes, in the same transaction, the oldest stored event that matches and has not
  expired (consumed at most once) and marks itself due; a child step starts its child
  execution in the same transaction (one child per task by construction, and its idempotency
  key ``konduit-child:<task id>`` besides).
* **Send** (:func:`send_event`): under the same advisory lock as an arming of that event,
  accept it for the oldest matching waiting task (``task_mark_due_if_waiting``: only before
  the task's deadline), else keep it, until its retention ends, for a task that may still
  wait for it (in an execution not started yet, when sent by key), else refuse it. Expired
  stored events are deleted by the workers' waits pass (:func:`delete_expired`).
* **Wake** (:func:`wake`): a due task (event accepted, timer due, child ended) is ended in the
  fan-in transaction (:func:`konduit.engine.completer.record_many`, transition ``wake``), fenced
  on ``status = 'waiting'``. The sender wakes the task it accepted at once; the workers'
  maintenance wakes the rest (:func:`list_due`), so nothing is lost if the sender dies.
* **Wake a parent** (:func:`wake_parent`): the process whose transaction ended a child
  execution wakes the parent's step right after it committed (``finish_execution`` says which
  task); the maintenance pass is the backstop, the fence makes racing wakes change it once.

Advisory locks come first, then execution rows, then task rows, then events: the global order.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal
from uuid import UUID

from konduit.core.durations import Duration
from konduit.core.model import (
    AttemptOutcome,
    Command,
    Completion,
    ExecutionStatus,
    Outcome,
    Recorded,
    Transition,
    WaitKind,
)
from konduit.core.outcome import Ending, Final, decide, policy_of
from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json, is_sealed
from konduit.core.requests import StartRequest
from konduit.core.values import storable
from konduit.core.waits import (
    DEFAULT_EVENT_RETENTION,
    Armed,
    check_event_name,
    child_idempotency_key,
    is_input_event,
    positive_duration,
)
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database, Row, Tx
from konduit.engine import transitions, triggers
from konduit.engine.advancer import Advanced
from konduit.engine.completer import record_many
from konduit.engine.finish import ChildEnded
from konduit.engine.registry import Registry
from konduit.engine.starts import insert_executions, prepare_off_loop
from konduit.errors import KonduitError, blame, blamed
from konduit.settings import settings

log = logging.getLogger(__name__)

SendResult = Literal["woke", "started", "stored", "no match"]


def event_retention(value: Duration | None = None) -> float:
    """Seconds a stored event is kept when its step declares no ``retention=``: ``value``
    (``App(event_retention=...)``), else ``KONDUIT_EVENT_RETENTION``, else 24 h."""
    if value is not None:
        return positive_duration(value, "event_retention")
    return settings().event_retention  # KONDUIT_EVENT_RETENTION, checked there


ChildFallback = Callable[[WorkflowSpec, Row, Final, str], Awaitable[Completion]]
"""Runs a child-workflow step's fallback (user code, with its time limit) and returns the
completion to record: a worker's executor. (spec, the task's row, the verdict, the error.)"""


def _lock_keys(name: str, key: str | None, execution_id: UUID | None) -> list[str]:
    keys = []
    if key is not None:
        keys.append(f"k\x1f{name}\x1f{key}")
    if execution_id is not None:
        keys.append(f"e\x1f{name}\x1f{execution_id}")
    return keys


async def arm(db: Database, registry: Registry, c: Completion, *,
              max_payload_bytes: int = DEFAULT_MAX_BYTES) -> tuple[Recorded, Advanced | None]:
    """Record an arming attempt (its ``payload`` is the :class:`Armed`): running -> waiting.
    A matching stored event, or a timer already due, wakes the task at once."""
    armed: Armed = c.payload
    prepared = None
    if armed.kind == WaitKind.CHILD:
        try:
            assert armed.workflow is not None
            prepared = await prepare_off_loop(registry, StartRequest(
                armed.workflow, armed.input, idempotency_key=child_idempotency_key(c.task_id)),
                max_bytes=max_payload_bytes)
        except KonduitError as exc:
            # An unknown workflow or an input that cannot be stored: the step fails (no retry
            # would change it), as a handler's invalid output would.
            failed = Completion(
                task_id=c.task_id, lease_token=c.lease_token, execution_id=c.execution_id,
                step=c.step, map_index=c.map_index, attempt=c.attempt, command=Command.END,
                outcome=Outcome.FAILED,
                error=f"could not start child workflow {armed.workflow!r}: {exc}",
                age_seconds=c.age_seconds)
            [(outcome, advanced)] = await record_many(db, registry, [failed],
                                                      max_payload_bytes=max_payload_bytes)
            return outcome, advanced

    async def write(tx: Tx) -> tuple[Row | None, bool]:
        if armed.kind == WaitKind.EVENT:
            assert armed.event is not None
            await tx.one("event_lock_keys",
                         keys=_lock_keys(armed.event, armed.key, c.execution_id))
        child = None
        if prepared is not None:
            [child] = await insert_executions(tx, [prepared])
        row = await transitions.wait(
            tx, c, kind=armed.kind, event=armed.event, key=armed.key, until=armed.until,
            delay_seconds=armed.delay, child=child)
        if row is None:
            raise _LeaseLost
        await tx.run("attempt_finish_if_open", lease_token=c.lease_token,
                     outcome=AttemptOutcome.WAITING,
                     error=None, age_seconds=c.age_seconds)
        due = row["wait_seconds"] is not None and row["wait_seconds"] <= 0
        if armed.kind == WaitKind.EVENT:
            event = await tx.one("event_find_pending_for_task", name=armed.event, key=armed.key,
                                 execution_id=c.execution_id)
            if event is not None \
                    and await tx.one("event_consume_if_pending", id=event["id"],
                                     task_id=c.task_id) is not None:
                due = await transitions.mark_due(tx, c.task_id)
        return row, due

    try:
        row, due = await db.atomic(write)
    except _LeaseLost:
        return Recorded.LEASE_LOST, None
    log.debug("task %s (%s) waits for %s", c.task_id, c.step, armed.describe())
    if due:
        woken = await wake_task(db, registry, c.task_id, c.execution_id, c.step,
                                max_payload_bytes=max_payload_bytes)
        if woken is not None:
            return Recorded.WAITING, woken
    assert row is not None
    return Recorded.WAITING, None


class _LeaseLost(Exception):
    """The arming attempt's lease no longer holds: roll back (a child started would be undone)."""


def check_event_address(name: str, key: str | None) -> None:
    """Refuse an event name or key PostgreSQL cannot store or no step could wait for, naming
    the field (before the database sees it)."""
    with blame("name"):
        check_event_name(name)
    if key is not None and (not isinstance(key, str) or not key or not storable(key)):
        raise blamed(KonduitError(f"the event key must be a non-empty string without NUL "
                                  f"characters or lone surrogates, got {key!r:.80}"), "key")


async def send_event(db: Database, registry: Registry, name: str, *, key: str | None = None,
                     execution_id: UUID | None = None, payload: Any = None,
                     max_payload_bytes: int = DEFAULT_MAX_BYTES,
                     retention: float = DEFAULT_EVENT_RETENTION) -> SendResult:
    """Deliver an event. ``"woke"``: a task waiting for it (before its deadline) took it and is
    woken; ``"stored"``: no task waits for it yet, but a task may still start waiting for it (a
    registered workflow has a keyed event step of that name and the event names a key; or the
    named execution has not reached its step yet): it is kept until now + the retention (the
    longest its steps declare, else ``retention`` seconds) and consumed by the first such task
    that waits before then; ``"no match"``: nothing could ever take it (no such step, the named
    execution is unknown or finished, or its step already ended or timed out): nothing is kept
    and nothing changes.

    ``"started"`` (unless a task woke): a workflow's ``on_event`` trigger took it, in this same
    transaction: it started an execution, or joined a burst or batch
    (:mod:`konduit.engine.triggers`); then ``key`` and ``execution_id`` may both be None."""
    check_event_address(name, key)
    with blame("payload"):
        payload_json = canonical_json(payload, what=f"payload of event {name!r}",
                                      max_bytes=max_payload_bytes)
    stored_payload = payload_json  # sealed with the codec on its way in (konduit.db.sealing)

    async def decide(tx: Tx) -> tuple[SendResult, Row | None, triggers.Taken]:
        # Events that start work (wf.on_event) first: the event and what it starts commit
        # together, and its answer "started" ranks below "woke" only (docs/events.md).
        taken = await triggers.take(tx, registry, name, key, payload_json,
                                    max_payload_bytes=max_payload_bytes)
        if key is None and execution_id is None:
            if not taken.started and not taken.failures:
                raise blamed(KonduitError("send_event needs key= or execution_id= (or both), "
                                          "unless a workflow's on_event trigger takes the "
                                          "event"), "key")
            return ("started" if taken.started else "no match"), None, taken
        result, task = await wake_or_keep(tx)
        if taken.started and result != "woke":
            result = "started"
        return result, task, taken

    async def wake_or_keep(tx: Tx) -> tuple[SendResult, Row | None]:
        await tx.one("event_lock_keys", keys=_lock_keys(name, key, execution_id))
        task = await tx.one("task_find_waiting_for_event", name=name, key=key,
                            execution_id=execution_id)
        if task is not None and await transitions.mark_due(tx, task["id"]):
            await tx.one("event_insert", name=name, key=key, execution_id=execution_id,
                         payload=stored_payload, consumed_by=task["id"])
            return "woke", task
        possible = await tx.one("event_may_be_awaited", name=name, key=key,
                                execution_id=execution_id, default_retention_seconds=retention)
        if possible is None or not possible["possible"]:
            return "no match", None
        await tx.one("event_store_pending", name=name, key=key, execution_id=execution_id,
                     payload=stored_payload, retention_seconds=possible["retention_seconds"])
        return "stored", None

    result, task, taken = await db.atomic(decide)
    with blame("payload"):  # a trigger's input= or key= code failed on it
        taken.raise_failures()
    if task is not None:
        try:
            registry.get(task["workflow_name"], task["workflow_version"])
        except KonduitError:
            return result  # not this App's workflow: a worker serving it wakes the task
        woken = await wake_task(db, registry, task["id"], task["execution_id"], task["step"],
                                max_payload_bytes=max_payload_bytes)
        if woken is not None and woken.child_ended is not None:
            # The event ended a child workflow: its parent's step too, now (docs/durable-waits.md).
            await wake_parents(db, registry, woken.child_ended,
                               max_payload_bytes=max_payload_bytes)
    return result


async def wake_task(db: Database, registry: Registry, task_id: int, execution_id: UUID,
                    step: str, *, outcome: Outcome = Outcome.SUCCEEDED, payload_json: str | None = None,
                    payload: Any = None, error: str | None = None,
                    max_payload_bytes: int = DEFAULT_MAX_BYTES) -> Advanced | None:
    """End a due waiting task in the fan-in transaction. An event step's payload is the event
    it consumed (read here when not given). Returns how the DAG advanced, None when the task
    was no longer waiting (someone else woke it, or the deadline sweep ended it)."""
    if payload_json is None and outcome == Outcome.SUCCEEDED:
        row = await db.one("event_payload_consumed_by", task_id=task_id)
        if row is not None:
            payload = row["payload"]
            if is_input_event(row["name"]) and isinstance(payload, dict):
                if is_sealed(payload):  # an answer this process has not the keys of
                    raise db.io.why_sealed(payload)
                payload = payload.get("value")  # an answer: who gave it stays on the event
            payload_json = canonical_json(payload, what=f"output of step {step!r}",
                                          max_bytes=max_payload_bytes)
        else:  # a timer: its output is None
            payload_json = canonical_json(None, what=f"output of step {step!r}")
    c = Completion(task_id=task_id, lease_token=None, execution_id=execution_id, step=step,
                   map_index=0, attempt=0, command=Command.END, outcome=outcome,
                   payload_json=payload_json, payload=payload, error=error,
                   transition=Transition.WAKE)
    [(recorded, advanced)] = await record_many(db, registry, [c],
                                               max_payload_bytes=max_payload_bytes)
    return advanced if recorded is Recorded.ENDED else None


async def wake_child_step(db: Database, registry: Registry, row: Row, *,
                          fallback: ChildFallback | None = None,
                          max_payload_bytes: int = DEFAULT_MAX_BYTES,
                          fallback_settle: float = 0.0) -> Advanced | None:
    """End a waiting child-workflow step whose child ended (``row`` in the shape of
    ``task_list_waits_due``, of a workflow ``registry`` knows): a succeeded child completes it
    with its output; a failed, timed-out or cancelled one fails it, or degrades it to its
    fallback with ``fallback_on_failure=True`` (no retry: it would start no second child). A
    fallback is user code, run by ``fallback`` (a worker's executor); without one (a client
    process) such a step is left to the workers' maintenance. A step whose fallback was started
    before (``fallback_age``) ends timed_out without it, but only once ``fallback_settle``
    seconds passed: until then its caller may still record what it returned. Returns how the DAG
    advanced, None when nothing changed here (woken by someone else, past its deadline, left)."""
    spec = registry.get(row["workflow_name"], row["workflow_version"])
    step = row["step"]
    if row["child_status"] == ExecutionStatus.SUCCEEDED:
        output = row["child_output"]
        try:
            payload_json = canonical_json(output, what=f"output of step {step!r}",
                                          max_bytes=max_payload_bytes)
        except KonduitError as exc:
            return await wake_task(db, registry, row["id"], row["execution_id"], step,
                                   outcome=Outcome.FAILED, error=str(exc),
                                   max_payload_bytes=max_payload_bytes)
        return await wake_task(db, registry, row["id"], row["execution_id"], step,
                               payload_json=payload_json, payload=output,
                               max_payload_bytes=max_payload_bytes)
    error = (f"child execution {row['wait_child']} ended {row['child_status']}"
             + (f": {row['child_error']}" if row["child_error"] else ""))
    fallback_age = row["fallback_age"]
    if fallback_age is not None and (fallback is None or fallback_age < fallback_settle):
        return None  # its fallback's caller may still end it; else the next pass does
    verdict = decide(policy_of(spec[step]), Ending.NON_RETRYABLE, attempt=row["attempt"],
                     max_attempts=row["max_attempts"], remaining=None, error=error,
                     fallback_tried=fallback_age is not None)
    assert isinstance(verdict, Final)  # not retryable: a retry would start no second child
    if not verdict.use_fallback:
        log.warning("task %s (%s) of execution %s failed: %s", row["id"], step,
                    row["execution_id"], error)
        return await wake_task(db, registry, row["id"], row["execution_id"], step,
                               outcome=verdict.outcome, error=verdict.reason,
                               max_payload_bytes=max_payload_bytes)
    if fallback is None:
        return None
    completion = await fallback(spec, row, verdict, error)
    [(recorded, advanced)] = await record_many(db, registry, [completion],
                                               max_payload_bytes=max_payload_bytes)
    return advanced if recorded is Recorded.ENDED else None


async def wake_parent(db: Database, registry: Registry, ended: ChildEnded, *,
                      fallback: ChildFallback | None = None,
                      max_payload_bytes: int = DEFAULT_MAX_BYTES,
                      fallback_settle: float = 0.0) -> Advanced | None:
    """The prompt wake: right after the transaction that ended a child execution committed,
    end its parent's waiting step (:func:`wake_child_step`), if it still waits for that child
    and its workflow is this registry's. Exactly once whoever else tries (the workers'
    maintenance is the backstop should this process die first): the wake is fenced on
    ``status = 'waiting'`` in the fan-in transaction."""
    row = await db.one("task_get_waiting_for_child_if_ended", id=ended.parent_task_id,
                       child=ended.child_id)
    if row is None:
        return None
    try:
        registry.get(row["workflow_name"], row["workflow_version"])
    except KonduitError:
        return None  # not this App's workflow: its own workers' maintenance wakes it
    return await wake_child_step(db, registry, row, fallback=fallback,
                                 max_payload_bytes=max_payload_bytes,
                                 fallback_settle=fallback_settle)


async def wake_parents(db: Database, registry: Registry, ended: ChildEnded | None, *,
                       max_payload_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """:func:`wake_parent` outside a worker (a client ended a child: a cancel, an event), up
    the tree while each wake ends another child. Best effort: the child's end has committed,
    so a failure here is logged and left to the workers' maintenance, never raised."""
    while ended is not None:
        try:
            woken = await wake_parent(db, registry, ended, max_payload_bytes=max_payload_bytes)
        except KonduitError as exc:
            log.info("waking the parent task %s of child execution %s failed (the workers' "
                     "maintenance will): %s", ended.parent_task_id, ended.child_id, exc)
            return
        ended = woken.child_ended if woken is not None else None


async def delete_expired(db: Database, *, limit: int = 500, max_batches: int = 20) -> int:
    """Delete stored events past their retention, never consumed, ``limit`` per transaction (at
    most ``max_batches`` of them: the next pass goes on); returns how many went."""
    deleted = 0
    for _ in range(max_batches):
        batch = await db.run("event_delete_expired", limit=limit)
        deleted += batch
        if batch < limit:
            break
    return deleted


async def list_due(db: Database, *, limit: int = 100) -> list[Row]:
    """Waiting tasks to wake now: timers due, events accepted, children ended."""
    return await db.all("task_list_waits_due", limit=limit)
