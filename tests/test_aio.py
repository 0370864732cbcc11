"""A loop that waits on an event with a timeout must end when cancelled, even when the event
is set in the same loop iteration as the cancellation.

On Python 3.11, ``asyncio.wait_for(event.wait(), timeout)`` swallows such a cancellation (it
returns the inner result instead of raising): a ``while True`` loop around it never ends, and a
worker whose helper loops are cancelled at shutdown never stops (CI saw "the test worker did not
stop within 40 s" and a worker process ignore SIGTERM for 60 s, under load). The first test shows
the trap on this Python (so the harness can see the bug), the second that konduit.aio.wait_event
does not fall into it, the third that no loop in the package waits that way again.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from konduit.aio import wait_event

ROOT = Path(__file__).resolve().parent.parent


async def _loop_until_cancelled(wait: Callable[[asyncio.Event], Awaitable[object]]) -> str:
    """Cancel a waiting loop in the same iteration as its event is set: does the loop end?"""
    event = asyncio.Event()

    async def forever() -> None:
        while True:
            event.clear()
            await wait(event)

    task = asyncio.create_task(forever())
    await asyncio.sleep(0.01)
    event.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2.0)
    if not done:
        task.cancel()  # a second cancel ends it (the race is gone): clean up either way
        await asyncio.gather(task, return_exceptions=True)
        return "swallowed"
    return "cancelled" if task.cancelled() else "ended"


async def _wait_for(event: asyncio.Event) -> None:
    try:
        await asyncio.wait_for(event.wait(), 5.0)
    except TimeoutError:
        pass


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 rewrote wait_for")
def test_wait_for_swallows_a_cancel_that_meets_its_event_on_3_11() -> None:
    assert asyncio.run(_loop_until_cancelled(_wait_for)) == "swallowed"


def test_wait_event_keeps_the_cancel() -> None:
    for _ in range(20):
        assert asyncio.run(_loop_until_cancelled(lambda e: wait_event(e, 5.0))) == "cancelled"


def test_wait_event_answers_set_and_timeout() -> None:
    async def go() -> tuple[bool, bool]:
        event = asyncio.Event()
        timed_out = await wait_event(event, 0.01)
        event.set()
        return timed_out, await wait_event(event, 5.0)

    assert asyncio.run(go()) == (False, True)


def test_no_loop_in_the_package_waits_on_an_event_through_wait_for() -> None:
    pattern = re.compile(r"wait_for\(\s*(self\.)?_?\w+\.wait\(\)")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "src" / "konduit").rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line) and p.name != "aio.py"]  # aio.py names the trap
    assert not found, f"use konduit.aio.wait_event instead: {found}"
