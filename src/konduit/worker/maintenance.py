"""Maintenance: rescue tasks whose worker is gone, end tasks past their deadline, wake waiting
tasks that are due (timers, accepted events, ended child workflows), end executions past their
timeout, and look for stalled executions (:mod:`konduit.engine.stalls`). It also wakes a child
workflow's parent step at once when a transaction of this worker ended the child
(:meth:`Maintenance.wake_parent`); its pass is then the backstop.

The leader of the worker's deployment runs its passes (:mod:`konduit.worker.leadership`, each
pass a service: :mod:`konduit.worker.services`); two workers that both believe they lead for a
moment are safe, as when every worker ran them, because each write goes through a transition whose
statement re-checks its own guard (:mod:`konduit.engine.transitions`), so only one of them changes
a task. Rescue and the deadline sweep ask the same outcome policy as the executor, so a reclaimed
task gets the backoff and fallback it would have had failing in place. Fallbacks run in jobs of
their own, each with a time limit, never on the maintenance loop: a hanging fallback stalls
nothing but its own task. A fallback runs at most once per task: a task whose fallback another
worker started is left to that worker for the fallback's time limit, then ended timed_out
without it (its caller died in it; calling it again could kill this worker too).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Container

from konduit.core.model import (
    AttemptOutcome,
    Completion,
    Outcome,
    Recorded,
    TaskAttempt,
    Transition,
    WaitKind,
)
from konduit.core.outcome import Ending, Final, decide
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database, Row, Tx
from konduit.engine import later, limit_keys, transitions, triggers, waits
from konduit.engine.advancer import Advanced
from konduit.engine.completer import record
from konduit.engine.finish import ChildEnded, end_timed_out_executions
from konduit.engine.registry import Registry
from konduit.engine.stalls import DEFAULT_GRACE, Watchdog
from konduit.errors import DatabaseError, KonduitError
from konduit.logs import attempt_scope, log_recorded
from konduit.worker.executor import Executor

log = logging.getLogger(__name__)


class Maintenance:
    """The sweeps of one worker, with the jobs (one per task) that end what they found."""

    def __init__(
        self,
        db: Database,
        registry: Registry,
        executor: Executor,
        *,
        lease_seconds: float,
        deadline_grace: float,
        stall_grace: float = DEFAULT_GRACE,
    ):
        self.db = db
        self.registry = registry
        self.executor = executor
        self.lease_seconds = lease_seconds
        self.deadline_grace = deadline_grace
        self.watchdog = Watchdog(db, registry, grace=stall_grace,
                                 max_payload_bytes=executor.max_payload_bytes)
        self.jobs: dict[int, asyncio.Task[None]] = {}

    def _spawn(self, task_id: int, make: Callable[[], Awaitable[None]]) -> bool:
        if task_id in self.jobs:
            return False  # already being ended (its fallback may still be running)

        async def job() -> None:
            try:
                await make()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next sweep tries again
                log.warning("maintenance of task %s failed: %s", task_id, exc)
            finally:
                self.jobs.pop(task_id, None)

        self.jobs[task_id] = asyncio.create_task(job(), name=f"konduit-maintain-{task_id}")
        return True

    async def drain(self, timeout: float) -> None:
        if self.jobs:
            await asyncio.wait(list(self.jobs.values()), timeout=timeout)
        for job in list(self.jobs.values()):
            job.cancel()

    async def rescue(self, *, limit: int = 100) -> int:
        """Start ending every task whose worker is gone; returns how many jobs started. Hedged
        tasks are settled first: a dead hedge is dropped, a dead primary hands over to its hedge."""
        await self.rescue_hedges(limit=limit)
        rows = await self.db.all("task_list_rescuable", limit=limit)
        return sum(self._spawn(row["id"], functools.partial(self._rescue, row)) for row in rows)

    async def rescue_hedges(self, *, limit: int = 100) -> int:
        """Settle hedged tasks one of whose leases ran out; returns how many changed. The task
        itself goes on under the surviving lease (its attempt is neither retried nor ended); when
        both leases ran out the hedge is dropped here and the task rescued as usual."""
        rows = await self.db.all("task_list_hedges_rescuable", limit=limit)
        changed = 0
        for row in rows:
            async def settle(tx: Tx, row: Row = row) -> bool:
                if row["hedge_expired"] and await transitions.unhedge(
                        tx, row["id"], row["hedge_token"], self.lease_seconds):
                    token, worker = row["hedge_token"], row["hedge_worker_id"]
                elif row["primary_expired"] and await transitions.promote(
                        tx, row["id"], row["lease_token"], self.lease_seconds):
                    token, worker = row["lease_token"], row["worker_id"]
                else:
                    return False
                await tx.run("attempt_finish_if_open", lease_token=token,
                             outcome=AttemptOutcome.LOST,
                             error=f"lease expired on worker {worker}; the task's other "
                                   f"attempt runs on", age_seconds=0.0)
                return True

            if await self.db.atomic(settle):
                changed += 1
                log.info("task %s: a hedged attempt's worker is gone; the other attempt runs on",
                         row["id"])
        return changed

    def _fallback_under_way(self, task: TaskAttempt) -> bool:
        """Another worker started this task's fallback less than its time limit ago: it may
        still record what the fallback returned (the write re-checks: fallback_settle)."""
        return task.fallback_age is not None and task.fallback_age < self.executor.fallback_settle

    @staticmethod
    def _log_fallback_never_returned(task: TaskAttempt, outcome: Recorded) -> None:
        if task.fallback_tried and outcome is Recorded.ENDED:
            with attempt_scope(task):
                log.warning("task %s (%s): its fallback never returned (it killed or hung its "
                            "worker); ended timed_out without calling it again", task.id,
                            task.step)

    async def _rescue(self, row: Row) -> None:
        try:
            spec = self.registry.get(row["workflow_name"], row["workflow_version"])
        except KonduitError:
            return  # another deployment's workflow: its own workers rescue it
        lost = TaskAttempt.from_row(row)
        if self._fallback_under_way(lost):
            return
        error = f"lease expired on worker {row['worker_id']} (attempt {lost.attempt})"
        verdict = decide(
            await self.executor.created_with.policy(spec, spec[lost.step], lost),
            Ending.LEASE_LOST, attempt=lost.attempt,
            max_attempts=lost.max_attempts, remaining=lost.deadline_remaining, error=error,
            fallback_tried=lost.fallback_tried,
        )
        completion = await self.executor.conclude(
            spec, lost, None, verdict, error=error, transition=Transition.LOSE,
            guard_seconds=self.lease_seconds,
        )
        outcome, advanced = await record(self.db, self.registry, completion,
                                         max_payload_bytes=self.executor.max_payload_bytes)
        self.woke(advanced)
        self._log_fallback_never_returned(lost, outcome)
        if outcome is not Recorded.LEASE_LOST:
            # One line per reclaim, by the worker whose statement took the task; a retry or a
            # degradation it led to is logged as such (as the task's own worker would).
            with attempt_scope(lost):
                log.warning("reclaimed task %s (%s): %s -> %s", lost.id, lost.step, error,
                            completion.word)
            log_recorded(lost, completion, outcome, by="reclaimed")

    async def sweep_deadlines(self, own: Container[int], *, limit: int = 100) -> int:
        """Start ending every task past its deadline that its own worker did not end (it died or
        hung, or the task waited in the queue); ``own`` are this worker's running tasks, which
        its executor ends itself."""
        rows = await self.db.all(
            "task_list_past_deadline", grace_seconds=self.deadline_grace, limit=limit
        )
        return sum(
            self._spawn(row["id"], functools.partial(self._expire, row))
            for row in rows
            if row["id"] not in own
        )

    async def _expire(self, row: Row) -> None:
        try:
            spec = self.registry.get(row["workflow_name"], row["workflow_version"])
        except KonduitError:
            return
        task = TaskAttempt.from_row(row)
        if self._fallback_under_way(task):
            return
        completion = await self.executor.deadline_passed(
            spec, task, None, transition=Transition.EXPIRE, guard_seconds=self.deadline_grace
        )
        outcome, advanced = await record(self.db, self.registry, completion,
                                         max_payload_bytes=self.executor.max_payload_bytes)
        self.woke(advanced)
        self._log_fallback_never_returned(task, outcome)
        if outcome is Recorded.ENDED:
            if completion.outcome is Outcome.DEGRADED:
                log_recorded(task, completion, outcome, by="deadline sweep")
            else:
                with attempt_scope(task):
                    log.info("task %s (%s) ended %s by the deadline sweep", task.id, task.step,
                             completion.word)

    async def wake_waits(self, *, limit: int = 100) -> int:
        """Start waking every waiting task that is due: a timer whose time came, an event
        accepted but not yet applied (its sender died), a child execution that ended. Returns
        how many jobs started; each wake is fenced on ``status = 'waiting'``, so two workers
        waking one task change it once. Stored events past their retention are deleted here
        too (a cheap index probe when there are none), retention= on the App or not."""
        await waits.delete_expired(self.db)
        rows = await waits.list_due(self.db, limit=limit)
        return sum(self._spawn(row["id"], functools.partial(self._wake, row)) for row in rows)

    async def _wake(self, row: Row) -> None:
        try:
            self.registry.get(row["workflow_name"], row["workflow_version"])
        except KonduitError:
            return  # another deployment's workflow: its own workers wake it
        limit = self.executor.max_payload_bytes
        if row["wait_kind"] == WaitKind.CHILD:
            advanced = await waits.wake_child_step(self.db, self.registry, row,
                                                   fallback=self._child_fallback,
                                                   max_payload_bytes=limit,
                                                   fallback_settle=self.executor.fallback_settle)
        else:
            advanced = await waits.wake_task(self.db, self.registry, row["id"],
                                             row["execution_id"], row["step"],
                                             max_payload_bytes=limit)
        self.woke(advanced)

    async def _child_fallback(self, spec: WorkflowSpec, row: Row, verdict: Final,
                              error: str) -> Completion:
        return await self.executor.conclude(spec, TaskAttempt.from_row(row), None, verdict,
                                            error=error, transition=Transition.WAKE)

    def wake_parent(self, ended: ChildEnded) -> bool:
        """A child execution ended in a transaction this process committed: wake its parent's
        step now, in a job of its own (its fallback may run), rather than at the next pass,
        which stays the backstop should this process die first. The wake is fenced, so the
        pass of another worker racing this changes the task once; this worker's own pass skips
        a task whose job is under way."""
        return self._spawn(ended.parent_task_id, functools.partial(self._wake_parent, ended))

    async def _wake_parent(self, ended: ChildEnded) -> None:
        self.woke(await waits.wake_parent(self.db, self.registry, ended,
                                          fallback=self._child_fallback,
                                          max_payload_bytes=self.executor.max_payload_bytes,
                                          fallback_settle=self.executor.fallback_settle))

    def woke(self, advanced: Advanced | None) -> None:
        """After a transaction that advanced a DAG committed: if it ended a child workflow,
        wake its parent's step (and so on up the tree, one job per level)."""
        if advanced is not None and advanced.child_ended is not None:
            self.wake_parent(advanced.child_ended)

    async def watch_stalls(self) -> int:
        """One pass of the stall watchdog; returns how many stalls it decided. A decision that
        ended a child workflow wakes its parent's step at once."""
        try:
            done = await self.watchdog.run()
        except (DatabaseError, KonduitError):
            raise
        except Exception:  # a bug in the watchdog must not end the maintenance loop
            log.exception("the stall watchdog failed")
            return 0
        for stall in done.stalls:
            self.woke(stall.advanced)
        return len(done.stalls)

    async def start_due(self) -> int:
        """Start the scheduled executions whose time came (:mod:`konduit.engine.later`), and
        pending ones of keys with a free slot under ``max_running`` (retiring idle key rows:
        :mod:`konduit.engine.limit_keys`)."""
        # Due executions under max_running become pending first, so this pass's fill starts
        # them when their key has a free slot.
        started = len(await later.start_due(self.db))
        return started + (await limit_keys.maintain(self.db)).started

    async def start_triggered(self) -> int:
        """Apply the events whose trigger needs this worker's code, and start the bursts and
        batches that are due (:mod:`konduit.engine.triggers`)."""
        return await triggers.run_pass(self.db, self.registry,
                                       max_payload_bytes=self.executor.max_payload_bytes)

    async def end_timed_out(self, *, limit: int = 100) -> int:
        """:func:`end_timed_out_executions`, waking at once the parents of the children among
        them."""
        finished = await end_timed_out_executions(self.db, limit=limit)
        for f in finished:
            if f.child_ended is not None:
                self.wake_parent(f.child_ended)
        return len(finished)


async def reclaim_expired_leases(
    db: Database, registry: Registry, *, lease_seconds: float = 15.0, limit: int = 100
) -> int:
    """One rescue round outside a worker, waited for; returns how many tasks it tried to end."""
    rounds = Maintenance(db, registry, Executor(db), lease_seconds=lease_seconds, deadline_grace=1.0)
    started = await rounds.rescue(limit=limit)
    await asyncio.gather(*list(rounds.jobs.values()), return_exceptions=True)
    return started
