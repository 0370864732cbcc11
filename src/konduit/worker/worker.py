"""The worker: claim ready tasks in batches, run them, record outcomes, keep leases alive.

One asyncio loop per process. This module holds the claim loop (``task_claim_batch`` with SKIP
LOCKED, alone or in a completion round's transaction), the slots, and each task's run from
start to recorded outcome. Its components live beside it:

* :mod:`~konduit.worker.starter`: start a claim's handlers under one lease check;
* :mod:`~konduit.worker.executor`: run a handler, turn what it did into a completion;
* :mod:`~konduit.worker.batcher`: outcomes that end together share one fan-in transaction;
* :mod:`~konduit.worker.arming`: a wait step's arming attempt (running -> waiting);
* :mod:`~konduit.worker.heartbeat`: extend leases, say which were lost;
* :mod:`~konduit.worker.listener`: LISTEN/NOTIFY, so the loops act before their next poll;
* :mod:`~konduit.worker.connectivity`: whether the database is there, retrying through outages;
* :mod:`~konduit.worker.maintenance`: rescue, deadline sweep, waits due, timed-out executions;
* :mod:`~konduit.worker.leadership`: which worker of the deployment runs them, each pass a
  :mod:`~konduit.worker.services` service.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any, TypeVar
from uuid import UUID

from konduit.aio import cancelling, wait_event
from konduit.core.context import Context
from konduit.core.model import (
    Command,
    Completion,
    ExecutionStatus,
    Outcome,
    OutputSource,
    Recorded,
    TaskAttempt,
)
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.core.webhooks import Webhook
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database, Tx
from konduit.db.migrate import describe_unknown, ensure_current
from konduit.engine import transitions
from konduit.engine import webhooks as webhook_store
from konduit.engine.advancer import Advanced
from konduit.engine.alerting import Alerting
from konduit.engine.auto_repair import AutoRepairer
from konduit.engine.completer import record, record_many
from konduit.engine.history import HistoryMover
from konduit.engine.registry import Registry
from konduit.engine.retention import Retention
from konduit.engine.schedules import Schedules
from konduit.errors import (
    DatabaseConflict,
    DatabaseError,
    DatabaseUnavailable,
    KonduitError,
    WorkerUnhealthy,
)
from konduit.logs import log_recorded
from konduit.worker.arming import Arming
from konduit.worker.batcher import BatcherStopped, CompletionBatcher
from konduit.worker.chunks import ChunkTaker
from konduit.worker.config import WorkerConfig
from konduit.worker.connectivity import RETRY_MAX_DELAY, Connectivity, retrying
from konduit.worker.executor import Executor
from konduit.worker.heartbeat import BeatRequest, beat
from konduit.worker.hedging import Hedger
from konduit.worker.leadership import Leadership, deployment
from konduit.worker.listener import listen
from konduit.worker.maintenance import Maintenance
from konduit.worker.metrics import WorkerMetrics
from konduit.worker.passes import Passes
from konduit.worker.services import Service, run_passes
from konduit.worker.starter import Jobs, Starter, cancel_job
from konduit.worker.stopping import StopWatch
from konduit.worker.wakeups import SweepClock
from konduit.worker.webhook_sender import WebhookSender

log = logging.getLogger(__name__)
T = TypeVar("T")

BATCH_COMPLETIONS = 500
"""Most terminal outcomes recorded in one transaction."""
BATCH_EXECUTIONS = 100
"""Most executions whose outcomes one transaction records (and whose rows it keeps locked)."""

RELEASE_SECONDS = 5.0
"""How long handing a task back at shutdown may wait (at most the lease). Its row may be held by
a transaction that does not end before the worker does: this worker's own completion round
recording the task's outcome, stuck in a database call. Waiting for it was a stop that never
ended; the lease expires instead, as after a crash."""


class Worker:
    def __init__(
        self,
        db: Database,
        registry: Registry,
        config: WorkerConfig | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_BYTES,
        retention: float | None = None,
        history_after: float | None = None,
        webhooks: Sequence[Webhook] = (),
    ):
        self.db = db
        self.registry = registry
        self.config = config or WorkerConfig()
        # Each background service counts its passes, so tests wait for one instead of sleeping.
        self.passes = Passes()
        self.metrics_port: int | None = None  # where its histograms are served, once it runs
        self.executor = Executor(
            db, max_payload_bytes=max_payload_bytes, isolation=self.config.isolation,
            fallback_timeout=self.config.fallback_timeout,
        )
        self.maintenance = Maintenance(
            db, registry, self.executor, lease_seconds=self.config.lease_seconds,
            deadline_grace=self.config.deadline_grace, stall_grace=self.config.stall_grace,
        )
        # Housekeeping on the maintenance loop, each at its own (longer) interval.
        self.retention = None if retention is None else Retention(
            db, retention, interval=self.config.retention_interval)
        self.history = None if history_after is None else HistoryMover(
            db, history_after, interval=self.config.history_interval)
        self.auto_repairer = AutoRepairer(db, registry, max_payload_bytes=max_payload_bytes)
        self.alerting = Alerting(db, registry, fan_in_wait=self.config.alert_fan_in_wait,
                                 consecutive=self.config.alert_fan_in_consecutive,
                                 version_unserved=self.config.alert_version_unserved,
                                 queue_unserved=self.config.alert_queue_unserved)
        # Outcomes that end together, of however many executions, share one transaction.
        self.batcher = CompletionBatcher(
            self._record_group, max_batch=BATCH_COMPLETIONS, max_executions=BATCH_EXECUTIONS,
        )
        self.schedules = Schedules(db, registry, max_payload_bytes=max_payload_bytes)
        self.webhooks = list(webhooks)
        self.webhook_sender = WebhookSender(db, self.webhooks, worker_id=self.config.worker_id) \
            if self.webhooks else None
        self.hedger = Hedger(db, registry, self.config,
                             looked=functools.partial(self.passes.done, "hedging"))
        self.running: dict[int, tuple[TaskAttempt, asyncio.Task[None]]] = {}  # by TaskAttempt.key
        self.contexts: dict[int, Context] = {}
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._stop_watch: StopWatch | None = None  # armed by stop(): konduit.worker.stopping
        self._draining = False
        self._completer: asyncio.Task[None] | None = None
        self._notifying: set[asyncio.Future[None]] = set()  # deadline announcements in flight
        self._recording: set[int] = set()  # tasks whose handler returned: never cancel those
        self.completed = 0
        self.claims = {"alone": 0, "in_rounds": 0}  # claims that leased tasks, by where they ran
        self._turn = 0  # which of the queues a claim serves first: they take turns
        # Whether some step this worker runs has flow limits: only then does a claim lock them.
        self._limited = any(spec.flow_limits for spec in registry)
        # Steps limited per key: the claim's turns among their keys (None: no such step).
        self._key_cursors = (transitions.KeyCursors()
                             if any(spec.flow_keys for spec in registry) else None)
        # While limited steps have ready tasks, claim again this often: a rate's window frees
        # a start every interval/count (a running task that ends notifies instead).
        self._flow_poll = min((max(0.05, f.rate_seconds / f.rate_count)
                               for spec in registry for f in spec.flow_limits.values()
                               if f.rate_seconds is not None and f.rate_count is not None),
                              default=self.config.poll_interval)
        self._limited_ready = False  # the last claim saw ready tasks of limited steps
        self._reserved = 0  # free slots that a claim in flight is filling
        # Until when the completion rounds leave claiming to the claim loop (after a claim in
        # one of them failed: a round must never fail for its claim).
        self._claim_in_rounds_after = 0.0
        self.unhealthy: str | None = None  # why the worker stopped itself (abandoned threads)
        # It rescues other workers' tasks once connected for a heartbeat interval, or for a full
        # lease after it lost the database (an outage must not be charged to live workers).
        self.connectivity = Connectivity(self.config.lease_seconds,
                                         settle_seconds=self.config.heartbeat_interval)
        self.beat_request = BeatRequest()  # ctx.heartbeat(): a beat now
        self.starter = Starter(db, registry, self.executor, self.contexts, self.connectivity,
                               lease_seconds=self.config.lease_seconds,
                               heartbeat_interval=self.config.heartbeat_interval,
                               beat_now=self.beat_request)
        self.arming = Arming(self.maintenance, self._stop.is_set,
                             max_payload_bytes=max_payload_bytes)
        # Big maps' items, created chunk by chunk beside the claims (chunks.py).
        # Every worker takes chunks when a fan-in announces them; the leader also looks at each
        # interval for chunks a dead worker or a failed transaction left.
        self.chunks = ChunkTaker(db, poll=self.config.maintenance_interval,
                                 passed=functools.partial(self.passes.done, "map_chunks"),
                                 polls=lambda: self.leadership.leading)
        # When the maintenance loop wakes: the interval, or sooner what is due (wakeups.py).
        self.sweep_clock = SweepClock(self.config.maintenance_interval,
                                      grace=self.config.deadline_grace)
        # One worker of the deployment runs the maintenance (leadership.py): the workers with
        # the same workflow versions and the same maintenance settings share a lease.
        cfg = self.config
        self.leadership = Leadership(
            db, name=deployment(registry.keys(), settings=(
                ("auto_repair", cfg.auto_repair), ("alerts", cfg.alert_interval > 0),
                ("retention", retention), ("history_after", history_after))),
            worker_id=cfg.worker_id, lease_seconds=cfg.leader_lease,
            changed=self._leading_changed, tried=functools.partial(self.passes.done, "leader"))
        self._leading = asyncio.Event()
        self._following = asyncio.Event()
        self._following.set()
        self._elected = False  # a full pass is due at once: this worker just took the lease
        self.services = self._services()

    def _services(self) -> list[Service]:
        """The maintenance passes, in the order a full pass runs them."""
        cfg, m = self.config, self.maintenance
        every = cfg.maintenance_interval
        retention, history = self.retention, self.history
        return [
            Service("rescue", m.rescue, every, enabled=lambda: self.may_rescue),
            Service("deadlines", lambda: m.sweep_deadlines(self.running), every,
                    due=frozenset({"deadline"})),
            Service("waits", m.wake_waits, every, due=frozenset({"timer"})),
            Service("starts", m.start_due, every),
            Service("triggers", m.start_triggered, every),
            Service("timeouts", m.end_timed_out, every),
            Service("stalls", m.watch_stalls, every),
            # A worker that finished an execution with a repair contract wakes for its repair
            # itself (SweepClock.expect), leader or not: it knows the moment, the leader reads it
            # at its next pass.
            Service("repair", self.auto_repairer.repair_due, every, due=frozenset({"repair"}),
                    enabled=lambda: cfg.auto_repair, own=True),
            *([Service("retention", retention.run_if_due, every)] if retention is not None
              else []),
            *([Service("history", history.run_if_due, every)] if history is not None else []),
        ]

    @property
    def leading(self) -> bool:
        """Whether this worker runs its deployment's maintenance now."""
        return self.leadership.leading

    def _leading_changed(self, leading: bool) -> None:
        if leading:
            self._elected = True
            self._following.clear()
            self._leading.set()
        else:
            self._leading.clear()
            self._following.set()
        self.sweep_clock.poke()  # the maintenance loop acts on it now, not at its next wake-up

    async def _while_leading(self, make: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        """Run the service ``make()`` makes while this worker leads; cancel it when it stops."""
        while True:
            await self._leading.wait()
            job = asyncio.create_task(make(), name=name)
            deposed = asyncio.create_task(self._following.wait())
            try:
                await asyncio.wait({job, deposed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                job.cancel()
                deposed.cancel()
                await asyncio.gather(job, deposed, return_exceptions=True)
            await self._following.wait()  # a service that ended by itself: until re-elected

    def stop(self) -> None:
        """Ask the worker to stop claiming and shut down gracefully."""
        self._stop.set()
        self._wake.set()
        if self._stop_watch is not None:
            self._stop_watch.arm()  # says where the worker is if it does not stop in time

    async def run(self) -> None:
        cfg = self.config
        # A watch given by whoever runs this worker (App.run_worker: it lasts until the event
        # loop itself is torn down) or one of its own, for as long as this coroutine runs.
        own = self._stop_watch is None
        if self._stop_watch is None:
            self._stop_watch = StopWatch(asyncio.get_running_loop(), cfg.shutdown_grace)
        if self._stop.is_set():
            self._stop_watch.arm()
        try:
            await self._live()
        finally:
            if own:
                self._stop_watch.done()

    async def _live(self) -> None:
        cfg = self.config
        unknown = await ensure_current(self.db)
        if unknown:
            log.warning("%s", describe_unknown(unknown))
        from konduit.engine.client import Client

        await Client(self.db, self.registry).register_all()
        await self.schedules.sync()
        await webhook_store.register(self.db, self.webhooks)
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
        metrics = None
        if cfg.metrics_port is not None:
            metrics = WorkerMetrics(running=lambda: len(self.running))
            self.metrics_port = metrics.serve(cfg.metrics_port, cfg.metrics_host)
            self.executor.metrics = metrics
            log.info("worker %s metrics on http://%s:%s/metrics", cfg.worker_id,
                     cfg.metrics_host, self.metrics_port)
        helpers = [
            asyncio.create_task(listen(
                self.db, queues=cfg.queues, hedged=self.hedger.enabled, ready=self._wake.set,
                stopped=self._stop_tasks_of, outrun=self._stop_outrun,
                deadline=self.sweep_clock.poke, chunks=self.chunks.poke,
                leader=self.leadership.poke),
                name="konduit-listen"),
            asyncio.create_task(beat(
                self.db, cfg, self.connectivity, held=lambda: [t for t, _ in self.running.values()],
                abandoned=lambda: self.executor.abandoned, lost=self._lease_lost,
                asked=self.beat_request, leader=self.leadership.watched,
                leader_free=self.leadership.poke),
                name="konduit-heartbeat"),
            asyncio.create_task(self.leadership.run(), name="konduit-leadership"),
            asyncio.create_task(self._maintain(), name="konduit-maintenance"),
            asyncio.create_task(self.chunks.run(), name="konduit-map-chunks"),
            # Alerts and schedules keep their own cadences, on the leader only.
            *([asyncio.create_task(self._while_leading(
                lambda: self.alerting.run(
                    cfg.alert_interval, passed=functools.partial(self.passes.done, "alerts")),
                "konduit-alerts"), name="konduit-alerts-leader")]
              if cfg.alert_interval > 0 else []),
            # A tick's idempotency key lets one execution exist, should two workers lead at once.
            asyncio.create_task(self._while_leading(
                lambda: self.schedules.run(
                    passed=functools.partial(self.passes.done, "schedules")),
                "konduit-schedules"), name="konduit-schedules-leader"),
            *([asyncio.create_task(self.webhook_sender.run(), name="konduit-webhooks")]
              if self.webhook_sender is not None else []),
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
            await self.maintenance.drain(timeout=self.config.fallback_timeout)
            if metrics is not None:
                metrics.close()
            try:
                await self.db.run("worker_stop", id=cfg.worker_id)
            except DatabaseError:
                pass
            log.info("worker %s stopped after %s tasks (claims alone %s, in completion rounds %s)",
                     cfg.worker_id, self.completed, self.claims["alone"], self.claims["in_rounds"])
        if self.unhealthy is not None:
            raise WorkerUnhealthy(self.unhealthy)

    async def _claim_loop(self) -> None:
        cfg = self.config
        backoff = 0.5
        while not self._stop.is_set():
            free = self._free_slots()
            deferred = free > 0 and self._rounds_claim()
            if deferred:
                # The round being recorded claims the free slots in its own transaction; its
                # tasks wake this loop as they are done. Not a slow one (a big map's fan-in):
                # past the batcher's patience this loop claims beside it.
                free = 0
            claimed: list[TaskAttempt] = []
            # Cleared before the claim, not after: a wake that arrives while the claim is in
            # flight (a join fired, a slot freed) must make the loop claim again, not sleep.
            self._wake.clear()
            if free > 0:
                self._reserved += free
                try:
                    claimed = await self._claim(self.db, free)
                    self.claims["alone"] += bool(claimed)
                    if len(claimed) < free and self.hedger.enabled:
                        # Slots that ready work left free run hedges of straggling attempts.
                        claimed += await self.hedger.claim(free - len(claimed))
                    backoff = 0.5
                    self.connectivity.connected()
                except DatabaseError as exc:
                    self.connectivity.disconnected()
                    log.warning("claim failed (%s); retrying in %.1f s", exc, backoff)
                    await self._sleep(backoff)
                    backoff = min(backoff * 2, RETRY_MAX_DELAY)
                    continue
                finally:
                    self._reserved -= free
                self._launch(claimed)
            if free > 0 and len(claimed) == free:
                continue  # there may be more ready work: claim again at once
            # User code left running off this loop (a start's hung fair_by, a schedule's
            # tick) counts toward the limit too, with no task ending to check it.
            self._check_abandoned()
            poll = cfg.poll_interval
            if self._limited_ready:
                poll = min(poll, self._flow_poll)
            if self.hedger.enabled:
                poll = min(poll, self.hedger.poll)
            if deferred:
                poll = min(poll, self.batcher.patience)  # look again once the round is slow
            await self._sleep(poll)

    async def _claim(self, db: Database | Tx, limit: int) -> list[TaskAttempt]:
        cfg = self.config
        rows = await transitions.claim(
            db,
            queues=cfg.queues,
            workflows=self.registry.keys(),
            limit=limit,
            lease_seconds=cfg.lease_seconds,
            worker_id=cfg.worker_id,
            turn=self._turn,
            limited=self._limited,
            key_cursors=self._key_cursors,
        )
        self._turn += 1
        return self._claimed(rows)

    def _claimed(self, rows: transitions.Claim) -> list[TaskAttempt]:
        self._limited_ready = rows.limited_ready
        return [TaskAttempt.from_row(r) for r in rows]

    def _free_slots(self) -> int:
        return self.config.concurrency - self._slots_taken() - self._reserved

    def _rounds_claim(self) -> bool:
        """Whether a completion round is due that will claim the free slots (see
        :meth:`_record_group`)."""
        return self.batcher.busy and not self.batcher.stalled \
            and time.monotonic() >= self._claim_in_rounds_after \
            and self._completer is not None and not self._completer.done()

    async def _record_group(self, group: list[Completion]) -> list[tuple[Recorded, Advanced | None]]:
        """Record a round of outcomes and claim the slots they freed in the same transaction:
        under load one commit ends a round of tasks and leases the next, and a join that the
        round fired is claimed before any other worker could see it. The claimed handlers start
        once it has committed (their attempts count before any user code runs), under the usual
        lease check (:meth:`_start_many`)."""
        if self._stop.is_set() or time.monotonic() < self._claim_in_rounds_after:
            return await record_many(self.db, self.registry, group,
                                     max_payload_bytes=self.executor.max_payload_bytes)
        claimed: list[TaskAttempt] = []
        # The claim sent with the round's COMMIT (the last run's, if a conflict reran it).
        sent: list[Callable[[], Awaitable[transitions.Claim]]] = []
        # The slots it claims are those free when it gets to its claim, reserved from then: a
        # round that takes long (a big map's fan-in) leaves them to the claim loop meanwhile.
        reserved = [0]

        def claim_in_round(tx: Tx) -> Awaitable[set[tuple[UUID, str]] | None]:
            free = max(self._free_slots() + reserved[0], 0)
            self._reserved += free - reserved[0]
            reserved[0] = free
            return self._claim_in_round(tx, free, claimed, sent)

        try:
            results = await record_many(
                self.db, self.registry, group,
                max_payload_bytes=self.executor.max_payload_bytes, then=claim_in_round)
            if sent:  # committed: the claimed rows came back with the COMMIT
                claimed.extend(self._claimed(await sent[-1]()))
                self.claims["in_rounds"] += bool(claimed)
            return results
        except BaseException as exc:
            if sent and not isinstance(exc, asyncio.CancelledError | DatabaseConflict
                                       | DatabaseUnavailable):
                # The claim went out with the round, so it may be what failed it: the outcomes
                # are recorded again without one, and the claim loop claims alone for a while.
                log.warning("a completion round that claimed failed (%s); the claim loop claims "
                            "alone for a while", exc)
                self._claim_in_rounds_after = time.monotonic() + 30.0
            raise
        finally:
            self._reserved -= reserved[0]
            # Whether or not the round committed: a lease that did not is refused by the check
            # that starts the handlers.
            self._launch(claimed)

    async def _claim_in_round(self, tx: Tx, limit: int, claimed: list[TaskAttempt],
                              sent: list[Callable[[], Awaitable[transitions.Claim]]]
                              ) -> set[tuple[UUID, str]] | None:
        """Claim in the round's transaction. The plain claim is only sent (``sent``): its rows
        come back with the COMMIT, one round trip for both, and the round's wake-ups ask the
        server what it left ready (returns None). A claim under flow limits locks before it
        claims, so it waits for its rows here and returns the (execution, step) pairs claimed,
        so the round wakes other workers only for the tasks it made ready and did not take."""
        claimed.clear()  # a rerun of the round (after a conflict) claims afresh
        sent.clear()
        if limit <= 0:
            return set()
        if not self._limited:
            cfg = self.config
            sent.append(await transitions.claim_later(
                tx, cfg.queues, self.registry.keys(), limit, cfg.lease_seconds, cfg.worker_id,
                self._turn))
            self._turn += 1
            return None
        try:
            claimed.extend(await self._claim(tx, limit))
            self.claims["in_rounds"] += bool(claimed)
            return {(task.execution_id, task.step) for task in claimed}
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError | DatabaseConflict | DatabaseUnavailable):
                # Whatever it was, it must not fail the outcomes again: the claim loop claims.
                log.warning("claiming in a completion round failed (%s); the claim loop claims "
                            "alone for a while", exc)
                self._claim_in_rounds_after = time.monotonic() + 30.0
            raise

    async def _sleep(self, seconds: float) -> None:
        await wait_event(self._wake, seconds)

    def _slots_taken(self) -> int:
        """Slots in use: tasks whose handler runs. A task whose handler returned holds its
        lease until its outcome is recorded, but not its slot (up to ``concurrency`` of them):
        the next tasks run meanwhile, and the outcomes that end together are recorded together."""
        return len(self.running) - min(len(self._recording), self.config.concurrency)

    def _launch(self, claimed: list[TaskAttempt]) -> None:
        """Run the tasks of one claim: their handlers start together, under one lease check."""
        if not claimed:
            return
        self._announce_deadline(claimed)
        starting = asyncio.ensure_future(self.starter.start_claimed(claimed))
        for task in claimed:
            self.running[task.key] = (task, asyncio.create_task(self._run(task, starting)))

    async def _run(self, task: TaskAttempt, starting: asyncio.Future[Jobs] | None = None) -> None:
        try:
            spec = self.registry.get(task.workflow_name, task.workflow_version)
            jobs = await asyncio.shield(starting) if starting is not None else {}
            if task.key in jobs:
                job = jobs[task.key]
            else:
                job = await self._retrying(lambda: self._start(spec, task))
            if job is None:
                log.info("task %s (%s) was cancelled before its handler started", task.id, task.step)
                return
            completion = await job
            await self._finish(spec, task, completion)
        except asyncio.CancelledError:
            if starting is not None and not starting.done():
                # Cancelled while its handler was being started: stop the handler once it has.
                starting.add_done_callback(lambda f: cancel_job(f, task.key))
            if self._draining:
                # Shutdown ran out of grace: hand the task back so another worker takes it now
                # instead of after the lease expires. Shielded: this coroutine is being cancelled.
                await asyncio.shield(self._release(task))
            raise
        except Exception:  # an engine bug must not take the worker down: the lease expires
            log.exception("internal error running task %s; its lease will expire", task.id)
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: user code on this loop
            log.error("task %s: %s escaped its attempt (raised by user code); its lease will "
                      "expire, the worker runs on", task.id, type(exc).__name__, exc_info=exc)
        finally:
            self.running.pop(task.key, None)
            self.contexts.pop(task.key, None)
            self._recording.discard(task.key)
            self._wake.set()
            self._check_abandoned()

    async def _finish(self, spec: WorkflowSpec, task: TaskAttempt, completion: Completion) -> None:
        if completion.command is Command.YIELD:
            # Another worker called the task's fallback first (a sweep that found it late), or
            # the task changed hands: that one ends the task; this attempt records nothing.
            log.info("task %s (%s): its fallback is another worker's to call; this attempt "
                     "records nothing", task.id, task.step)
            return
        full = self._slots_taken() >= self.config.concurrency
        self._recording.add(task.key)
        if full:
            # Its slot is free while the outcome is recorded: a claim loop that waits for one
            # may claim now. (One that is not full claims on notifications and needs no wake: an
            # empty claim racing this record would only delay the claim of what it fires.)
            self._wake.set()
        try:
            outcome, advanced = await self._retrying(lambda: self._record(completion))
        except DatabaseError as exc:
            # The outcome itself cannot be stored: record that as the task's failure (no
            # payload), so the execution moves on instead of waiting for a lease to expire.
            log.error("could not record task %s (%s): %s", task.id, task.step, exc)
            failure = replace(
                completion, command=Command.END, outcome=Outcome.FAILED, payload=None,
                payload_json=None, routes=None, error=f"the outcome could not be stored: {exc}",
                source=OutputSource.HANDLER,
            )
            outcome, advanced = await self._retrying(lambda: self._record(failure))
        if outcome is Recorded.TOO_LATE:
            # The backoff would end past the deadline by the database's clock: end it now.
            ended = await self.executor.deadline_passed(spec, task, self.contexts.get(task.key))
            outcome, advanced = await self._retrying(lambda: self._record(ended))
            completion = ended
        if outcome is Recorded.DROPPED:
            log.info("task %s (%s): this attempt ended (%s) while its other attempt runs on; "
                     "that one decides the task", task.id, task.step, completion.word)
            return
        if outcome is Recorded.LEASE_LOST:
            if completion.outcome is Outcome.SUCCEEDED \
                    and completion.source is OutputSource.HANDLER:
                # A sweep or a rescue ended the attempt first: the join never waits for this
                # result, but it is kept beside the one it consumed, never thrown away.
                self.executor.keep_late(task, completion.payload)
            log.warning(
                "task %s (%s) was no longer leased by this worker; its result was not used",
                task.id, task.step,
            )
            return
        self.completed += 1
        log_recorded(task, completion, outcome)  # a retry or a degradation: once, by its recorder
        # This outcome ended a child workflow: its parent's step is woken now, not at a pass.
        self.maintenance.woke(advanced)
        if advanced is not None and advanced.finished == ExecutionStatus.SUCCEEDED \
                and spec.repair is not None:
            # It may have finished degraded, arming its automatic repair: be awake when it is due.
            self.sweep_clock.expect("repair", spec.repair.delay)
        flow = spec[task.step].flow
        if flow is not None and flow.concurrency is not None:
            await self._notify_slot_free(task)
        if advanced and advanced.fired:
            self._wake.set()
        if outcome is Recorded.RETRYING:
            # Claim the retry when it is due, not at the next poll.
            asyncio.get_running_loop().call_later(completion.retry_delay, self._wake.set)

    async def _notify_slot_free(self, task: TaskAttempt) -> None:
        """A task of a step with a concurrency limit ended or went back to ready: wake the
        workers of its queue, whose claims may have left its step's ready tasks for the limit."""
        try:
            await self.db.one("task_notify_ready", queue=task.queue)
        except DatabaseError as exc:  # they poll anyway
            log.debug("could not notify the end of limited task %s: %s", task.id, exc)

    def _check_abandoned(self) -> None:
        abandoned = self.executor.abandoned
        if abandoned > self.config.max_abandoned and self.unhealthy is None:
            self.unhealthy = (
                f"{abandoned} threads of user code (handlers, start-time code, triggers' code, "
                f"maps' over()) ignored their deadline and are still running "
                f"(limit {self.config.max_abandoned}): this worker stops claiming and exits so "
                f"that its supervisor starts a fresh one (or use --isolation process)"
            )
            log.error("worker %s: %s", self.config.worker_id, self.unhealthy)
            self.stop()

    @property
    def may_rescue(self) -> bool:
        """Connected long enough that rescuing is safe (:class:`Connectivity`)."""
        return self.connectivity.may_rescue

    async def _record(self, completion: Completion) -> tuple[Recorded, Advanced | None]:
        if completion.command is Command.WAIT:  # an arming attempt (a wait step): rare, alone
            return await self.arming.record(completion)
        if completion.command is Command.RELEASE or self._completer is None \
                or self._completer.done():
            # Releases happen at shutdown, when the batching loop may be gone; and should it
            # ever be, an outcome is still recorded, alone. Retries join the batch.
            return await record(self.db, self.registry, completion,
                                max_payload_bytes=self.executor.max_payload_bytes)
        try:
            return await self.batcher.submit(completion)
        except BatcherStopped:
            # Shutdown stopped the batching loop under us: record alone (the lease fence makes
            # a second write of the same outcome harmless).
            return await record(self.db, self.registry, completion,
                                max_payload_bytes=self.executor.max_payload_bytes)

    async def _release(self, task: TaskAttempt) -> None:
        completion = task.completion(
            Command.RELEASE, error=f"released by worker {self.config.worker_id} at shutdown"
        )
        within = min(RELEASE_SECONDS, self.config.lease_seconds)
        try:
            async with asyncio.timeout(within):
                outcome, _ = await record(self.db, self.registry, completion,
                                          max_payload_bytes=self.executor.max_payload_bytes)
            log.info("task %s (%s) released: %s", task.id, task.step, outcome.value)
        except DatabaseError as exc:
            log.warning("could not release task %s (%s); its lease will expire", task.id, exc)
        except TimeoutError:
            log.warning("could not release task %s within %g s (another transaction holds it); "
                        "its lease will expire", task.id, within)

    async def _start(self, spec: WorkflowSpec, task: TaskAttempt) -> asyncio.Task[Completion] | None:
        """Start one task's handler; None if its lease no longer holds (:class:`Starter`)."""
        return await self.starter.start(spec, task)

    async def _retrying(self, make: Callable[[], Awaitable[T]]) -> T:
        return await retrying(make, self.connectivity)

    def _lease_lost(self, task: TaskAttempt) -> None:
        """The heartbeat found this attempt's lease gone: cancelled, rescued after our lease ran
        out, or the task's other (hedged) attempt finished first. Stop the handler; its result
        would be refused by the fence anyway."""
        if task.key in self.running:
            log.info("task %s (%s) lost its lease; asking it to stop", task.id, task.step)
            self._cancel(task.key)

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

    def _stop_outrun(self, lease_token: str) -> None:
        """The other attempt of a hedged task finished first: stop this one now rather than at
        the next heartbeat (its lease ended with the task)."""
        for key, (task, _) in list(self.running.items()):
            if str(task.lease_token) == lease_token and key not in self._recording:
                log.info("task %s (%s): its other attempt finished first; stopping this one",
                         task.id, task.step)
                self._cancel(key)

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

    def _announce_deadline(self, claimed: list[TaskAttempt]) -> None:
        """A claim set deadlines: if one is earlier than this worker's next maintenance wake-up,
        tell the other workers once (after the claim committed; a round's claim that did not
        commit announces a deadline that is not there, which costs one needless re-read)."""
        soonest = min((t.deadline_remaining for t in claimed if t.deadline_remaining is not None),
                      default=None)
        if soonest is not None and self.sweep_clock.claimed(soonest):
            task = asyncio.ensure_future(self._notify_deadline())
            self._notifying.add(task)
            task.add_done_callback(self._notifying.discard)

    async def _notify_deadline(self) -> None:
        try:
            await self.db.one("task_notify_deadline_sooner")
        except DatabaseError as exc:  # they re-read within an interval anyway
            log.debug("could not announce a deadline: %s", exc)

    async def _maintain(self) -> None:
        """The maintenance loop. On the leader: the full pass every interval, and in between
        what comes due (a deadline, a timer, an automatic repair) at its moment
        (:class:`SweepClock`), each pass a :class:`Service` of its own. On the other workers it
        reads nothing: their clock only keeps the time of their own wake-ups (a repair they
        armed, a deadline they announced: :meth:`_announce_deadline`)."""
        clock = self.sweep_clock
        due: set[str] = set()  # the first round only reads what is due
        while True:
            leading = self.leading
            if leading and self._elected:
                # Just took the lease (the last leader may have died): the full pass now.
                self._elected = False
                due = due | {"full"}
            await run_passes(self.services, due, leading=leading,
                             interval=self.config.maintenance_interval, passes=self.passes,
                             connectivity=self.connectivity)
            if leading:
                try:
                    await clock.reread(self.db)
                    self.connectivity.connected()
                    if "full" in due:
                        self.passes.done("maintenance")
                except (DatabaseError, KonduitError) as exc:
                    if cancelling():
                        raise  # the stop, not a failed read
                    if isinstance(exc, DatabaseUnavailable):
                        self.connectivity.disconnected()
                    log.warning("maintenance failed to read what comes due: %s", exc)
            elif not self._elected:  # (elected meanwhile: its poke wakes the sleep at once)
                clock.unpoke()
            due = await clock.sleep()

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
