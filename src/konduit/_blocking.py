"""The blocking faces of every operation: GENERATED from ``konduit/operations.py`` by
``scripts/async_to_sync.py``; do not edit (``python scripts/async_to_sync.py`` writes it again,
and the suite fails while it is out of date).

:class:`Operations` is what :class:`konduit.App` and :class:`konduit.Client` inherit: each
method is the coroutine of :class:`konduit.operations.AsyncOperations` of the same name, with
the same parameters and docstring, run on the face's own event-loop thread (``_run``), so any
thread may call it. :class:`ExecutionHandle` is :class:`konduit.AsyncExecutionHandle` without
``await``.
"""

# ruff: noqa: E501, F401, I001

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID
from konduit.core.durations import Duration
from konduit.core.requests import AnswerRequest, BulkRequest, CancelRequest, EventRequest, ForkRequest, HistoryMoveRequest, MigrateRequest, MigrateWorkflowRequest, PruneRequest, RedriveRequest, RepairRequest, RetryNowRequest, RetryWebhookRequest, ScheduleRequest, StartRequest, StreamRequest
from konduit.core.results import ExecutionResult
from konduit.core.search import ExecutionFilter
from konduit.core.webhooks import Webhook
from konduit.engine import client as engine
from konduit.engine.retention import BATCH_SIZE, Prunable
from konduit.engine.waits import SendResult
from konduit.errors import KonduitError
from konduit.reads import ReadModel
from konduit.records import AlertRecord, Answer, AttemptLog, BulkResult, DeadLetter, ExecutionFound, JournalEntry, MigrationRecord, OpenInput, OutputVersion, Payload, ScheduleRecord, StepRecord, StreamChunk, StreamRecord, TaskRecord, TriggerRecord, VersionState, WebhookDelivery, WorkerRecord, WorkflowRecord
from konduit.tracing import TraceContext
from collections.abc import Coroutine, Iterator
from typing import TypeVar
from konduit.operations import AsyncOperations, ExecutionId

T = TypeVar('T')


class ExecutionHandle:
    """A started execution: ``handle.wait()``. ``id`` is its id; the methods are the
    face's operations on it (see :class:`AsyncOperations`)."""

    def __init__(self, client: Operations, execution_id: UUID):
        self.client = client
        self.id = execution_id

    def wait(self, timeout: float | None=None) -> ExecutionResult:
        """The result once it succeeded; raises :class:`~konduit.ExecutionFailed` when it
        failed, timed out or was cancelled, :class:`TimeoutError` after ``timeout`` seconds."""
        return self.client.wait(self.id, timeout)

    def status(self) -> ExecutionResult:
        """How the execution stands now: status, output, error, each step's outcome."""
        return self.client.status(self.id)

    def cancel(self, reason: str='cancelled') -> bool:
        """Cancel it (``reason`` is kept as its error); False when it had already finished."""
        return self.client.cancel(self.id, reason)

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.id})'


class Operations:
    """Every operation of :class:`konduit.operations.AsyncOperations`, blocking: the methods
    :class:`konduit.App` and :class:`konduit.Client` share."""
    _operations: AsyncOperations

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError

    def _iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """The items of an async generator of the async face, each fetched on the face's
        loop (``_run``); leaving the loop early closes it there too."""

        async def following() -> T:
            return await items.__anext__()

        async def closing() -> None:
            aclose = getattr(items, 'aclose', None)
            if aclose is not None:
                await aclose()
        try:
            while True:
                try:
                    item = self._run(following())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            self._run(closing())

    def start(self, workflow: str, input: Any=None, *, idempotency_key: str | None=None, version: int | None=None, deadline_at: datetime | None=None, timeout: Duration | None=None, tags: Mapping[str, str] | None=None, run_at: datetime | None=None, delay: Duration | None=None, priority: int=0, fair_key: str | None=None, trace_context: TraceContext | None=None) -> ExecutionHandle:
        """Start an execution of ``workflow`` (its newest registered version unless
        ``version``); every argument is a field of :class:`konduit.StartRequest`, which says
        what it means. The same ``idempotency_key`` (with the same input) gives the same
        execution. An input that does not match the workflow's ``input=`` raises
        :class:`~konduit.InputValidationError` naming each field, and nothing is written; a
        start-time key that needs code this process does not have raises
        :class:`~konduit.KeyNeedsCode`. With tracing on, the execution joins
        ``trace_context`` (default: the caller's current span)."""
        return ExecutionHandle(self, self._run(self._operations.start(workflow, input, idempotency_key=idempotency_key, version=version, deadline_at=deadline_at, timeout=timeout, tags=tags, run_at=run_at, delay=delay, priority=priority, fair_key=fair_key, trace_context=trace_context)).id)

    def start_many(self, requests: Iterable[StartRequest | Mapping[str, Any]], *, trace_context: TraceContext | None=None) -> builtins.list[ExecutionHandle]:
        """Start many executions in one transaction and a few statements, all or none; handles
        come back in request order. Each request is a :class:`konduit.StartRequest` or a dict
        of its fields. A bad request raises the error :meth:`start` would, its message
        starting with ``start request <index>:`` (and the error's ``index`` naming it)."""
        return [ExecutionHandle(self, h.id) for h in self._run(self._operations.start_many(requests, trace_context=trace_context))]

    def wait(self, execution_id: ExecutionId, timeout: float | None=None) -> ExecutionResult:
        """Wait for the execution to finish: its result when it succeeded;
        :class:`~konduit.ExecutionFailed` when it failed, timed out or was cancelled;
        :class:`TimeoutError` when it still runs after ``timeout`` seconds."""
        return self._run(self._operations.wait(execution_id, timeout))

    def status(self, execution_id: ExecutionId) -> ExecutionResult:
        """How an execution stands now: status, output, error, each step's outcome (read from
        the primary: what a caller acts on)."""
        return self._run(self._operations.status(execution_id))

    def cancel(self, execution_id: ExecutionId, reason: str='cancelled') -> bool:
        """Cancel a running execution: its ready tasks are never claimed after this, running
        handlers lose their lease, and ``reason`` is kept as its error. False when it had
        already finished."""
        return self._run(self._operations.cancel(execution_id, reason))

    def repair(self, execution_id: ExecutionId) -> builtins.list[str]:
        """Re-run the degraded, failed, timed-out or cancelled steps of a finished execution
        and everything downstream of them; returns the steps that run again. A process
        without the workflow's code repairs from the registered definition (one with map
        steps needs the code)."""
        return self._run(self._operations.repair(execution_id))

    def redrive(self, execution_id: ExecutionId) -> builtins.list[str]:
        """Run a failed, timed-out or cancelled execution again from the steps that did not
        succeed (failed, timed out, cancelled, and everything downstream of them), as a new
        generation of their tasks; every succeeded and degraded step keeps its output (a
        :meth:`repair` would re-run the degraded ones too). Returns the steps that run again.
        Raises :class:`~konduit.NotRedrivable` for an execution that runs or succeeded, and
        :class:`~konduit.NothingToRepair` when no step is left to re-run
        (docs/recovering-executions.md)."""
        return self._run(self._operations.redrive(execution_id))

    def fork(self, execution_id: ExecutionId, *, from_step: str, input: Any=None) -> ExecutionHandle:
        """Start a new execution of ``execution_id``'s workflow (at the origin's version) that
        reuses the outputs of the steps ``from_step`` depends on (its ancestors, copied as they
        ended: succeeded or degraded) and runs ``from_step`` and every other step anew. Its
        input is ``input``, or the origin's when None; a copied step keeps the output it made
        from the origin's input, so fork from the first step whose result should change. The
        fork records its origin and step, and each page links the other. The origin may still
        run. Raises :class:`~konduit.KonduitError` naming ``from_step`` when the workflow has
        no such step, or the upstream step that did not succeed, and
        :class:`~konduit.ExecutionNotFound` for an unknown origin; nothing is written then
        (docs/recovering-executions.md)."""
        return ExecutionHandle(self, self._run(self._operations.fork(execution_id, from_step=from_step, input=input)).id)

    def bulk(self, action: str, where: ExecutionFilter, *, dry_run: bool=False, batch_size: int=100, reason: str='cancelled') -> BulkResult:
        """``"cancel"`` or ``"redrive"`` every execution ``where`` finds (a
        :class:`konduit.ExecutionFilter`; not an empty one), ``batch_size`` executions per
        transaction, so no lock is held longer than a batch. ``reason`` is kept as each
        cancelled execution's error. Executions the action does not apply to are skipped and
        counted by reason; ``dry_run`` counts and changes nothing (docs/recovering-executions.md).
        Returns a :class:`konduit.records.BulkResult`: ``matched``, ``done``, ``skipped`` by
        reason, ``batches``, ``longest_batch_seconds``."""
        return self._run(self._operations.bulk(action, where, dry_run=dry_run, batch_size=batch_size, reason=reason))

    def send_event(self, name: str, *, key: str | None=None, execution_id: ExecutionId | None=None, payload: Any=None) -> SendResult:
        """Send the event ``name`` to the step that waits for it (``wf.wait_for_event``), by
        ``key`` (what the step's ``key=`` computed), by ``execution_id``, or both, and to the
        workflows it starts (``wf.on_event``). Returns ``"woke"`` (a waiting task took it),
        ``"started"`` (a trigger took it: it started, or joined, an execution), ``"stored"``
        (no task waits yet, but one may: it is kept for the step's ``retention=``) or ``"no
        match"`` (nothing could ever take it; nothing is kept). An event is consumed at most
        once (docs/durable-waits.md, docs/events.md)."""
        return self._run(self._operations.send_event(name, key=key, execution_id=execution_id, payload=payload))

    def answer(self, execution_id: ExecutionId, step: str, value: Any, *, answered_by: str | None=None) -> Answer:
        """Answer the ``wait_for_input`` step ``step`` of an execution: ``value`` (a dict, or
        the step's model instance) is checked against the step's model and becomes the step's
        output; ``answered_by`` is kept with it and shown on the execution page. Raises
        :class:`~konduit.InputValidationError` naming each field at fault (nothing changes) and
        :class:`~konduit.NotAnswerable` when the step does not wait for an answer now (not
        reached yet, answered already, past its deadline, its execution ended). Returns the
        :class:`konduit.records.Answer` recorded (docs/people-in-the-loop.md)."""
        return self._run(self._operations.answer(execution_id, step, value, answered_by=answered_by))

    def retry_now(self, execution_id: ExecutionId, task_id: int) -> bool:
        """Make a task waiting out its retry backoff claimable now; False when it is not in
        backoff any more (a worker claimed it, it ended, or it is not of this execution)."""
        return self._run(self._operations.retry_now(execution_id, task_id))

    def migrate(self, execution_id: ExecutionId, *, to_version: int) -> MigrationRecord:
        """Move a running execution to version ``to_version`` of its workflow
        (docs/migrating-executions.md; the schema's migrations are ``konduit db migrate``).
        Allowed when every step that started or ended exists in that version with the same
        upstreams; else :class:`konduit.MigrationRefused` (``.step`` names the step at
        fault)."""
        return self._run(self._operations.migrate(execution_id, to_version=to_version))

    def migrate_workflow(self, workflow: str, from_version: int, to_version: int) -> builtins.list[MigrationRecord]:
        """Move every running execution of ``workflow`` at ``from_version`` to
        ``to_version``, each on its own; refused ones come back with ``migrated=False`` and
        the reason."""
        return self._run(self._operations.migrate_workflow(workflow, from_version, to_version))

    def pause_schedule(self, name: str) -> bool:
        """Stop starting ``name``'s ticks (in every worker) until :meth:`resume_schedule`;
        False when it was paused already. Raises :class:`konduit.ScheduleNotFound`."""
        return self._run(self._operations.pause_schedule(name))

    def resume_schedule(self, name: str) -> bool:
        """Start ``name``'s ticks again; its ``missed`` policy decides what becomes of the
        ticks that passed while it was paused. False when it was not paused."""
        return self._run(self._operations.resume_schedule(name))

    def prune(self, older_than: Duration, *, include_dead_letters: bool=False, batch_size: int=BATCH_SIZE) -> int:
        """Delete executions that finished more than ``older_than`` ago (``"7d"``, or seconds)
        with every row of theirs, ``batch_size`` executions per transaction; returns how many
        were deleted. Pending and running executions are never touched; executions holding a
        dead letter that no repair superseded are kept unless ``include_dead_letters``."""
        return self._run(self._operations.prune(older_than, include_dead_letters=include_dead_letters, batch_size=batch_size))

    def move_to_history(self, older_than: Duration, *, batch_size: int=BATCH_SIZE) -> int:
        """Move executions that finished more than ``older_than`` ago (``"1d"``, or seconds) out
        of the tables the workers write into the history (tables partitioned by the day they
        finished, which :meth:`prune` drops a day at a time), ``batch_size`` per transaction;
        returns how many moved. They read the same after the move; pending and running
        executions, and those holding a dead letter, stay. ``App(history_after=...)`` makes
        the workers' leader do this every minute (docs/retention.md, "History")."""
        return self._run(self._operations.move_to_history(older_than, batch_size=batch_size))

    def count_prunable(self, older_than: Duration) -> Prunable:
        """What :meth:`prune` with the same ``older_than`` would consider, deleting nothing:
        ``finished`` executions, ``dead_letters`` of them held by a dead letter."""
        return self._run(self._operations.count_prunable(older_than))

    def retry_webhook_delivery(self, delivery_id: UUID | str) -> bool:
        """Send a failed or refused webhook delivery again now; False when it is not one."""
        return self._run(self._operations.retry_webhook_delivery(delivery_id))

    def unregister_webhooks(self, webhooks: Iterable[Webhook]) -> int:
        """Stop writing deliveries for webhooks an App no longer has (the database keeps the
        webhooks Apps registered until told otherwise); returns how many were registered."""
        return self._run(self._operations.unregister_webhooks(webhooks))

    def list(self, *, status: str | None=None, workflow: str | None=None, tags: Mapping[str, str] | None=None, idempotency_key: str | None=None, input: Mapping[str, Any] | None=None, since: datetime | None=None, until: datetime | None=None, id_prefix: str | None=None, version: int | None=None, fair_key: str | None=None, limit: int=100) -> builtins.list[ExecutionResult]:
        """Recent executions, newest first, without their outputs (:meth:`status` has them):
        of a ``status`` and ``workflow``, and with any part of a search (see
        :class:`konduit.ExecutionFilter`: ``tags``, ``idempotency_key``, ``input`` fields,
        ``since``/``until``, ``id_prefix``, ``version``, ``fair_key``); :meth:`search` returns
        the same with their tags, a page at a time."""
        return self._run(self._operations.list(status=status, workflow=workflow, tags=tags, idempotency_key=idempotency_key, input=input, since=since, until=until, id_prefix=id_prefix, version=version, fair_key=fair_key, limit=limit))

    def search(self, where: ExecutionFilter | None=None, *, id_prefix: str | None=None, idempotency_key: str | None=None, tags: Mapping[str, str] | None=None, input: Mapping[str, Any] | None=None, status: str | None=None, workflow: str | None=None, version: int | None=None, since: datetime | None=None, until: datetime | None=None, fair_key: str | None=None, before: tuple[datetime, UUID] | None=None, limit: int=50) -> builtins.list[ExecutionFound]:
        """Find executions, newest first: by ``where`` (a :class:`konduit.ExecutionFilter`) or
        its parts as keywords (not both), older than ``before`` (the ``(created_at, id)`` of
        the previous page's last one). Every part is answered by an index."""
        return self._run(self._operations.search(where, id_prefix=id_prefix, idempotency_key=idempotency_key, tags=tags, input=input, status=status, workflow=workflow, version=version, since=since, until=until, fair_key=fair_key, before=before, limit=limit))

    def workflows(self) -> builtins.list[WorkflowRecord]:
        """Every registered workflow version: what can be started by name."""
        return self._run(self._operations.workflows())

    def versions(self, workflow: str | None=None) -> builtins.list[VersionState]:
        """Per registered workflow version (or those of ``workflow``): running executions and
        the live workers serving it (``unserved`` when none does); see
        docs/changing-workflows.md."""
        return self._run(self._operations.versions(workflow))

    def workflow_served(self, name: str, version: int) -> bool:
        """Whether any live worker claims tasks of workflow ``name`` at ``version``."""
        return self._run(self._operations.workflow_served(name, version))

    def outputs(self, execution_id: ExecutionId) -> builtins.list[OutputVersion]:
        """Every output version of an execution, oldest first (repairs add versions)."""
        return self._run(self._operations.outputs(execution_id))

    def payloads(self, execution_id: ExecutionId) -> builtins.list[Payload]:
        """Every payload of an execution's tasks, late results included."""
        return self._run(self._operations.payloads(execution_id))

    def tasks(self, execution_id: ExecutionId) -> builtins.list[TaskRecord]:
        """Every task of an execution (all generations), with attempts and errors."""
        return self._run(self._operations.tasks(execution_id))

    def steps(self, execution_id: ExecutionId) -> builtins.list[StepRecord]:
        """Every step of an execution with its join counters and timings (fan-in wait)."""
        return self._run(self._operations.steps(execution_id))

    def attempt_logs(self, execution_id: ExecutionId) -> builtins.list[AttemptLog]:
        """What the execution's handlers logged (``logging`` and ``ctx.log``), attempt by
        attempt, oldest first; attempts that logged nothing are left out."""
        return self._run(self._operations.attempt_logs(execution_id))

    def journal(self, execution_id: ExecutionId) -> builtins.list[JournalEntry]:
        """The durable calls an execution's handlers recorded (``ctx.call``; docs/journal.md),
        by step, item and position: each call's name, the attempt that ran it live, how long it
        took and how often later attempts replayed it."""
        return self._run(self._operations.journal(execution_id))

    def stream(self, execution_id: ExecutionId, name: str | None=None, *, from_offset: int=0, follow: bool=True) -> Iterator[StreamChunk]:
        """The records of an execution's durable stream ``name`` (``ctx.stream``; None: its
        only stream), from ``from_offset`` on, in order, each once: data chunks, and a restart
        record where a retried attempt started writing again (docs/streams.md). With
        ``follow`` it then yields records as they are written and ends when the stream does
        (its task or its execution ended); without, at the end of what is stored now. To
        resume after a disconnect, call it again with the last offset read + 1. Raises
        :class:`~konduit.StreamNotFound` when the execution has several streams and no
        ``name`` is given."""
        return self._iterate(self._operations.stream(execution_id, name, from_offset=from_offset, follow=follow))

    def streams(self, execution_id: ExecutionId) -> builtins.list[StreamRecord]:
        """Every durable stream of an execution, by name: its step, records, bytes, restarts."""
        return self._run(self._operations.streams(execution_id))

    def auto_repair_status(self, execution_id: ExecutionId) -> str | None:
        """How the automatic repair (``repair_within``) of an execution stands, as one line
        (``auto-repaired at ... (repair_within=24h)``, ``auto-repair pending: ...``), or None
        when its workflow has no repair contract or the execution is not covered by it."""
        return self._run(self._operations.auto_repair_status(execution_id))

    def stall(self, execution_id: ExecutionId) -> AlertRecord | None:
        """The open ``execution_stalled`` alert of an execution (nothing of it can run and the
        stall watchdog could not move it), or None; see docs/alerts.md."""
        return self._run(self._operations.stall(execution_id))

    def dead_letters(self, limit: int=50) -> builtins.list[DeadLetter]:
        """Tasks that failed for good (retries exhausted or non-retryable), newest first."""
        return self._run(self._operations.dead_letters(limit))

    def workers(self, stale_seconds: float | None=None) -> builtins.list[WorkerRecord]:
        """Live workers (not stopped, heard from within ``stale_seconds``, else within their
        own lease): host, pid, queues, workflows served, isolation, slots, running tasks,
        abandoned threads and ``heartbeat_age`` in seconds."""
        return self._run(self._operations.workers(stale_seconds))

    def alerts(self, *, include_resolved: bool=False, kind: str | None=None, workflow: str | None=None, limit: int=100) -> builtins.list[AlertRecord]:
        """Stored alerts (window at risk, fan-in wait, no recent success, execution stalled,
        ...), newest first: the open ones, or resolved ones too; see docs/alerts.md."""
        return self._run(self._operations.alerts(include_resolved=include_resolved, kind=kind, workflow=workflow, limit=limit))

    def webhook_deliveries(self, *, status: str | None=None, execution_id: ExecutionId | None=None, limit: int=100) -> builtins.list[WebhookDelivery]:
        """Webhook deliveries, newest first (optionally of one status: pending, delivered,
        failed, refused; or of one execution); see docs/webhooks.md."""
        return self._run(self._operations.webhook_deliveries(status=status, execution_id=execution_id, limit=limit))

    def schedules(self) -> builtins.list[ScheduleRecord]:
        """Every stored schedule with its next tick and the execution of its latest tick.
        Schedules are stored when a worker of the App that defines them starts."""
        return self._run(self._operations.schedules())

    def inbox(self, *, execution_id: ExecutionId | None=None, limit: int=100) -> builtins.list[OpenInput]:
        """Every ``wait_for_input`` step waiting for a person's answer (of ``execution_id``, or
        of all executions), oldest first: what the dashboard's inbox lists
        (docs/people-in-the-loop.md)."""
        return self._run(self._operations.inbox(execution_id=execution_id, limit=limit))

    def answers(self, execution_id: ExecutionId) -> builtins.list[Answer]:
        """The answers given to an execution's ``wait_for_input`` steps: the value, who
        answered and when, oldest first."""
        return self._run(self._operations.answers(execution_id))

    def triggers(self, workflow: str | None=None) -> builtins.list[TriggerRecord]:
        """The stored event triggers (``wf.on_event``, of ``workflow``) with their open bursts
        or batches, pending events and last event; docs/events.md."""
        return self._run(self._operations.triggers(workflow))
