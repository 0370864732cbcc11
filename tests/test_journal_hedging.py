"""Durable calls under hedging (docs/journal.md, "Fenced by the lease"; docs/hedging.md): a
hedged task's two attempts (the straggler and its hedge) share one journal. When both make the
same call at the same position, the first to record it wins and the other is handed that
result; a call one attempt recorded before the other reaches it is replayed, not made again.

A real worker (on a thread) runs both attempts; barriers keyed by the execution line the two
attempts up at the call, so the collision happens on every trial, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import konduit
from tests.support.db import rows, value
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]

MEET = 60.0  # how long an attempt waits for the other at a barrier (the hedge starts at 0.2 s)


class Rendezvous:
    """Named barriers of two, one set per execution: where a trial's two attempts meet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._barriers: dict[tuple[uuid.UUID, str], threading.Barrier] = {}
        self._events: dict[tuple[uuid.UUID, str], threading.Event] = defaultdict(threading.Event)

    def barrier(self, execution_id: uuid.UUID, name: str) -> threading.Barrier:
        with self._lock:
            return self._barriers.setdefault((execution_id, name),
                                             threading.Barrier(2, timeout=MEET))

    def meet(self, execution_id: uuid.UUID, name: str) -> None:
        self.barrier(execution_id, name).wait()

    def event(self, execution_id: uuid.UUID, name: str) -> threading.Event:
        with self._lock:
            return self._events[(execution_id, name)]


def who(hedged: bool) -> str:
    return "hedge" if hedged else "primary"


def recorders(db_url: str, execution_id: uuid.UUID) -> list[tuple[int, str, str, str]]:
    """The journal of one execution: (position, name, result, which attempt recorded it),
    the attempt found by the lease token it recorded under."""
    return [(seq, name, result, "hedge" if hedge else "primary") for seq, name, result, hedge in rows(
        db_url,
        "SELECT j.seq, j.name, r.result #>> '{}', a.hedge FROM konduit_journal j"
        " JOIN konduit_journal_results r USING (execution_id, content_hash)"
        " JOIN konduit_tasks t ON t.execution_id = j.execution_id AND t.step = j.step"
        " JOIN konduit_attempts a ON a.task_id = t.id AND a.lease_token = j.lease_token"
        " WHERE j.execution_id = %s ORDER BY j.seq", execution_id)]


def attempt_outcomes(db_url: str, execution_id: uuid.UUID) -> list[tuple[str, str | None]]:
    return sorted((who(hedge), outcome) for hedge, outcome in rows(
        db_url, "SELECT a.hedge, a.outcome FROM konduit_attempts a JOIN konduit_tasks t"
                " ON t.id = a.task_id WHERE t.execution_id = %s", execution_id))


def blocked_records(db_url: str) -> int:
    """Statements that record a durable call and wait on a lock (the task row's)."""
    return int(value(db_url, "SELECT count(*) FROM pg_stat_activity WHERE datname ="
                             " current_database() AND wait_event_type = 'Lock'"
                             " AND query LIKE %s", "%INSERT INTO konduit_journal %"))


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_both_attempts_make_the_same_call_the_first_record_wins_both_see_it(
        make_app: Callable[..., konduit.App], db_url: str, sync: bool) -> None:
    """Both attempts are inside the call (a barrier holds each until the other is there too),
    then both record it: one result is recorded at the position, both attempts are handed it
    (the loser its rival's, not its own), and the task's output is that result. The call itself
    ran in both attempts: that is what the docs allow ("two attempts may make the same call").

    Every other trial the test holds the task row while the two calls return, waits until both
    records wait on it, and lets go: the two inserts then meet at the journal's key at once
    (without it, the attempt the barrier wakes first tends to record first every time)."""
    trials = 10
    meet = Rendezvous()
    made: Counter[tuple[uuid.UUID, str]] = Counter()  # (execution, attempt): live calls made
    seen: dict[uuid.UUID, list[tuple[str, Any]]] = defaultdict(list)
    lock = threading.Lock()
    wf = konduit.Workflow(f"journal-hedged-{'sync' if sync else 'async'}", version=1)

    def pick(execution_id: uuid.UUID, me: str) -> str:
        meet.meet(execution_id, "in the call")  # both attempts are making the call
        with lock:
            made[(execution_id, me)] += 1
        meet.meet(execution_id, "made")
        meet.event(execution_id, "both made").set()
        assert meet.event(execution_id, "go on").wait(MEET)
        return f"picked by the {me}"

    if sync:
        @wf.step(hedge="0.2s", deadline="120s", name="step")
        def step_sync(ctx: konduit.Context) -> str:
            me = who(ctx.hedged)
            got = ctx.call_sync("pick", pick, ctx.execution_id, me)
            with lock:
                seen[ctx.execution_id].append((me, got))
            meet.meet(ctx.execution_id, "handed back")  # neither ends the task before both saw
            return str(got)
    else:
        @wf.step(hedge="0.2s", deadline="120s", name="step")
        async def step_async(ctx: konduit.Context) -> str:
            me = who(ctx.hedged)

            async def pick_async() -> str:
                return await asyncio.to_thread(pick, ctx.execution_id, me)

            got = await ctx.call("pick", pick_async)
            with lock:
                seen[ctx.execution_id].append((me, got))
            await asyncio.to_thread(meet.meet, ctx.execution_id, "handed back")
            return str(got)

    app = make_app(wf)
    winners: Counter[str] = Counter()
    with running_worker(app, concurrency=4, heartbeat_interval=0.5, lease_seconds=30):
        for trial in range(trials):
            handle = app.start(wf.name, input={})
            eid = handle.id
            assert meet.event(eid, "both made").wait(MEET)
            if trial % 2:
                with psycopg.connect(db_url) as conn:  # one transaction: the row held till exit
                    conn.execute("SELECT 1 FROM konduit_tasks WHERE execution_id = %s FOR UPDATE",
                                 (eid,))
                    meet.event(eid, "go on").set()
                    until(lambda: blocked_records(db_url) == 2, 60,
                          "both attempts' records waiting on the task row")
            else:
                meet.event(eid, "go on").set()
            result = handle.wait(timeout=90)
            assert result.status == "succeeded", (trial, result)
            journal = recorders(db_url, eid)
            # One recorded result at the position, the recording attempt's own.
            assert len(journal) == 1, (trial, journal)
            [(seq, name, recorded, recorder)] = journal
            assert (seq, name) == (1, "pick")
            assert recorded == f"picked by the {recorder}", (trial, journal)
            winners[recorder] += 1
            # Both attempts made the call live, and both were handed the recorded result.
            assert made[(eid, "primary")] == made[(eid, "hedge")] == 1, (trial, made)
            assert sorted(seen[eid]) == [("hedge", recorded), ("primary", recorded)], \
                (trial, seen[eid], journal)
            # The task's output is the journal's result, whichever attempt finished first.
            assert result.output == recorded
            assert [e.name for e in app.journal(eid)] == ["pick"]
            outcomes = attempt_outcomes(db_url, eid)
            assert sorted(o or "" for _, o in outcomes) in (["outrun", "succeeded"],
                                                            ["dropped", "succeeded"]), outcomes
    # Which attempt records first is the race's; both outcomes are fine (not asserted).
    print(f"first recorder over {trials} trials: {dict(winners)}")


@pytest.mark.parametrize("leader", ["primary", "hedge"])
def test_a_call_the_other_attempt_recorded_first_is_replayed_not_made_again(
        make_app: Callable[..., konduit.App], db_url: str, leader: str) -> None:
    """One attempt (the leader) records a call while the other is already running and has read
    the journal; the other then reaches the call: it is handed the recorded result without
    making the call (the docs: calls live from the first call that has no record; a finished
    model request is never paid for twice). Then both make a third call at once: still one
    record. The guarded side effects run once each, the third's once per attempt at most."""
    trials = 4
    meet = Rendezvous()
    made: Counter[tuple[uuid.UUID, str]] = Counter()  # (execution, call name)
    seen: dict[uuid.UUID, list[tuple[str, list[str]]]] = defaultdict(list)
    lock = threading.Lock()
    wf = konduit.Workflow(f"journal-hedged-lead-{leader}", version=1)

    def effect(execution_id: uuid.UUID, name: str, me: str) -> str:
        with lock:
            made[(execution_id, name)] += 1
        return f"{name} by the {me}"

    @wf.step(hedge="0.2s", deadline="120s")
    def step(ctx: konduit.Context) -> list[str]:
        eid, me = ctx.execution_id, who(ctx.hedged)
        got = []
        # Call one: the primary makes it before the hedge starts; the hedge replays it (and so
        # has read the journal before call two is recorded).
        if not ctx.hedged:
            got.append(ctx.call_sync("one", effect, eid, "one", me))
        meet.meet(eid, "started")
        if ctx.hedged:
            got.append(ctx.call_sync("one", effect, eid, "one", me))
        meet.meet(eid, "journal read")
        # Call two: the leader makes it; the other waits until it is recorded, then reaches it.
        if me == leader:
            got.append(ctx.call_sync("two", effect, eid, "two", me))
            meet.event(eid, "two recorded").set()
        else:
            assert meet.event(eid, "two recorded").wait(MEET)
            got.append(ctx.call_sync("two", effect, eid, "two", me))
        # Call three: both at once.
        meet.meet(eid, "three")
        got.append(ctx.call_sync("three", effect, eid, "three", me))
        with lock:
            seen[eid].append((me, got))
        meet.meet(eid, "handed back")
        return got

    app = make_app(wf)
    with running_worker(app, concurrency=4, heartbeat_interval=0.5, lease_seconds=30):
        for trial in range(trials):
            result = app.start(wf.name, input={}).wait(timeout=90)
            eid = result.id
            assert result.status == "succeeded", (trial, result)
            journal = recorders(db_url, eid)
            assert [(seq, name) for seq, name, _, _ in journal] == [
                (1, "one"), (2, "two"), (3, "three")], (trial, journal)
            recorded = [r for _, _, r, _ in journal]
            assert journal[0][2:] == ("one by the primary", "primary")
            assert journal[1][2:] == (f"two by the {leader}", leader), (trial, journal)
            assert recorded[2] == f"three by the {journal[2][3]}"
            # Calls one and two ran once; three ran in one or both attempts (the collision).
            assert made[(eid, "one")] == 1 and made[(eid, "two")] == 1, (trial, made)
            assert made[(eid, "three")] in (1, 2), (trial, made)
            # Both attempts saw the journal's results, and the output is them.
            assert sorted(seen[eid]) == [("hedge", recorded), ("primary", recorded)], \
                (trial, seen[eid], journal)
            assert result.output == recorded
            # The replays were counted: call one by the hedge, call two by the other attempt.
            replays = {e.seq: e.replays for e in app.journal(eid)}
            assert replays[1] == 1 and replays[2] == 1, (trial, replays)
