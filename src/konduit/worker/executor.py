"""Run one claimed task's handler and turn whatever happens into a :class:`Completion`."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from konduit.core.context import Context
from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json
from konduit.core.results import Route
from konduit.core.validation import OutputInvalid
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database, Row
from konduit.engine.advancer import Upstream, load_upstream
from konduit.engine.completer import Completion, record_late_result
from konduit.errors import NonRetryableError, PayloadError

log = logging.getLogger("konduit.executor")


@dataclass
class Claimed:
    """A task this worker holds a lease on."""

    id: int
    execution_id: UUID
    step: str
    map_index: int
    item: Any
    attempt: int
    max_attempts: int
    lease_token: UUID
    queue: str
    workflow_name: str
    workflow_version: int
    input: Any
    deadline_remaining: float | None = None  # seconds of the task's budget left at claim
    generation: int = 1

    def completion(self, outcome: str, **fields: Any) -> Completion:
        """How this attempt ended, addressed to this task and fenced by this lease."""
        return Completion(
            task_id=self.id,
            lease_token=self.lease_token,
            execution_id=self.execution_id,
            step=self.step,
            map_index=self.map_index,
            attempt=self.attempt,
            outcome=outcome,
            **fields,
        )

    @classmethod
    def from_row(cls, row: Row) -> Claimed:
        return cls(
            id=row["id"],
            execution_id=row["execution_id"],
            step=row["step"],
            map_index=row["map_index"],
            item=row["item"],
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            lease_token=row["lease_token"],
            queue=row["queue"],
            workflow_name=row["workflow_name"],
            workflow_version=row["workflow_version"],
            input=row["input"],
            deadline_remaining=row.get("deadline_remaining"),
            generation=row.get("generation", 1),
        )


def _describe(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception(exc)).strip()
    except Exception:  # an exception whose state cannot even be formatted
        text = f"{type(exc).__name__} (unprintable)"
    # PostgreSQL text cannot hold NUL; an error message must never make its own record fail.
    return text[-8000:].replace("\x00", "\\x00")


class Executor:
    """Runs handlers: async ones on the loop, sync ones on a thread pool sized to the worker."""

    def __init__(self, db: Database, threads: int, max_payload_bytes: int = DEFAULT_MAX_BYTES):
        self.db = db
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="konduit")
        self.max_payload_bytes = max_payload_bytes
        self.late_jobs: set[asyncio.Future[bool]] = set()
        self._upstreams: OrderedDict[tuple[UUID, str, int], Upstream] = OrderedDict()

    @property
    def abandoned(self) -> int:
        """Handler threads that outlived their deadline and are still running."""
        return 0

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def _upstream(self, spec: WorkflowSpec, task: Claimed) -> Upstream:
        # A map step's upstream outputs are fixed once it fired (a repair makes a new
        # generation), so its items, which share them, read them once. Other steps read afresh:
        # a quorum join's stragglers may have ended since its last attempt.
        if not spec[task.step].is_map:
            async with self.db.transaction() as tx:
                return await load_upstream(tx, spec, task.execution_id, task.step)
        key = (task.execution_id, task.step, task.generation)
        cached = self._upstreams.get(key)
        if cached is not None:
            self._upstreams.move_to_end(key)
            return cached
        async with self.db.transaction() as tx:
            upstream = await load_upstream(tx, spec, task.execution_id, task.step)
        self._upstreams[key] = upstream
        if len(self._upstreams) > 256:
            self._upstreams.popitem(last=False)
        return upstream

    async def context_for(self, spec: WorkflowSpec, task: Claimed) -> Context:
        upstream = await self._upstream(spec, task)
        return Context(
            execution_id=task.execution_id,
            workflow=spec.name,
            step=task.step,
            map_index=task.map_index,
            attempt=task.attempt,
            input=task.input,
            upstream=upstream.payloads,
            outcomes=upstream.outcomes,
            item=task.item,
            deadline=task.deadline_remaining,
        )

    async def _call(self, fn: Callable[[Context], Any], ctx: Context, *, late: Claimed | None = None) -> Any:
        """Call a handler or fallback: async ones on the loop, sync ones on the pool. A sync call
        cannot be interrupted; when ``late`` is given and the await is abandoned (deadline), its
        eventual result is kept as a late result of that attempt."""
        if inspect.iscoroutinefunction(fn):
            return await fn(ctx)
        future = self.pool.submit(contextvars.copy_context().run, fn, ctx)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            ctx.request_cancel()
            if late is not None:
                loop = asyncio.get_running_loop()
                future.add_done_callback(lambda f: self._late_done(loop, late, f))
            raise

    def _late_done(self, loop: asyncio.AbstractEventLoop, task: Claimed, future: Future[Any]) -> None:
        # Runs on the handler's thread; the worker may have shut down since (loop closed).
        try:
            loop.call_soon_threadsafe(self._keep_late, task, future)
        except RuntimeError:
            log.info("a late result of task %s arrived after the worker stopped", task.id)

    def _keep_late(self, task: Claimed, future: Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        result = future.result()
        if isinstance(result, Route):
            result = result.output
        try:
            payload_json = canonical_json(result, what="late result", max_bytes=self.max_payload_bytes)
        except PayloadError:
            return
        job = asyncio.ensure_future(record_late_result(self.db, task.lease_token, payload_json, result))
        self.late_jobs.add(job)
        job.add_done_callback(self._late_recorded)

    def _late_recorded(self, job: asyncio.Future[bool]) -> None:
        self.late_jobs.discard(job)
        if not job.cancelled() and job.exception() is None and job.result():
            log.info("kept a late result (it arrived after its deadline; the join did not use it)")

    def _payload(
        self, spec: WorkflowSpec, task: Claimed, result: Any
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

    async def run(self, spec: WorkflowSpec, task: Claimed, ctx: Context) -> Completion:
        """Run the handler under the task's deadline; never raises for anything the handler does."""
        step = spec[task.step]
        base = task.completion
        retryable = True
        budget = task.deadline_remaining
        deadline = asyncio.timeout(budget)
        try:
            if budget is not None and budget <= 0:
                return await self.deadline_passed(spec, task, ctx)
            async with deadline:
                try:
                    result = await self._call(step.handler, ctx, late=task)
                except asyncio.CancelledError:
                    if deadline.expired():
                        raise TimeoutError from None
                    raise
            ended = time.monotonic()
            payload, payload_json, routes = self._payload(spec, task, result)
            return base(
                "succeeded",
                payload_json=payload_json,
                payload=payload,
                routes=routes,
                age_seconds=time.monotonic() - ended,
            )
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            if deadline.expired():
                return await self.deadline_passed(spec, task, ctx)
            error = _describe(TimeoutError("the handler raised TimeoutError"))
        except (PayloadError, OutputInvalid) as exc:
            # The handler ran and returned something that cannot be stored or does not match its
            # declared type: retrying would produce the same, so the attempt fails for good.
            error, retryable = str(exc), False
        except Exception as exc:
            error = _describe(exc)
            retryable = not isinstance(exc, (NonRetryableError, *step.retry.non_retryable))
        except BaseException as exc:  # SystemExit/KeyboardInterrupt raised inside a handler
            error, retryable = _describe(exc), True
        ended = time.monotonic()
        if retryable and task.attempt < task.max_attempts:
            return base(
                "retry",
                error=error,
                retry_delay=step.retry.delay(task.attempt),
                age_seconds=time.monotonic() - ended,
            )
        log.warning(
            "task %s/%s[%s] of %s failed for good after %s attempt(s): %s",
            task.execution_id, task.step, task.map_index, spec.name, task.attempt,
            error.splitlines()[-1] if error else "",
        )
        if step.fallback_on_failure:
            degraded = await self._fallback(spec, task, ctx, reason=error)
            if degraded is not None:
                return degraded
        return base("failed", error=error, age_seconds=time.monotonic() - ended)

    async def deadline_passed(self, spec: WorkflowSpec, task: Claimed, ctx: Context) -> Completion:
        """The task ran out of budget: degraded with the fallback's payload, else timed_out."""
        reason = f"deadline exceeded (attempt {task.attempt} of step {task.step!r})"
        degraded = await self._fallback(spec, task, ctx, reason=reason)
        if degraded is not None:
            return degraded
        return task.completion("timed_out", error=reason)

    async def _fallback(
        self, spec: WorkflowSpec, task: Claimed, ctx: Context, *, reason: str
    ) -> Completion | None:
        step = spec[task.step]
        if step.fallback is None:
            return None
        try:
            result = await self._call(step.fallback, ctx)
            payload, payload_json, _ = self._payload(spec, task, result)
        except Exception as exc:
            log.warning("fallback of step %r failed: %s", task.step, exc)
            return task.completion(
                "timed_out" if "deadline" in reason else "failed",
                error=f"{reason}; the fallback failed too: {_describe(exc)}",
            )
        return task.completion(
            "degraded", payload_json=payload_json, payload=payload, error=reason, source="fallback"
        )
