"""Durable calls inside a step (``ctx.call`` / ``ctx.call_sync``, docs/journal.md): a later
attempt replays what an earlier one recorded and calls live from the first call without a
record; a call out of order fails loudly; a stale attempt records nothing; results are stored
once per execution and pruned with it; a redrive replays, a fork starts afresh."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import konduit
from konduit.core.context import Context
from tests.support.db import rows, value
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]

RETRY = konduit.Retry(max_attempts=3, backoff="fixed", base="50ms")


def _counting(counts: Counter[str]) -> Callable[[str], dict[str, Any]]:
    def work(name: str) -> dict[str, Any]:
        counts[name] += 1
        return {"name": name, "pair": (1, 2)}
    return work


def test_a_retry_replays_the_recorded_calls_and_calls_the_rest_live(
        make_app: Callable[..., konduit.App]) -> None:
    counts: Counter[str] = Counter()
    work = _counting(counts)
    seen: list[Any] = []
    wf = konduit.Workflow("journal-retry", version=1)

    @wf.step(retry=RETRY)
    async def agent(ctx: konduit.Context) -> list[str]:
        names = []
        for n in range(1, 6):
            result = await ctx.call(f"call-{n}", work, f"c{n}")
            seen.append((ctx.attempt, n, result))
            names.append(result["name"])
            if n == 3 and ctx.attempt == 1:
                raise RuntimeError("the first attempt dies after its third call")
        return names

    @wf.step(after=[agent], retry=RETRY)
    def tools(ctx: konduit.Context) -> int:
        got = [ctx.call_sync(f"tool-{n}", work, f"t{n}")["name"] for n in range(1, 5)]
        if ctx.attempt < 3:
            raise RuntimeError(f"attempt {ctx.attempt} dies after all its calls")
        return len(got)

    app = make_app(wf)
    with running_worker(app):
        result = app.start("journal-retry", input={}).wait(timeout=60)
    assert result.status == "succeeded"
    assert result.output == {"tools": 4} or result.output == 4
    # Every call ran live once, whatever the attempts.
    assert counts == Counter({**{f"c{n}": 1 for n in range(1, 6)},
                              **{f"t{n}": 1 for n in range(1, 5)}}), counts
    # The value handed back is the recorded one, live or replayed: the tuple is a list both times.
    assert {repr(r) for _, _, r in seen if r["name"] == "c1"} == {
        repr({"name": "c1", "pair": [1, 2]})}
    journal = {(e.step, e.seq): e for e in app.journal(result.id)}
    assert [journal[("agent", n)].name for n in range(1, 6)] == [f"call-{n}" for n in range(1, 6)]
    assert [journal[("agent", n)].attempt for n in range(1, 6)] == [1, 1, 1, 2, 2]
    assert [journal[("agent", n)].replays for n in range(1, 6)] == [1, 1, 1, 0, 0]
    # The sync step's four calls: live in attempt 1, replayed by attempts 2 and 3.
    assert [(journal[("tools", n)].attempt, journal[("tools", n)].replays,
             journal[("tools", n)].last_replayed_attempt) for n in range(1, 5)] == [(1, 2, 3)] * 4
    assert all(e.duration_seconds >= 0 and e.result_bytes > 0 for e in journal.values())


def test_a_call_that_raises_records_nothing_and_runs_again(
        make_app: Callable[..., konduit.App]) -> None:
    counts: Counter[str] = Counter()
    wf = konduit.Workflow("journal-raises", version=1)

    def flaky(name: str) -> str:
        counts[name] += 1
        if name == "b" and counts[name] == 1:
            raise ConnectionError("the vendor hung up")
        return name.upper()

    @wf.step(retry=RETRY)
    def step(ctx: konduit.Context) -> list[str]:
        return [ctx.call_sync(n, flaky, n) for n in ("a", "b", "c")]

    app = make_app(wf)
    with running_worker(app):
        result = app.start("journal-raises", input={}).wait(timeout=60)
    assert result.output == ["A", "B", "C"]
    assert counts == Counter({"a": 1, "b": 2, "c": 1})
    assert [(e.seq, e.name, e.attempt) for e in app.journal(result.id)] == [
        (1, "a", 1), (2, "b", 2), (3, "c", 2)]


def test_a_reordered_call_fails_with_a_determinism_error_naming_it(
        make_app: Callable[..., konduit.App]) -> None:
    caught: list[konduit.DeterminismError] = []
    wf = konduit.Workflow("journal-reordered", version=1)

    @wf.step(retry=RETRY)
    async def step(ctx: konduit.Context) -> str:
        order = ["fetch-user", "charge-card"] if ctx.attempt == 1 else ["charge-card", "fetch-user"]
        try:
            for name in order:
                await ctx.call(name, lambda n=name: n)
        except konduit.DeterminismError as exc:
            caught.append(exc)
            raise
        raise RuntimeError("each attempt fails after its calls")

    app = make_app(wf)
    with running_worker(app), pytest.raises(konduit.ExecutionFailed) as failed:
        app.start("journal-reordered", input={}).wait(timeout=60)
    eid = failed.value.result.id
    [exc] = caught
    assert (exc.step, exc.name, exc.seq, exc.recorded) == ("step", "charge-card", 1, "fetch-user")
    assert isinstance(exc, konduit.NonRetryableError)
    # Not retried: the second attempt was the last, and its error names the call.
    [task] = app.tasks(eid)
    assert task.status == "failed" and task.attempt == 2
    assert "DeterminismError" in (task.error or "") and "'charge-card'" in (task.error or "")
    # Nothing was recorded over the first attempt's journal.
    assert [(e.seq, e.name) for e in app.journal(eid)] == [(1, "fetch-user"), (2, "charge-card")]


def test_a_stale_attempt_cannot_record_a_call_after_its_lease_is_lost(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    inside, release = threading.Event(), threading.Event()
    entries: Counter[str] = Counter()
    lost: list[konduit.LeaseLost] = []
    wf = konduit.Workflow("journal-fenced", version=1)

    def second() -> str:
        entries["two"] += 1
        if entries["two"] == 1:
            inside.set()
            release.wait(timeout=60)
        return f"two, run {entries['two']}"

    @wf.step(retry=RETRY, deadline="60s")
    def step(ctx: konduit.Context) -> list[str]:
        try:
            return [ctx.call_sync("one", lambda: "one"), ctx.call_sync("two", second)]
        except konduit.LeaseLost as exc:
            lost.append(exc)
            raise

    app = make_app(wf)
    with running_worker(app):
        eid = app.start("journal-fenced", input={}).id
        assert inside.wait(timeout=60)
        [(task_id, token)] = rows(db_url, "SELECT id, lease_token FROM konduit_tasks "
                                          "WHERE execution_id = %s", eid)
        # The lease is lost while the call runs, as a rescue takes it: the task is ready again.
        with psycopg.connect(db_url, autocommit=True) as conn:
            taken = conn.execute(
                "UPDATE konduit_tasks SET status = 'ready', lease_token = NULL, "
                "lease_expires_at = NULL, run_at = now() WHERE id = %s AND lease_token = %s",
                (task_id, token)).rowcount
        assert taken == 1
        release.set()
        until(lambda: bool(lost), 30, "the stale attempt's refused record")
        result = app.wait(eid, timeout=60)
    assert result.output == ["one", "two, run 2"]
    [exc] = lost
    assert (exc.step, exc.name, exc.seq) == ("step", "two", 2)
    # The stale attempt recorded nothing; the one that took over recorded call two.
    assert value(db_url, "SELECT count(*) FROM konduit_journal WHERE lease_token = %s "
                         "AND seq = 2", token) == 0
    assert [(e.seq, e.name, e.attempt) for e in app.journal(eid)] == [(1, "one", 1),
                                                                       (2, "two", 2)]
    assert entries["two"] == 2


def test_a_record_racing_a_lease_loss_lands_before_it_or_not_at_all(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """The record checks the lease in its own statement and holds the task row until it
    commits: a lease taken away at the same moment (a barrier lines both up, trial after trial;
    the lease is given back right after) either waits for the record, or is seen by it and
    nothing is recorded, or is back when the record is written. Never a record written while
    the lease was gone."""
    trials = 30
    go, done = threading.Barrier(2, timeout=60), threading.Barrier(2, timeout=60)
    outcomes: list[str] = []
    wf = konduit.Workflow("journal-race", version=1)

    @wf.step(deadline="600s")
    def step(ctx: konduit.Context) -> int:
        for trial in range(trials):
            go.wait()
            try:
                ctx.call_sync(f"trial-{trial}", lambda t=trial: t)
                outcomes.append("recorded")
            except konduit.LeaseLost:
                outcomes.append("lost")
            done.wait()
        return trials

    app = make_app(wf)
    gone: list[tuple[Any, Any]] = []  # when the lease was taken and when it was back
    with running_worker(app, heartbeat_interval=30, lease_seconds=300):
        eid = app.start("journal-race", input={}).id
        until(lambda: value(db_url, "SELECT count(*) FROM konduit_tasks WHERE "
                                    "execution_id = %s AND status = 'running'", eid) == 1,
              30, "the step running")
        [(task_id, token)] = rows(db_url, "SELECT id, lease_token FROM konduit_tasks "
                                          "WHERE execution_id = %s", eid)
        with psycopg.connect(db_url, autocommit=True) as conn:
            for _ in range(trials):
                go.wait()
                row = conn.execute(
                    "UPDATE konduit_tasks SET lease_token = gen_random_uuid() WHERE id = %s "
                    "AND lease_token = %s RETURNING clock_timestamp()", (task_id, token)).fetchone()
                back = conn.execute(
                    "UPDATE konduit_tasks SET lease_token = %s WHERE id = %s "
                    "RETURNING clock_timestamp()", (token, task_id)).fetchone()
                assert row is not None and back is not None
                gone.append((row[0], back[0]))
                done.wait()
        assert app.wait(eid, timeout=60).output == trials
    recorded = dict(rows(db_url, "SELECT seq, recorded_at FROM konduit_journal "
                                 "WHERE execution_id = %s", eid))
    assert len(outcomes) == trials and set(outcomes) <= {"recorded", "lost"}
    assert len(recorded) == outcomes.count("recorded")
    assert "lost" in outcomes or "recorded" in outcomes
    for trial, (taken, back) in enumerate(gone):
        at = recorded.get(trial + 1)
        assert at is None or not (taken < at < back), (trial, taken, at, back)


def test_results_are_stored_once_per_execution_and_pruned_with_it(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = konduit.Workflow("journal-pruned", version=1)

    @wf.step()
    async def step(ctx: konduit.Context) -> int:
        for n in range(6):
            await ctx.call(f"same-{n}", lambda: {"answer": 42})
        await ctx.call("other", lambda: {"answer": 43})
        return 1

    app = make_app(wf)
    with running_worker(app):
        eid = app.start("journal-pruned", input={}).id
        app.wait(eid, timeout=60)
    assert value(db_url, "SELECT count(*) FROM konduit_journal WHERE execution_id = %s", eid) == 7
    assert value(db_url, "SELECT count(*) FROM konduit_journal_results "
                         "WHERE execution_id = %s", eid) == 2
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE konduit_executions SET finished_at = now() - interval '2 days' "
                     "WHERE id = %s", (eid,))
    assert app.prune(older_than="1d") == 1
    assert value(db_url, "SELECT count(*) FROM konduit_journal") == 0
    assert value(db_url, "SELECT count(*) FROM konduit_journal_results") == 0


def test_a_redrive_replays_the_journal_and_a_fork_starts_afresh(
        make_app: Callable[..., konduit.App]) -> None:
    counts: Counter[str] = Counter()
    work = _counting(counts)
    broken = {"yes": True}
    wf = konduit.Workflow("journal-redrive", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=1))
    def step(ctx: konduit.Context) -> list[str]:
        got = [ctx.call_sync(f"call-{n}", work, f"c{n}")["name"] for n in range(1, 4)]
        if broken["yes"]:
            raise RuntimeError("fails after its calls")
        return got

    app = make_app(wf)
    with running_worker(app):
        with pytest.raises(konduit.ExecutionFailed) as failed:
            app.start("journal-redrive", input={}).wait(timeout=60)
        eid = failed.value.result.id
        broken["yes"] = False
        assert app.redrive(eid) == ["step"]
        assert app.wait(eid, timeout=60).output == ["c1", "c2", "c3"]
        assert counts == Counter({"c1": 1, "c2": 1, "c3": 1})  # replayed, not called again
        assert {(e.generation, e.replays) for e in app.journal(eid)} == {(1, 1)}
        fork = app.fork(eid, from_step="step")
        assert fork.wait(timeout=60).output == ["c1", "c2", "c3"]
    assert counts == Counter({"c1": 2, "c2": 2, "c3": 2})  # the fork called them live
    assert [e.attempt for e in app.journal(fork.id)] == [1, 1, 1]


def test_call_sync_on_an_async_handler_s_loop_and_bad_names_are_refused(
        make_app: Callable[..., konduit.App]) -> None:
    errors: list[BaseException] = []
    wf = konduit.Workflow("journal-misuse", version=1)

    @wf.step()
    async def step(ctx: konduit.Context) -> int:
        for attempt in (lambda: ctx.call_sync("blocking", lambda: 1),
                        lambda: ctx.call("", lambda: 1),
                        lambda: ctx.call("x" * 201, lambda: 1)):
            try:
                attempt()
            except (konduit.JournalUnavailable, ValueError) as exc:
                errors.append(exc)
        await ctx.call("not-json", lambda: 1)  # fine
        try:
            await ctx.call("a-set", lambda: {1, 2})
        except konduit.PayloadError as exc:
            errors.append(exc)
        return 1

    app = make_app(wf)
    with running_worker(app):
        eid = app.start("journal-misuse", input={}).id
        app.wait(eid, timeout=60)
    assert [type(e).__name__ for e in errors] == ["JournalUnavailable", "ValueError",
                                                   "ValueError", "PayloadError"]
    assert "await ctx.call" in str(errors[0]) and "'a-set'" in str(errors[3])
    assert [e.name for e in app.journal(eid)] == ["not-json"]


def test_a_context_built_by_hand_calls_through() -> None:
    import asyncio
    from uuid import uuid4

    ctx = Context(execution_id=uuid4(), workflow="w", step="s", map_index=0, attempt=1, input={})
    assert ctx.call_sync("double", lambda x: 2 * x, 21) == 42

    async def doubled() -> int:
        async def double(x: int) -> int:
            return 2 * x
        return int(await ctx.call("double", double, 21))

    assert asyncio.run(doubled()) == 42


def test_a_handler_in_a_child_process_is_told_it_cannot_journal(
        make_app: Callable[..., konduit.App]) -> None:
    wf = konduit.Workflow("journal-isolated", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=1))
    def step(ctx: konduit.Context) -> str:
        try:
            ctx.call_sync("in-a-child", lambda: 1)
        except konduit.JournalUnavailable as exc:
            return str(exc)
        return "recorded"

    app = make_app(wf)
    with running_worker(app, isolation="process"):
        eid = app.start("journal-isolated", input={}).id
        said = app.wait(eid, timeout=60).output
    assert "'in-a-child'" in said and "--isolation process" in said
    assert app.journal(eid) == []
