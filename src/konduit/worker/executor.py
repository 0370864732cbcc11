"""Run one claimed task's handler and turn whatever happens into a :class:`Completion`.

Whatever a handler or fallback does — returns, raises (``BaseException`` included), blocks past
its deadline — ends only its own attempt: the executor asks the outcome policy
(:mod:`konduit.core.outcome`) what follows, and never raises for user code."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import logging
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any
from uuid import UUID

from konduit.core import attempt_logs, clock
from konduit.core.attempt_logs import AttemptLogs
from konduit.core.context import Context
from konduit.core.model import Command, Completion, Outcome, OutputSource, TaskAttempt
from konduit.core.outcome import Ending, Final, RetryAt, Verdict, decide
from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json, is_sealed
from konduit.core.results import Route
from konduit.core.streams import Streams, stream_name
from konduit.core.validation import OutputInvalid, readable_last_line
from konduit.core.waits import Armed
from konduit.core.workflow import StepSpec, WorkflowSpec
from konduit.db.database import Database, Tx
from konduit.engine import streams
from konduit.engine.completer import record_late_result
from konduit.engine.journal import journal_for
from konduit.engine.outputs import Upstream, load_upstream
from konduit.errors import DatabaseError, NonRetryableError, PayloadError, StreamFull
from konduit.logs import enter_attempt, leave_attempt
from konduit.settings import settings
from konduit.threads import HandlerThreads, process_abandoned
from konduit.tracing import AttemptTracer
from konduit.worker.created_with import CreatedWith
from konduit.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

FALLBACK_SETTLE_GRACE = 1.0
"""Seconds past a fallback's time limit before a worker that did not call it may end its task
(its caller, alive, records the outcome within its limit; one that died never will)."""


STREAM_SETTLE_SECONDS = 5.0
"""How long an attempt that raised waits for its stream writes still on their way."""


Claimed = TaskAttempt
"""The old name of :class:`~konduit.core.model.TaskAttempt`, kept for its importers."""


def _describe(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception(exc)).strip()
    except Exception:  # an exception whose state cannot even be formatted
        text = f"{type(exc).__name__} (unprintable)"
    tail = readable_last_line(exc)
    if tail is not None:
        text = f"{text}\n{tail}"
    # PostgreSQL text cannot hold NUL; an error message must never make its own record fail.
    return text[-8000:].replace("\x00", "\\x00")


def _captured(
    fn: Callable[[Context], Any], ctx: Context, begin: Callable[[], None] | None = None
) -> tuple[bool, Any]:
    """Run user code on its thread and hand back what it returned or raised as a value. An
    exception set on an awaited future is *thrown* into the awaiting task, and a thrown
    ``GeneratorExit`` closes every coroutine of the task on its way out, whatever they catch;
    raised afresh in the executor's own frame it is an ordinary exception. ``begin`` is called
    on the thread right before the user's code: the handler has started then, not when it was
    queued for a thread."""
    try:
        if begin is not None:
            begin()
        return True, fn(ctx)
    except BaseException as exc:
        return False, exc


_ASYNC: dict[Any, bool] = {}
"""Whether each handler (or fallback) called so far is a coroutine function: asked once per
callable instead of through ``inspect`` on every attempt."""


def _is_async(fn: Callable[[Context], Any]) -> bool:
    try:
        return _ASYNC[fn]
    except KeyError:
        found = _ASYNC[fn] = inspect.iscoroutinefunction(fn)
        return found
    except TypeError:  # an unhashable callable: asked each time
        return inspect.iscoroutinefunction(fn)


def _sealed_payload(ctx: Context) -> tuple[str, Any] | None:
    """The first payload of ``ctx`` that was read sealed (konduit.db.sealing), with where it
    is, or None: the handler must not be handed an envelope in place of its data."""
    if is_sealed(ctx.input):
        return "the execution's input", ctx.input
    if is_sealed(ctx.item):
        return "the map item", ctx.item
    for step, payload in ctx.upstream.items():
        if is_sealed(payload):
            return f"the output of step {step!r}", payload
        if type(payload) is list and payload:
            # A map's items were sealed with one codec: the first and last tell (a walk of a
            # million items on every attempt would not).
            for i in (0, len(payload) - 1):
                if is_sealed(payload[i]):
                    return f"item {i} of the output of step {step!r}", payload[i]
    return None
async def _flush_streams(ctx: Context) -> None:
    """Wait for the stream writes an async handler did not await: its attempt ends after them,
    and fails with the error of one that failed."""
    if ctx._streams is not None:
        await ctx._streams.flush()


def _abandon_streams(ctx: Context) -> None:
    """Cancel the stream writes of an attempt the worker ends (cancel, deadline) that are not
    stored yet. An attempt that raised waits for its writes instead (``Streams.settle``)."""
    if ctx._streams is not None:
        ctx._streams.abandon()


def _being_cancelled() -> bool:
    """Whether the current task is being cancelled from outside (shutdown, execution ended), as
    opposed to user code raising ``CancelledError`` of its own."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Executor:
    """Runs handlers: async ones on the loop, sync ones on threads (or child processes) that a
    hung handler never keeps from new work."""

    def __init__(
        self,
        db: Database,
        max_payload_bytes: int = DEFAULT_MAX_BYTES,
        *,
        isolation: str = "thread",
        fallback_timeout: float = 5.0,
    ):
        self.db = db
        attempt_logs.install()  # what handlers log is kept with their attempts
        # The policy each task was created with, when its creator applied another revision.
        self.created_with = CreatedWith(db)
        self.threads = HandlerThreads()
        # The worker's histograms (konduit worker --metrics-port); None measures nothing.
        self.metrics: WorkerMetrics | None = None
        self.isolation = isolation
        self.fallback_timeout = fallback_timeout
        self.max_payload_bytes = max_payload_bytes
        self.late_jobs: set[asyncio.Future[bool]] = set()
        self._upstreams: OrderedDict[tuple[UUID, str, int], Upstream] = OrderedDict()
        # Set by the App when tracing is on (konduit.tracing); None costs nothing.
        self.tracer: AttemptTracer | None = None

    @property
    def fallback_settle(self) -> float:
        """How long after a fallback started other workers leave its task to its caller."""
        return self.fallback_timeout + FALLBACK_SETTLE_GRACE

    @property
    def abandoned(self) -> int:
        """Threads of user code that outlived their limit and are still running: handlers (and
        fallbacks) past their deadline, and the process's other user code the worker ran on
        its loop (start-time code, triggers' code, maps' ``over()``: :func:`process_abandoned`)."""
        return self.threads.abandoned + process_abandoned()

    async def _upstream(self, tx: Tx, spec: WorkflowSpec, task: TaskAttempt) -> Upstream:
        # A map step's upstream outputs are fixed once it fired (a repair makes a new
        # generation), so its items, which share them, read them once. Other steps read afresh:
        # a quorum join's stragglers may have ended since its last attempt.
        if not spec[task.step].is_map:
            return await load_upstream(tx, spec, task.execution_id, task.step)
        key = (task.execution_id, task.step, task.generation)
        cached = self._upstreams.get(key)
        if cached is not None:
            self._upstreams.move_to_end(key)
            return cached
        upstream = await load_upstream(tx, spec, task.execution_id, task.step)
        self._upstreams[key] = upstream
        if len(self._upstreams) > 256:
            self._upstreams.popitem(last=False)
        return upstream

    async def context_for(self, spec: WorkflowSpec, task: TaskAttempt, tx: Tx | None = None) -> Context:
        """The handler's context, its upstream read in ``tx`` (or a transaction of its own). A
        root step has no upstream: nothing is read, and no transaction is opened for it."""
        if self.tracer is not None and not self.tracer.knows(task.execution_id):
            row = await (self.db if tx is None else tx).one(
                "execution_get_trace_context", id=task.execution_id)
            self.tracer.remember(task.execution_id, None if row is None else row["traceparent"],
                                 None if row is None else row["tracestate"])
        if not spec[task.step].after:
            upstream = Upstream({}, {})
        elif tx is None:
            async with self.db.transaction() as own:
                upstream = await self._upstream(own, spec, task)
        else:
            upstream = await self._upstream(tx, spec, task)
        return Context(
            execution_id=task.execution_id,
            workflow=spec.name,
            step=task.step,
            map_index=task.map_index,
            attempt=task.attempt,
            input=_handler_input(spec, task),
            upstream=upstream.payloads,
            outcomes=upstream.outcomes,
            item=task.item,
            deadline=task.deadline_remaining,
            scheduled_at=task.scheduled_at,
            hedged=task.hedged,
            _journal=journal_for(self.db, task, max_bytes=self.max_payload_bytes,
                                 hedged_step=spec[task.step].hedge is not None),
            _streams=None if task.lease_token is None else Streams(
                step=task.step,
                default=stream_name(task.step, task.map_index, spec[task.step].is_map),
                send=lambda name, seq, payload: self._stream_append(task, name, seq, payload),
                loop=asyncio.get_running_loop(), max_bytes=self.max_payload_bytes),
        )

    async def _stream_append(self, task: TaskAttempt, name: str, seq: int, payload: str) -> int:
        """Store one chunk a handler wrote to its stream (:mod:`konduit.engine.streams`),
        within the bounds the settings give at the moment of the write."""
        current = settings()
        return await streams.append(
            self.db, task, name=name, seq=seq, payload_json=payload,
            limits=streams.StreamLimits(current.stream_max_chunks, current.stream_max_bytes))

    async def _call(
        self,
        fn: Callable[[Context], Any],
        ctx: Context,
        *,
        late: TaskAttempt | None = None,
        started: asyncio.Event | None = None,
    ) -> Any:
        """Call a handler or fallback: async ones on the loop, sync ones on a thread (or in a
        child process). A sync thread cannot be interrupted: when the await is abandoned
        (deadline, cancel) the thread is counted as abandoned and, when ``late`` is given, its
        eventual result is kept as a late result of that attempt."""
        if _is_async(fn):
            if started is not None:
                started.set()
            return await fn(ctx)
        if self.isolation == "process":
            from konduit.worker.isolation import call_in_process

            if started is not None:
                started.set()
            return await call_in_process(fn, ctx, timeout=None)
        begin = None
        if started is not None:
            loop = asyncio.get_running_loop()
            flag = started

            def begin() -> None:
                loop.call_soon_threadsafe(flag.set)

        future = self.threads.submit(contextvars.copy_context().run, _captured, fn, ctx, begin)
        try:
            returned, value = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            ctx.request_cancel()
            self.threads.abandon(future)
            if not future.done():
                log.warning(
                    "abandoned the thread of step %r (it ignored its deadline or cancel); "
                    "%s abandoned thread(s) in this worker", ctx.step, self.threads.abandoned,
                )
            if late is not None:
                loop = asyncio.get_running_loop()
                future.add_done_callback(lambda f: self._late_done(loop, late, f))
            raise
        if not returned:
            raise value  # raised here, in this frame: see _captured
        return value

    def _late_done(self, loop: asyncio.AbstractEventLoop, task: TaskAttempt, future: Future[Any]) -> None:
        # Runs on the handler's thread; the worker may have shut down since (loop closed).
        try:
            loop.call_soon_threadsafe(self._keep_late, task, future)
        except RuntimeError:
            log.info("a late result of task %s arrived after the worker stopped", task.id)

    def _keep_late(self, task: TaskAttempt, future: Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        returned, value = future.result()
        if returned:
            self.keep_late(task, value)

    def keep_late(self, task: TaskAttempt, result: Any) -> None:
        """Store a result whose attempt was already ended (deadline or reclaim) as ``late``."""
        if isinstance(result, Route):
            result = result.output
        if task.lease_token is None:
            return
        try:
            payload_json = canonical_json(result, what="late result", max_bytes=self.max_payload_bytes)
        except BaseException:  # unstorable, or its own code raised: not kept
            return
        job = asyncio.ensure_future(record_late_result(self.db, task.lease_token, payload_json, result))
        self.late_jobs.add(job)
        job.add_done_callback(self._late_recorded)

    def _late_recorded(self, job: asyncio.Future[bool]) -> None:
        self.late_jobs.discard(job)
        if not job.cancelled() and job.exception() is None and job.result():
            log.info("kept a late result (it arrived after its attempt ended; the join did not use it)")

    def _payload(
        self, spec: WorkflowSpec, task: TaskAttempt, result: Any
    ) -> tuple[Any, str, tuple[str, ...] | None]:
        step = spec[task.step]
        routes = None
        if isinstance(result, Route):
            unknown = sorted(set(result.to) - set(spec.downstream[task.step]))
            if unknown or step.is_map:
                raise PayloadError(
                    f"step {task.step!r} routed to {', '.join(unknown) or 'a map item'}: a step may "
                    f"only route to its own downstream steps "
                    f"({', '.join(spec.downstream[task.step]) or 'none'})"
                )
            routes, result = result.to, result.output
        if step.validator is not None:
            result = step.validator.validate(result)
        payload_json = canonical_json(
            result, what=f"output of step {task.step!r}", max_bytes=self.max_payload_bytes
        )
        return result, payload_json, routes

    async def run(
        self, spec: WorkflowSpec, task: TaskAttempt, ctx: Context, *, started: asyncio.Event | None = None
    ) -> Completion:
        """Run the handler under the task's deadline; never raises for anything the handler does
        (only ``CancelledError`` when the worker itself cancels the attempt). ``started`` is set
        once the handler has been handed its context.

        Lines logged meanwhile carry the attempt's fields (:mod:`konduit.logs`) and are kept
        with the attempt (:mod:`konduit.core.attempt_logs`); with tracing on, the attempt is a
        span, current while the handler runs."""
        logs = ctx._logs = AttemptLogs()
        token = attempt_logs.enter(logs)
        try:
            # enter/leave rather than ``with attempt_scope(task)``: a generator-based context
            # manager costs several calls, once per attempt on the worker's loop.
            scope = enter_attempt(task)
            try:
                if self.tracer is None:
                    completion = await self._run(spec, task, ctx, started)
                else:
                    with self.tracer.attempt(spec.name, task) as span:
                        completion = await self._run(spec, task, ctx, started)
                        self.tracer.ended(span, completion)
            finally:
                leave_attempt(scope)
        finally:
            attempt_logs.leave(token)
        await _close_journal(ctx)  # not when cancelled: a cancelled attempt's counts can go
        # Most attempts log nothing: their completion carries no logs, and the round no rows.
        return dataclasses.replace(completion, logs=logs) if logs else completion

    async def _run(
        self, spec: WorkflowSpec, task: TaskAttempt, ctx: Context, started: asyncio.Event | None
    ) -> Completion:
        step = spec[task.step]
        budget = task.deadline_remaining
        began = clock.monotonic()
        ending, error, result = await self._attempt(step, task, ctx, budget, started)
        if ctx._streams is not None and ending is not Ending.RETURNED \
                and ending is not Ending.DEADLINE_PASSED:
            # What an attempt wrote before it raised is kept, in order, before its end.
            await ctx._streams.settle(STREAM_SETTLE_SECONDS)
        ended = clock.monotonic()
        if self.metrics is not None:
            self.metrics.attempt(spec.name, task.step, ending.value, ended - began)
        if ending is Ending.RETURNED:
            if step.wait is not None and isinstance(result, Armed):
                # A wait step's arming attempt: the task waits (docs/durable-waits.md).
                return task.completion(Command.WAIT, payload=result,
                                       age_seconds=clock.monotonic() - ended)
            try:
                payload, payload_json, routes = self._payload(spec, task, result)
            except (PayloadError, OutputInvalid) as exc:
                # Unstorable or not of its declared type: retrying would produce the same.
                ending, error = Ending.INVALID_OUTPUT, str(exc)
            except BaseException as exc:  # the result's own code (a dict's items()...): anything
                ending = Ending.INVALID_OUTPUT
                error = (f"output of step {task.step!r} could not be checked and encoded: "
                         f"{type(exc).__name__}: {exc}")
            else:
                return task.completion(
                    Outcome.SUCCEEDED, payload_json=payload_json, payload=payload, routes=routes,
                    age_seconds=clock.monotonic() - ended,
                )
        remaining = None if budget is None else budget - (ended - began)
        verdict = decide(
            await self.created_with.policy(spec, step, task), ending, attempt=task.attempt,
            max_attempts=task.max_attempts,
            remaining=remaining, error=error, fallback_tried=task.fallback_tried,
        )
        completion = await self.conclude(spec, task, ctx, verdict, error=error)
        return dataclasses.replace(completion, age_seconds=clock.monotonic() - ended)

    async def _attempt(
        self,
        step: StepSpec,
        task: TaskAttempt,
        ctx: Context,
        budget: float | None,
        started: asyncio.Event | None,
    ) -> tuple[Ending, str | None, Any]:
        if budget is not None and budget <= 0:
            if started is not None:
                started.set()
            return Ending.DEADLINE_PASSED, None, None
        sealed = _sealed_payload(ctx)
        if sealed is not None:
            # Encrypted with a key this worker lacks (or kept in a store it cannot reach): the
            # attempt fails with the reason, as if the handler raised it; the worker goes on.
            if started is not None:
                started.set()
            where, value = sealed
            why = self.db.io.why_sealed(value)
            return Ending.RAISED, f"{type(why).__name__}: {where}: {why}", None
        # No deadline, no timeout context: entering and leaving one costs two coroutines and
        # a task lookup per attempt, for a limit that never expires.
        deadline = None if budget is None else clock.timeout(budget)
        try:
            if deadline is None:
                result = await self._call(step.handler, ctx, late=task, started=started)
                await _flush_streams(ctx)
            else:
                async with deadline:
                    result = await self._call(step.handler, ctx, late=task, started=started)
                    await _flush_streams(ctx)
            return Ending.RETURNED, None, result
        except asyncio.CancelledError as exc:
            if _being_cancelled():
                _abandon_streams(ctx)
                raise
            # The handler raised CancelledError of its own: an error like any other.
            return Ending.RAISED, _describe(exc), None
        except TimeoutError as exc:
            if deadline is not None and deadline.expired():
                _abandon_streams(ctx)
                return Ending.DEADLINE_PASSED, None, None
            return Ending.RAISED, _describe(exc), None
        except (PayloadError, OutputInvalid) as exc:
            return Ending.INVALID_OUTPUT, str(exc), None
        except Exception as exc:
            # A full stream stays full: another attempt would only find it so again.
            permanent = isinstance(exc, (NonRetryableError, StreamFull, *step.retry.non_retryable))
            return (Ending.NON_RETRYABLE if permanent else Ending.RAISED), _describe(exc), None
        except BaseException as exc:  # SystemExit, KeyboardInterrupt... raised by user code
            permanent = isinstance(exc, step.retry.non_retryable)
            return (Ending.NON_RETRYABLE if permanent else Ending.RAISED), _describe(exc), None


    async def conclude(
        self,
        spec: WorkflowSpec,
        task: TaskAttempt,
        ctx: Context | None,
        verdict: Verdict,
        *,
        error: str | None = None,
        **fields: Any,
    ) -> Completion:
        """Turn the outcome policy's verdict into a completion, running the fallback (with its
        own time limit) when the verdict asks for one (``ctx`` is read then when not given).
        ``fields`` go to the completion (the transition and its guard, for reclaims and sweeps).

        A fallback is called only after its start is recorded (at most once per task); when
        another worker recorded it first, the completion's command is :attr:`Command.YIELD`:
        nothing to record, that worker ends the task. A final outcome without the fallback is
        written only if no other worker's fallback of the task is under way
        (``fallback_settle``)."""
        if isinstance(verdict, RetryAt):
            return task.completion(
                Command.RETRY, error=error, retry_delay=verdict.delay,
                attempt_outcome=verdict.attempt_outcome, **fields,
            )
        assert isinstance(verdict, Final)
        reason = verdict.reason if verdict.reason is not None else error
        if verdict.outcome is Outcome.FAILED:
            log.warning(
                "task %s/%s[%s] of %s failed for good after %s attempt(s): %s",
                task.execution_id, task.step, task.map_index, spec.name, task.attempt,
                (reason or "").strip().splitlines()[-1:] or "",
            )
        if verdict.use_fallback:
            return await self._fallback(spec, task, ctx, verdict, reason, **fields)
        return task.completion(
            verdict.outcome, error=reason, attempt_outcome=verdict.attempt_outcome,
            fallback_settle=self.fallback_settle, **fields
        )

    async def deadline_passed(self, spec: WorkflowSpec, task: TaskAttempt, ctx: Context | None,
                              **fields: Any) -> Completion:
        """The task ran out of budget: degraded with the fallback's payload, else timed_out."""
        policy = await self.created_with.policy(spec, spec[task.step], task)
        verdict = decide(policy, Ending.DEADLINE_PASSED, attempt=task.attempt,
                         max_attempts=task.max_attempts, remaining=0.0,
                         fallback_tried=task.fallback_tried)
        return await self.conclude(spec, task, ctx, verdict, **fields)

    async def _start_fallback(self, task: TaskAttempt) -> bool:
        """Record, committed, that this task's fallback is called now: False when it was called
        before (by another worker, or one that died in it) or the task is no longer what was
        read. A fallback whose start cannot be recorded is not called: the sweeps call it."""
        try:
            row = await self.db.one("task_start_fallback_if_unstarted", id=task.id,
                                    lease_token=task.lease_token,
                                    settle_seconds=self.fallback_settle)
        except DatabaseError as exc:
            log.warning("task %s (%s): could not record that its fallback starts (%s); left to "
                        "the deadline sweep or a rescue", task.id, task.step, exc)
            return False
        if row is None:
            log.info("task %s (%s): its fallback was started already or the task changed "
                     "hands; not calling it here", task.id, task.step)
        return row is not None

    async def _fallback(
        self, spec: WorkflowSpec, task: TaskAttempt, ctx: Context | None, verdict: Final,
        reason: str | None, **fields: Any,
    ) -> Completion:
        step = spec[task.step]
        assert step.fallback is not None
        if not await self._start_fallback(task):
            return task.completion(Command.YIELD, error=reason, **fields)
        try:
            if ctx is None:
                ctx = await self.context_for(spec, task)
            # A fresh cancellation flag: the handler's attempt was asked to stop, not the fallback.
            fresh = dataclasses.replace(ctx, _cancelled=threading.Event())
            async with asyncio.timeout(self.fallback_timeout):
                result = await self._call(step.fallback, fresh)
            payload, payload_json, _ = self._payload(spec, task, result)
        except asyncio.CancelledError as exc:
            if _being_cancelled():
                raise
            failure = _describe(exc)
        except TimeoutError:
            failure = f"the fallback did not return within {self.fallback_timeout:g} s"
        except BaseException as exc:  # the fallback is user code too: nothing it raises escapes
            failure = _describe(exc)
        else:
            return task.completion(
                Outcome.DEGRADED, payload_json=payload_json, payload=payload, error=reason,
                source=OutputSource.FALLBACK, attempt_outcome=verdict.attempt_outcome, **fields,
            )
        log.warning("fallback of step %r failed: %s", task.step, failure.splitlines()[-1])
        return task.completion(
            verdict.outcome,
            error=f"{reason}; the fallback failed too: {failure}",
            attempt_outcome=verdict.attempt_outcome,
            **fields,
        )


async def _close_journal(ctx: Context) -> None:
    """Count the replays of the attempt's durable calls not counted yet (the execution page's
    figures): bookkeeping, so a failure here is logged and ends nothing."""
    if ctx._journal is None:
        return
    try:
        await ctx._journal.close()
    except DatabaseError as exc:
        log.info("step %r: the replays of its durable calls were not counted (%s)", ctx.step, exc)


def _handler_input(spec: WorkflowSpec, task: TaskAttempt) -> Any:
    """``ctx.input``: the workflow's input model built from the stored JSON (``input=``), else
    the JSON itself. The start checked the input against the model's schema; one that no longer
    builds (the model changed since, or a validator raised, ``KeyboardInterrupt`` included) is
    handed over as stored, with a warning naming why, and not raised here, where it would fail
    every task claimed beside it (and end the worker's loop)."""
    try:
        return spec.handler_input(task.input)
    except BaseException as exc:  # its validators are user code: KeyboardInterrupt too
        log.warning("task %s (%s): the input does not build workflow %r's input model, the "
                    "handler gets it as stored: %s", task.id, task.step, spec.name,
                    readable_last_line(exc) or f"{type(exc).__name__}: {exc}")
        return task.input
