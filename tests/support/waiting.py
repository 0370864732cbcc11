"""Waiting for a condition instead of sleeping for a guess: a test goes on as soon as what it
waits for is true, and fails naming it when it never comes.

The deadlines are generous on purpose: the suite runs on a loaded machine, where a step that
takes 50 ms alone can take seconds; a deadline bounds a hang, it does not measure speed.
What a background service does at its next pass is waited for with :func:`wait_for_passes`
(the service says when a pass is done), never with a sleep the length of a few passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from konduit.testing import wait_for_passes

__all__ = ["holds", "until", "wait_for_passes"]

T = TypeVar("T")


def until(check: Callable[[], T], timeout: float = 30.0, what: str = "the condition",
          every: float = 0.05) -> T:
    """Call ``check`` until it returns something truthy, and return that; raise
    ``AssertionError`` naming ``what`` (and the last value) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {found!r})")
        time.sleep(every)


def holds(check: Callable[[], object], seconds: float, what: str = "the condition",
          every: float = 0.05) -> None:
    """Assert that ``check`` stays truthy for ``seconds`` (that nothing more happens): the one
    place a test must let time pass, since "never" has no event to wait for."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        assert found, f"{what} stopped holding (got {found!r})"
        time.sleep(every)
