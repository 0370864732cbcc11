"""The engine side of events that start work (``wf.on_event``; docs/events.md).

* **Register** (:func:`register`): a workflow version's triggers go to
  ``konduit_event_triggers`` with its registration, so any process knows an event starts
  something, with or without the workflow's code.
* **Take** (:func:`take`, called inside ``send_event``'s transaction): for each trigger of the
  event (of each workflow's newest registered version) the event is recorded in
  ``konduit_trigger_events``; when the sender has the workflow's code it is applied at once, in
  that same transaction (:func:`apply`): its ``input=``/``key=`` run, and it starts its
  execution (idempotency key ``event:<event>:<key>``: a resent event starts nothing new) or
  joins its key's burst or batch. A sender without the code leaves it pending: a worker's
  maintenance (:func:`run_pass`) applies it, locked and re-checked, exactly once. Either way
  the event and what it starts commit together.
* **Start a burst or batch** (:func:`start_group`): its group row is deleted in the transaction
  that creates the execution, by a statement that re-checks the due time (or the batch being
  full), so racing workers and senders start it once; a crash rolls both back.

User code raising anything, or not returning within :data:`TRIGGER_CODE_SECONDS`, fails its own
event (recorded ``failed`` with the error), never the worker: it runs on a thread of its own
(:func:`run_code`), so a call that blocks holds neither the worker's loop (its leases'
heartbeats, its claims) nor a sender for longer than that. A sender is told with
:class:`~konduit.core.triggers.TriggerCodeFailed` once the transaction committed. Lock order: a
trigger's group row after the event's, groups in workflow order (the order :func:`take` visits
triggers in).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from uuid import UUID

from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json, is_sealed
from konduit.core.requests import StartRequest
from konduit.core.triggers import EventTrigger, TriggerCodeFailed, apply_code
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database, Row, Tx
from konduit.engine.registry import Registry
from konduit.engine.starts import insert_executions, prepare_off_loop
from konduit.errors import DatabaseError, IdempotencyConflict, KonduitError
from konduit.threads import HandlerThreads, call_within

log = logging.getLogger(__name__)

TRIGGER_CODE_SECONDS = 10.0
"""How long an ``on_event``'s ``input=`` and ``key=`` together may take on one event. Past it the
event fails with an error that says so, and the call's thread is abandoned (a thread cannot be
killed: it ends when the code returns)."""

TRIGGER_CODE_MAX_HUNG = 8
"""Calls of triggers' code that may be left running past :data:`TRIGGER_CODE_SECONDS` in one
process; past them an event that needs such code fails at once
(:class:`~konduit.errors.UserCodeStuck`) instead of leaving one more thread behind."""

_code_threads = HandlerThreads(name="konduit-trigger-code", max_abandoned=TRIGGER_CODE_MAX_HUNG,
                               process_wide=True, what="triggers' input=/key=")

RETAIN_SECONDS = 7 * 86400.0
"""How long the record of an event that came to an end (started or failed) is kept."""


@dataclass
class Taken:
    """What the triggers made of one event in the sender's transaction."""

    started: bool = False
    """Some trigger took it: it started (or will start, or joined) an execution."""
    failures: list[str] = field(default_factory=list)
    """Triggers whose code failed on it, in words (the event is recorded failed for each)."""

    def raise_failures(self) -> None:
        """After the commit: tell the sender which triggers' code failed on its event."""
        if self.failures:
            raise TriggerCodeFailed("; ".join(self.failures)
                                    + " (the event is recorded as failed for that workflow)")


async def register(tx: Tx, spec: WorkflowSpec) -> None:
    """Store the triggers ``spec`` declares (dropping those it no longer does)."""
    await tx.run("trigger_replace_for_version", name=spec.name, version=spec.version,
                 events=[t.event for t in spec.triggers],
                 specs=[json.dumps(t.to_spec(), sort_keys=True) for t in spec.triggers])


def trigger_of(registry: Registry, workflow: str, version: int, event: str) -> EventTrigger | None:
    """This process's code for a stored trigger, or None when it has not that code."""
    if not any(s.name == workflow and s.version == version for s in registry):
        return None
    spec = registry.get(workflow, version)
    return next((t for t in spec.triggers if t.event == event), None)


async def take(tx: Tx, registry: Registry, event: str, key: str | None, payload_json: str, *,
               max_payload_bytes: int = DEFAULT_MAX_BYTES) -> Taken:
    """Record ``event`` for each trigger that takes it, applying those whose code this process
    has (inside ``send_event``'s transaction ``tx``)."""
    taken = Taken()
    for row in await tx.all("trigger_list_for_event", event=event):
        ev = await tx.one("trigger_event_insert", workflow_name=row["workflow_name"],
                          workflow_version=row["workflow_version"], event=event, key=key,
                          payload=payload_json)
        assert ev is not None
        trigger = trigger_of(registry, row["workflow_name"], row["workflow_version"], event)
        # Without the code here a worker applies it (run_pass): it is started all the same.
        error = None if trigger is None else await apply(
            tx, registry, trigger, ev, max_payload_bytes=max_payload_bytes)
        if error is None:
            taken.started = True
        else:
            taken.failures.append(error)
    return taken


async def apply(tx: Tx, registry: Registry, trigger: EventTrigger, ev: Row, *,
                max_payload_bytes: int = DEFAULT_MAX_BYTES) -> str | None:
    """Apply one recorded event (``trigger_event_insert``'s row, pending and ours) with the
    trigger's code: start its execution or add it to its group. Returns None, or the error
    recorded when its code or its input failed."""
    try:
        if is_sealed(ev["payload"]):  # this process has not the keys of the event's payload
            raise tx.io.why_sealed(ev["payload"])
        mapped, key = await run_code(trigger, ev["payload"], ev["key"])
        if trigger.mode == "start":
            eid = await _start(tx, registry, trigger.workflow, trigger.version, mapped,
                               None if key is None else f"event:{trigger.event}:{key}",
                               max_payload_bytes=max_payload_bytes)
            await _finish(tx, ev["id"], "started", execution_id=eid, key=key)
            return None
        encoded = canonical_json(mapped, what=f"input made of event {trigger.event!r}",
                                 max_bytes=max_payload_bytes)
    except DatabaseError:
        raise  # the transaction is lost: nothing of it stays (the caller's retry may run it)
    except KonduitError as exc:
        log.warning("event %s (%r) did not start workflow %r: %s", ev["id"], trigger.event,
                    trigger.workflow, exc)
        await _finish(tx, ev["id"], "failed", error=str(exc))
        return str(exc)
    wait = trigger.debounce_seconds if trigger.batch is None else trigger.batch.window_seconds
    assert wait is not None
    group = await tx.one("trigger_group_add", workflow_name=trigger.workflow,
                         workflow_version=trigger.version, event=trigger.event,
                         mode=trigger.mode, group_key=key or "", input=encoded,
                         event_at=ev["created_at"], wait_seconds=wait)
    assert group is not None
    await _finish(tx, ev["id"], "gathered", group_id=group["id"], key=key)
    if trigger.batch is not None and group["size"] >= trigger.batch.max:
        await start_group(tx, registry, group["id"], full=trigger.batch.max,
                          max_payload_bytes=max_payload_bytes)
    return None


async def run_code(trigger: EventTrigger, payload: Any,
                   sent_key: str | None) -> tuple[Any, str | None]:
    """:func:`~konduit.core.triggers.apply_code` on a thread, for at most
    :data:`TRIGGER_CODE_SECONDS`: code that blocks fails its event, not the loop that called it
    (a worker's heartbeats and claims run on that loop)."""
    try:
        return await call_within(_code_threads, partial(apply_code, trigger, payload, sent_key),
                                 TRIGGER_CODE_SECONDS)
    except TimeoutError:
        what = f"on_event({trigger.event!r}) of workflow {trigger.workflow!r}: input=/key="
        log.warning("%s still running after %g s (%d such calls abandoned)", what,
                    TRIGGER_CODE_SECONDS, _code_threads.abandoned)
        raise TriggerCodeFailed(
            f"{what} did not return within {TRIGGER_CODE_SECONDS:g} s") from None


async def _finish(tx: Tx, event_id: int, status: str, *, execution_id: UUID | None = None,
                  group_id: int | None = None, error: str | None = None,
                  key: str | None = None) -> None:
    await tx.one("trigger_event_finish_if_pending", id=event_id, status=status,
                 execution_id=execution_id, group_id=group_id, error=error, key=key)


async def _start(tx: Tx, registry: Registry, workflow: str, version: int, input: Any,
                 idempotency_key: str | None, *, max_payload_bytes: int) -> UUID:
    """Create one execution in ``tx``; a key already used gives its execution, whatever its
    input (an event sent again starts nothing new, even with another payload)."""
    # The workflow's input checks and key functions (fair_by=, per-key limits) are user code too.
    prepared = await prepare_off_loop(
        registry, StartRequest(workflow, input, idempotency_key=idempotency_key, version=version),
        max_bytes=max_payload_bytes)
    try:
        [eid] = await insert_executions(tx, [prepared])
    except IdempotencyConflict:
        [row] = await tx.all("execution_get_by_idempotency_keys", workflow_names=[workflow],
                             idempotency_keys=[idempotency_key])
        eid = UUID(str(row["id"]))
    return eid


async def start_group(tx: Tx, registry: Registry, group_id: int, *, full: int | None = None,
                      max_payload_bytes: int = DEFAULT_MAX_BYTES) -> UUID | None:
    """Start the execution of a burst or batch if it is due (or holds ``full`` events), in
    ``tx``; None when it is not (anymore): another process started it, or an event moved it."""
    group = await tx.one("trigger_group_take_if_due", id=group_id, full=full)
    if group is None:
        return None
    inputs = list(group["inputs"])
    value = inputs[-1] if group["mode"] == "debounce" else inputs
    try:
        eid = await _start(tx, registry, group["workflow_name"], group["workflow_version"], value,
                           f"event:{group['event']}:{group['mode']}:{group['id']}",
                           max_payload_bytes=max_payload_bytes)
    except DatabaseError:
        raise
    except KonduitError as exc:
        log.warning("the %s of event %r (key %r, %s events) did not start workflow %r: %s",
                    group["mode"], group["event"], group["group_key"], group["size"],
                    group["workflow_name"], exc)
        await tx.run("trigger_event_finish_group", group_id=group_id, status="failed",
                     execution_id=None, error=str(exc))
        return None
    await tx.run("trigger_event_finish_group", group_id=group_id, status="started",
                 execution_id=eid, error=None)
    return eid


async def run_pass(db: Database, registry: Registry, *, limit: int = 100,
                   max_payload_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """A worker's maintenance pass: apply the pending events of the workflows it has the code
    of, then start the bursts and batches that are due. Returns how many it did."""
    workflows = registry.keys()
    if not workflows:
        return 0
    done = 0
    for pending in await db.all("trigger_event_list_pending", workflows=workflows, limit=limit):

        async def apply_one(tx: Tx, event_id: int = pending["id"]) -> bool:
            ev = await tx.one("trigger_event_lock_if_pending", id=event_id)
            if ev is None:
                return False  # another worker has it, or applied it
            trigger = trigger_of(registry, ev["workflow_name"], ev["workflow_version"],
                                 ev["event"])
            if trigger is None:  # that version's code here no longer declares it
                await _finish(tx, event_id, "failed",
                              error=f"workflow {ev['workflow_name']!r} version "
                                    f"{ev['workflow_version']} does not declare "
                                    f"on_event({ev['event']!r}) in this worker's code")
                return True
            await apply(tx, registry, trigger, ev, max_payload_bytes=max_payload_bytes)
            return True

        done += await db.atomic(apply_one)
    for due in await db.all("trigger_group_list_due", workflows=workflows, limit=limit):

        async def start_one(tx: Tx, group_id: int = due["id"]) -> bool:
            return await start_group(tx, registry, group_id,
                                     max_payload_bytes=max_payload_bytes) is not None

        done += await db.atomic(start_one)
    await db.run("trigger_event_delete_done_before", older_than_seconds=RETAIN_SECONDS,
                 limit=1000)
    return done


async def list_triggers(db: Database, workflow: str | None = None) -> list[Row]:
    """Every registered trigger (of ``workflow``), with its open groups, pending events and
    last event (``trigger_list_all``)."""
    return await db.all("trigger_list_all", workflow=workflow)
