"""The worker: claim ready tasks in batches, run them, record outcomes, keep leases alive.

One asyncio loop per process. Components: the claimer (``task_claim_batch`` with SKIP LOCKED,
woken by LISTEN/NOTIFY with a polling fallback), the executor (handlers), the completer (the
fan-in transaction), the heartbeat (lease extension) and maintenance (expired leases).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from konduit.core.context import Context
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.db.database import Database
from konduit.db.migrate import ensure_current
from konduit.engine.advancer import Advanced
from konduit.engine.completer import Completion, Recorded, record, record_ended
from konduit.engine.registry import Registry
from konduit.errors import DatabaseError, DatabaseUnavailable, KonduitError
from konduit.worker.batcher import CompletionBatcher
from konduit.worker.config import WorkerConfig
from konduit.worker.executor import Claimed, Executor
from konduit.worker.maintenance import end_timed_out_executions, reclaim_expired_leases

log = logging.getLogger("konduit.worker")
T = TypeVar("T")


class Worker:
    def __init__(
        self,
        db: Database,
        registry: Registry,
        config: WorkerConfig | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_BYTES,
    ):
        self.db = db
        self.registry = registry
        self.config = config or WorkerConfig()
        self.executor = Executor(db, self.config.concurrency, max_payload_bytes)
        self.batcher = CompletionBatcher(lambda group: record_ended(db, registry, group))
        self.running: dict[int, tuple[Claimed, asyncio.Task[None]]] = {}
        self.contexts: dict[int, Context] = {}
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._draining = False
        self._completer: asyncio.Task[None] | None = None
        self._recording: set[int] = set()  # tasks whose handler returned: never cancel those
        self.completed = 0

    def stop(self) -> None:
        """Ask the worker to stop claiming and shut down gracefully."""
        self._stop.set()
        self._wake.set()

    async def run(self) -> None:
        cfg = self.config
        await ensure_current(self.db)
        from konduit.engine.client import Client

        await Client(self.db, self.registry).register_all()
        await self.db.run(
            "worker_register",
            id=cfg.worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            concurrency=cfg.concurrency,
            queues=list(cfg.queues),
            workflows=self.registry.keys(),
            isolation=cfg.isolation,
            lease_seconds=cfg.lease_seconds,
        )
        log.info("worker %s up: concurrency %s, queues %s", cfg.worker_id, cfg.concurrency,
                 ",".join(cfg.queues))
        helpers = [
            asyncio.create_task(self._listen(), name="konduit-listen"),
            asyncio.create_task(self._heartbeat(), name="konduit-heartbeat"),
            asyncio.create_task(self._maintain(), name="konduit-maintenance"),
            asyncio.create_task(self.batcher.run(), name="konduit-completer"),
        ]
        self._completer = helpers[-1]
        try:
            await self._claim_loop()
            await self._drain()
        finally:
            for h in helpers:
                h.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            self.executor.close()
            try:
                await self.db.run("worker_stop", id=cfg.worker_id)
            except DatabaseError:
                pass
            log.info("worker %s stopped after %s tasks", cfg.worker_id, self.completed)

    async def _claim_loop(self) -> None:
        cfg = self.config
        workflows = self.registry.keys()
        backoff = 0.5
        while not self._stop.is_set():
            free = cfg.concurrency - len(self.running)
            claimed: list[Claimed] = []
            if free > 0:
                try:
                    rows = await self.db.all(
                        "task_claim_batch",
                        queues=list(cfg.queues),
                        workflows=workflows,
                        limit=free,
                        lease_seconds=cfg.lease_seconds,
                        worker_id=cfg.worker_id,
                    )
                    backoff = 0.5
                except DatabaseError as exc:
                    log.warning("claim failed (%s); retrying in %.1f s", exc, backoff)
                    await self._sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
                    continue
                claimed = [Claimed.from_row(r) for r in rows]
                for task in claimed:
                    self.running[task.id] = (task, asyncio.create_task(self._run(task)))
            if free > 0 and len(claimed) == free:
                continue  # there may be more ready work: claim again at once
            self._wake.clear()
            await self._sleep(cfg.poll_interval)

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def _run(self, task: Claimed) -> None:
        try:
            spec = self.registry.get(task.workflow_name, task.workflow_version)
            ctx = await self._retrying(lambda: self.executor.context_for(spec, task))
            self.contexts[task.id] = ctx
            completion = await self.executor.run(spec, task, ctx)
            self._recording.add(task.id)
            try:
                outcome, advanced = await self._retrying(lambda: self._record(completion))
            except DatabaseError as exc:
                # The outcome itself cannot be stored: record that as the task's failure (no
                # payload), so the execution moves on instead of waiting for a lease to expire.
                log.error("could not record task %s (%s): %s", task.id, task.step, exc)
                failure = replace(
                    completion, outcome="failed", payload=None, payload_json=None, routes=None,
                    error=f"the outcome could not be stored: {exc}", source="handler",
                )
                outcome, advanced = await self._retrying(lambda: self._record(failure))
            if outcome is Recorded.LEASE_LOST:
                log.warning(
                    "task %s (%s) was no longer leased by this worker; its result was dropped",
                    task.id, task.step,
                )
            else:
                self.completed += 1
                if advanced and advanced.fired:
                    self._wake.set()
                if outcome is Recorded.RETRYING:
                    # Claim the retry when it is due, not at the next poll.
                    asyncio.get_running_loop().call_later(completion.retry_delay, self._wake.set)
        except asyncio.CancelledError:
            if self._draining:
                # Shutdown ran out of grace: hand the task back so another worker takes it now
                # instead of after the lease expires. Shielded: this coroutine is being cancelled.
                await asyncio.shield(self._release(task))
            raise
        except Exception:  # an engine bug must not take the worker down: the lease expires
            log.exception("internal error running task %s; its lease will expire", task.id)
        finally:
            self.running.pop(task.id, None)
            self.contexts.pop(task.id, None)
            self._recording.discard(task.id)
            self._wake.set()

    async def _record(self, completion: Completion) -> tuple[Recorded, Advanced | None]:
        if completion.outcome in ("retry", "released") or self._completer is None \
                or self._completer.done():
            # Retries decide nothing about the DAG; and should the batching loop ever be gone
            # (shutdown), an outcome is still recorded, alone.
            return await record(self.db, self.registry, completion)
        return await self.batcher.submit(completion)

    async def _release(self, task: Claimed) -> None:
        completion = task.completion(
            "released", error=f"released by worker {self.config.worker_id} at shutdown"
        )
        try:
            outcome, _ = await record(self.db, self.registry, completion)
            log.info("task %s (%s) released: %s", task.id, task.step, outcome.value)
        except DatabaseError as exc:
            log.warning("could not release task %s (%s); its lease will expire", task.id, exc)

    async def _retrying(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run a database call, retrying through outages with backoff. The lease fence makes a
        late write harmless, so retrying until the database answers is always safe. Errors that
        are not about reaching the server are raised: retrying them would loop forever."""
        delay = 0.2
        while True:
            try:
                return await make()
            except DatabaseUnavailable as exc:
                log.warning("database unavailable (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _listen(self) -> None:
        while True:
            conn = None
            try:
                conn = await self.db.listen_connection()
                await conn.execute("LISTEN konduit_ready")
                await conn.execute("LISTEN konduit_finished")
                async for note in conn.notifies():
                    if note.channel == "konduit_finished":
                        self._stop_tasks_of(note.payload)
                    elif note.payload in self.config.queues:
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("listener lost (%s); polling until it is back", exc)
                await asyncio.sleep(1.0)
            finally:
                if conn is not None:
                    await conn.close()

    async def _heartbeat(self) -> None:
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.heartbeat_interval)
            held = [t for t, _ in self.running.values()]
            try:
                await self.db.run(
                    "worker_heartbeat",
                    id=cfg.worker_id,
                    running=len(self.running),
                    abandoned=self.executor.abandoned,
                )
                if not held:
                    continue
                rows = await self.db.all(
                    "task_extend_leases_if_held",
                    ids=[t.id for t in held],
                    lease_tokens=[t.lease_token for t in held],
                    lease_seconds=cfg.lease_seconds,
                )
            except DatabaseError as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            still = {r["id"] for r in rows}
            for t in held:
                if t.id not in still and t.id in self.running:
                    # Cancelled, or reclaimed after our lease ran out: stop the handler; its
                    # result would be refused by the fence anyway.
                    log.info("task %s (%s) lost its lease; asking it to stop", t.id, t.step)
                    self._cancel(t.id)

    def _stop_tasks_of(self, execution_id: str) -> None:
        """An execution ended (cancelled, failed, timed out): its running tasks here lost their
        leases in that transaction, so stop them now rather than at the next heartbeat."""
        for task_id, (task, _) in list(self.running.items()):
            if task_id in self._recording:
                continue  # its outcome is being recorded: possibly the one that ended it
            if str(task.execution_id) == execution_id:
                log.info("execution %s ended; stopping its task %s (%s)", execution_id, task_id,
                         task.step)
                self._cancel(task_id)

    def _cancel(self, task_id: int) -> None:
        ctx = self.contexts.get(task_id)
        if ctx is not None:
            ctx.request_cancel()
        entry = self.running.get(task_id)
        if entry is not None:
            task, job = entry
            spec = self.registry.get(task.workflow_name, task.workflow_version)
            if spec[task.step].is_async:
                job.cancel()

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.config.maintenance_interval)
            try:
                await reclaim_expired_leases(self.db, self.registry)
                await self._sweep_deadlines()
                await end_timed_out_executions(self.db)
            except (DatabaseError, KonduitError) as exc:
                log.warning("maintenance failed: %s", exc)

    async def _sweep_deadlines(self) -> None:
        """End tasks past their deadline whose own worker did not (it died or hung): the same
        degraded/timed_out completion, fenced by the lease token read here."""
        rows = await self.db.all(
            "task_list_past_deadline", grace_seconds=self.config.deadline_grace, limit=100
        )
        for row in rows:
            task = Claimed.from_row(row)
            if task.id in self.running:
                continue  # ours: the executor's own timer ends it
            try:
                spec = self.registry.get(task.workflow_name, task.workflow_version)
            except KonduitError:
                continue  # another deployment's workflow
            ctx = await self.executor.context_for(spec, task)
            completion = await self.executor.deadline_passed(spec, task, ctx)
            outcome, _ = await record(self.db, self.registry, completion)
            if outcome is Recorded.ENDED:
                log.info("task %s (%s) ended %s by the deadline sweep", task.id, task.step,
                         completion.outcome)

    async def _drain(self) -> None:
        """Graceful shutdown: let running tasks finish within the grace period, then cancel the
        rest and release their tasks so another worker takes them at once. (A sync handler's
        thread cannot be interrupted: its late result is refused by the lease fence.)"""
        if not self.running:
            return
        log.info("waiting up to %.0f s for %s running task(s)", self.config.shutdown_grace,
                 len(self.running))
        jobs = [job for _, job in self.running.values()]
        _, pending = await asyncio.wait(jobs, timeout=self.config.shutdown_grace)
        self._draining = True
        for job in pending:
            job.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
