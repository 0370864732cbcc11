"""Run one claimed task's handler and turn whatever happens into a :class:`Completion`."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any
from uuid import UUID

from konduit.context import Context
from konduit.db.database import Database, Row
from konduit.engine.advancer import load_upstream
from konduit.errors import NonRetryableError, PayloadError
from konduit.payloads import DEFAULT_MAX_BYTES, canonical_json
from konduit.worker.completer import Completion
from konduit.workflow import WorkflowSpec

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
        )


def _describe(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception(exc)).strip()
    except Exception:  # an exception whose state cannot even be formatted
        text = f"{type(exc).__name__} (unprintable)"
    return text[-8000:]


class Executor:
    """Runs handlers: async ones on the loop, sync ones on a thread pool sized to the worker."""

    def __init__(self, db: Database, threads: int, max_payload_bytes: int = DEFAULT_MAX_BYTES):
        self.db = db
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="konduit")
        self.max_payload_bytes = max_payload_bytes

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def context_for(self, spec: WorkflowSpec, task: Claimed) -> Context:
        async with self.db.transaction() as tx:
            upstream = await load_upstream(tx, spec, task.execution_id, task.step)
        step = spec[task.step]
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
            deadline=step.deadline.seconds if step.deadline else None,
        )

    async def call(self, spec: WorkflowSpec, task: Claimed, ctx: Context) -> Any:
        step = spec[task.step]
        if step.is_async:
            return await step.handler(ctx)
        loop = asyncio.get_running_loop()
        call = contextvars.copy_context().run
        return await loop.run_in_executor(self.pool, call, step.handler, ctx)

    async def run(self, spec: WorkflowSpec, task: Claimed, ctx: Context) -> Completion:
        """Run the handler; never raises for anything the handler does."""
        step = spec[task.step]
        base = partial(
            Completion,
            task_id=task.id,
            lease_token=task.lease_token,
            execution_id=task.execution_id,
            step=task.step,
            map_index=task.map_index,
            attempt=task.attempt,
        )
        retryable = True
        try:
            result = await self.call(spec, task, ctx)
            ended = time.monotonic()
            payload_json = canonical_json(
                result,
                what=f"output of step {task.step!r}",
                max_bytes=self.max_payload_bytes,
            )
            return base(
                outcome="succeeded",
                payload_json=payload_json,
                payload=result,
                age_seconds=time.monotonic() - ended,
            )
        except asyncio.CancelledError:
            raise
        except PayloadError as exc:
            # The handler ran and returned something that cannot be stored: retrying would
            # produce the same thing, so the attempt fails for good with the reason.
            error, retryable = str(exc), False
        except Exception as exc:
            error = _describe(exc)
            retryable = not isinstance(exc, NonRetryableError | step.retry.non_retryable)
        except BaseException as exc:  # SystemExit/KeyboardInterrupt raised inside a handler
            error, retryable = _describe(exc), True
        ended = time.monotonic()
        if retryable and task.attempt < task.max_attempts:
            return base(
                outcome="retry",
                error=error,
                retry_delay=step.retry.delay(task.attempt),
                age_seconds=time.monotonic() - ended,
            )
        log.warning(
            "task %s/%s[%s] of %s failed for good after %s attempt(s): %s",
            task.execution_id, task.step, task.map_index, spec.name, task.attempt,
            error.splitlines()[-1] if error else "",
        )
        return base(outcome="failed", error=error, age_seconds=time.monotonic() - ended)
