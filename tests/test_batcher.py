"""The completion batcher, a pure asyncio unit, with its injected ``record_group`` faked.

The fake is not a database stand-in: it is the batcher's one dependency, scripted to return,
raise or block, so each path of the batcher (grouping, ordering, errors, splitting, conflicts,
cancellation) is exercised exactly. The real ``record_ended`` behind it is tested on PostgreSQL
elsewhere (test_fan_in, test_fencing).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from konduit.engine.advancer import Advanced
from konduit.engine.completer import Completion, Recorded
from konduit.errors import DatabaseConflict, DatabaseError, DatabaseUnavailable, PoolExhausted
from konduit.worker.batcher import BatcherStopped, CompletionBatcher, Result

_ids = itertools.count(1)
E1, E2 = uuid.uuid4(), uuid.uuid4()
BOUND = 5.0  # no await in these tests may take longer than this


def completion(execution_id: uuid.UUID) -> Completion:
    task_id = next(_ids)
    return Completion(task_id=task_id, lease_token=uuid.uuid4(), execution_id=execution_id,
                      step=f"s{task_id}", map_index=0, attempt=1, outcome="succeeded")


def result_for(c: Completion) -> Result:
    """A result that names its completion, to check it reached the right submitter."""
    return Recorded.ENDED, Advanced(fired=[f"after-{c.task_id}"])


class FakeRecordGroup:
    """Records each call's batch; ``script`` decides per call what happens (default: record)."""

    def __init__(self, script: Callable[[int, list[Completion]], Awaitable[None]] | None = None):
        self.calls: list[list[Completion]] = []
        self.script = script

    async def __call__(self, batch: list[Completion]) -> list[Result]:
        self.calls.append(list(batch))
        if self.script is not None:
            await self.script(len(self.calls), batch)
        return [result_for(c) for c in batch]

    def ids(self) -> list[list[int]]:
        return [[c.task_id for c in call] for call in self.calls]


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=30))


async def queued(batcher: CompletionBatcher, completions: list[Completion]) -> list[asyncio.Task[Result]]:
    """Submit every completion and let each reach the queue before anything is recorded."""
    tasks = [asyncio.create_task(batcher.submit(c)) for c in completions]
    while batcher.queue.qsize() < len(completions):
        await asyncio.sleep(0)
    return tasks


async def settle(tasks: list[asyncio.Task[Result]]) -> list[Result | BaseException]:
    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), BOUND)
    return list(done)


async def stop(loop_task: asyncio.Task[None]) -> None:
    loop_task.cancel()
    await asyncio.gather(loop_task, return_exceptions=True)


def test_completions_submitted_together_are_grouped_per_execution_in_order() -> None:
    async def go() -> None:
        fake = FakeRecordGroup()
        batcher = CompletionBatcher(fake)
        cs = [completion(E1), completion(E2), completion(E1), completion(E2), completion(E1)]
        tasks = await queued(batcher, cs)
        loop_task = asyncio.create_task(batcher.run())
        results = await settle(tasks)
        await stop(loop_task)
        assert batcher.rounds == 1
        assert sorted(fake.ids()) == sorted([[cs[0].task_id, cs[2].task_id, cs[4].task_id],
                                             [cs[1].task_id, cs[3].task_id]])
        assert results == [result_for(c) for c in cs]  # each submitter gets its own result

    run(go())


def test_outcomes_arriving_during_a_round_go_together_in_the_next() -> None:
    async def go() -> None:
        release = asyncio.Event()

        async def script(call: int, batch: list[Completion]) -> None:
            if call == 1:
                await release.wait()

        fake = FakeRecordGroup(script)
        batcher = CompletionBatcher(fake)
        loop_task = asyncio.create_task(batcher.run())
        first = asyncio.create_task(batcher.submit(completion(E1)))
        while not fake.calls:
            await asyncio.sleep(0)
        later = [completion(E1) for _ in range(4)]
        tasks = await queued(batcher, later)  # queued while the first round is in flight
        release.set()
        await settle([first, *tasks])
        await stop(loop_task)
        assert fake.ids()[1:] == [[c.task_id for c in later]]
        assert batcher.rounds == 2
        assert [t.result() for t in tasks] == [result_for(c) for c in later]

    run(go())


def test_max_batch_is_respected() -> None:
    async def go() -> None:
        fake = FakeRecordGroup()
        batcher = CompletionBatcher(fake, max_batch=3)
        cs = [completion(E1) for _ in range(7)]
        tasks = await queued(batcher, cs)
        loop_task = asyncio.create_task(batcher.run())
        await settle(tasks)
        await stop(loop_task)
        assert [len(call) for call in fake.calls] == [3, 3, 1]
        assert [c.task_id for call in fake.calls for c in call] == [c.task_id for c in cs]

    run(go())


@pytest.mark.parametrize("error", [DatabaseUnavailable("down"), PoolExhausted("busy")])
def test_an_outage_is_given_to_each_submitter_of_the_group_and_not_split(
    error: DatabaseError,
) -> None:
    async def go() -> None:
        async def script(call: int, batch: list[Completion]) -> None:
            if batch[0].execution_id == E1:
                raise error

        fake = FakeRecordGroup(script)
        batcher = CompletionBatcher(fake)
        failing = [completion(E1) for _ in range(3)]
        fine = [completion(E2) for _ in range(2)]
        tasks = await queued(batcher, failing + fine)
        loop_task = asyncio.create_task(batcher.run())
        results = await settle(tasks)
        await stop(loop_task)
        assert results[:3] == [error] * 3
        assert results[3:] == [result_for(c) for c in fine]
        assert sorted(len(call) for call in fake.calls) == [2, 3]  # no one-by-one retry

    run(go())


def test_a_database_error_splits_the_group_so_neighbours_still_record() -> None:
    async def go() -> None:
        cs = [completion(E1) for _ in range(4)]
        bad = cs[1]

        async def script(call: int, batch: list[Completion]) -> None:
            if any(c.task_id == bad.task_id for c in batch):
                raise DatabaseError("payload refused")

        fake = FakeRecordGroup(script)
        batcher = CompletionBatcher(fake)
        tasks = await queued(batcher, cs)
        loop_task = asyncio.create_task(batcher.run())
        results = await settle(tasks)
        await stop(loop_task)
        assert isinstance(results[1], DatabaseError) and str(results[1]) == "payload refused"
        assert [results[i] for i in (0, 2, 3)] == [result_for(cs[i]) for i in (0, 2, 3)]
        assert fake.ids() == [[c.task_id for c in cs]] + [[c.task_id] for c in cs]

    run(go())


def test_a_conflict_records_the_whole_group_again() -> None:
    async def go() -> None:
        async def script(call: int, batch: list[Completion]) -> None:
            if call == 1:
                raise DatabaseConflict("deadlock")

        fake = FakeRecordGroup(script)
        batcher = CompletionBatcher(fake)
        cs = [completion(E1) for _ in range(3)]
        tasks = await queued(batcher, cs)
        loop_task = asyncio.create_task(batcher.run())
        results = await settle(tasks)
        await stop(loop_task)
        assert results == [result_for(c) for c in cs]
        assert fake.ids() == [[c.task_id for c in cs]] * 2  # the same group, not split

    run(go())


def test_a_conflict_that_persists_reaches_each_submitter_as_a_conflict() -> None:
    async def go() -> None:
        conflict = DatabaseConflict("deadlock")

        async def script(call: int, batch: list[Completion]) -> None:
            raise conflict

        fake = FakeRecordGroup(script)
        batcher = CompletionBatcher(fake, conflict_attempts=3)
        cs = [completion(E1) for _ in range(3)]
        tasks = await queued(batcher, cs)
        loop_task = asyncio.create_task(batcher.run())
        results = await settle(tasks)
        await stop(loop_task)
        assert results == [conflict] * 3
        assert fake.ids() == [[c.task_id for c in cs]] * 3

    run(go())


def test_a_bug_in_record_group_reaches_the_submitters_and_the_loop_goes_on() -> None:
    async def go() -> None:
        async def script(call: int, batch: list[Completion]) -> None:
            if call == 1:
                raise ValueError("engine bug")

        fake = FakeRecordGroup(script)
        batcher = CompletionBatcher(fake)
        loop_task = asyncio.create_task(batcher.run())
        (first,) = await settle([asyncio.create_task(batcher.submit(completion(E1)))])
        assert isinstance(first, ValueError)
        c = completion(E1)
        assert await asyncio.wait_for(batcher.submit(c), BOUND) == result_for(c)
        await stop(loop_task)

    run(go())


def test_a_wrong_number_of_results_fails_its_group_not_the_loop() -> None:
    async def go() -> None:
        async def short(batch: list[Completion]) -> list[Result]:
            return [result_for(c) for c in batch][:1]

        batcher = CompletionBatcher(short)
        tasks = await queued(batcher, [completion(E1), completion(E1)])
        loop_task = asyncio.create_task(batcher.run())
        results = await settle(tasks)
        assert all(isinstance(r, RuntimeError) for r in results)
        assert not loop_task.done()
        c = completion(E2)
        assert await asyncio.wait_for(batcher.submit(c), BOUND) == result_for(c)
        await stop(loop_task)

    run(go())


def test_cancelling_the_loop_leaves_no_waiter_hanging() -> None:
    async def go() -> None:
        async def script(call: int, batch: list[Completion]) -> None:
            await asyncio.Event().wait()  # never returns

        fake = FakeRecordGroup(script)
        batcher = CompletionBatcher(fake, max_batch=2)
        tasks = await queued(batcher, [completion(E1) for _ in range(3)])
        loop_task = asyncio.create_task(batcher.run())
        while not fake.calls:
            await asyncio.sleep(0)  # two in flight, one still queued
        await stop(loop_task)
        results = await settle(tasks)
        assert all(isinstance(r, BatcherStopped) for r in results), results
        with pytest.raises(BatcherStopped):  # and a late submitter is told at once
            await asyncio.wait_for(batcher.submit(completion(E1)), BOUND)

    run(go())


def test_cancelling_the_loop_while_splitting_leaves_no_waiter_hanging() -> None:
    async def go() -> None:
        async def script(call: int, batch: list[Completion]) -> None:
            if len(batch) > 1:
                raise DatabaseError("refused")
            await asyncio.Event().wait()  # the first one alone never returns

        fake = FakeRecordGroup(script)
        batcher = CompletionBatcher(fake)
        tasks = await queued(batcher, [completion(E1) for _ in range(3)])
        loop_task = asyncio.create_task(batcher.run())
        while len(fake.calls) < 2:
            await asyncio.sleep(0)
        await stop(loop_task)
        results = await settle(tasks)
        assert all(isinstance(r, BatcherStopped) for r in results), results

    run(go())


def test_a_submitter_that_gives_up_does_not_disturb_the_others() -> None:
    async def go() -> None:
        release = asyncio.Event()

        async def script(call: int, batch: list[Completion]) -> None:
            await release.wait()

        fake = FakeRecordGroup(script)
        batcher = CompletionBatcher(fake)
        cs = [completion(E1) for _ in range(3)]
        tasks = await queued(batcher, cs)
        loop_task = asyncio.create_task(batcher.run())
        while not fake.calls:
            await asyncio.sleep(0)
        tasks[0].cancel()
        release.set()
        results = await settle(tasks)
        assert isinstance(results[0], asyncio.CancelledError)
        assert results[1:] == [result_for(c) for c in cs[1:]]
        assert not loop_task.done()
        await stop(loop_task)

    run(go())


def test_a_slow_round_does_not_hold_other_executions_and_holds_back_its_own() -> None:
    """A round past its patience (a big map's fan-in) lets the next round start beside it, for
    the other executions' outcomes; a later outcome of the slow round's execution waits for it
    (it would wait for its lock) and goes in the round after it."""
    slow = asyncio.Event()

    async def script(call: int, batch: list[Completion]) -> None:
        if call == 1:
            await slow.wait()

    async def go() -> None:
        fake = FakeRecordGroup(script)
        batcher = CompletionBatcher(fake, max_executions=100, patience=0.05)
        runner = asyncio.create_task(batcher.run())
        first = completion(E1)
        first_done = asyncio.create_task(batcher.submit(first))
        while not fake.calls:
            await asyncio.sleep(0.01)
        assert not batcher.stalled
        await asyncio.sleep(0.1)  # past its patience
        assert batcher.stalled and batcher.busy
        again, other = completion(E1), completion(E2)
        again_done = asyncio.create_task(batcher.submit(again))
        assert await asyncio.wait_for(batcher.submit(other), BOUND) == result_for(other)
        assert not first_done.done() and not again_done.done()
        slow.set()
        assert await asyncio.wait_for(first_done, BOUND) == result_for(first)
        assert await asyncio.wait_for(again_done, BOUND) == result_for(again)
        assert fake.ids() == [[first.task_id], [other.task_id], [again.task_id]]
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    run(go())
