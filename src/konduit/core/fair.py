"""Fair shares between keys (``Workflow(fair_by=...)``): the key of a start, and the turns its
root tasks take.

The claim takes ready tasks by (priority, fair turn, execution): start-time fair queueing, with a
queue's *clock* the latest turn claimed (migration 0019). Without a key each execution (a batch
start as one) is its own flow and starts at the clock. With a key the flow is the key: it keeps
a *next slot* per queue, in eighths of a turn, and each start of the key takes its roots' slots
from ``max(next slot, clock x 8)`` on. A customer with 10,000 executions waiting thus holds the
next 1,250 turns, 8 tasks each, while another customer's first execution takes the clock's turn
and is claimed within a round. The statement that does this is
``execution_insert_many_with_roots`` (starts.sql); these functions are its arithmetic, for tests
and for reading.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from konduit.core.key_paths import KeyPath, key_of
from konduit.errors import KonduitError, LimitKeyError, WorkflowDefinitionError

SLOTS_PER_TURN = 8
"""Tasks of one flow per turn: konduit_task_turn's share (migration 0019)."""

MAX_KEY_LENGTH = 200
"""The longest fair key: it is stored on each execution and in a key row per queue."""

FairBy = Callable[[Any], Any] | KeyPath


class FairKeyError(KonduitError):
    """A workflow's ``fair_by`` raised or returned something other than a short non-empty
    string for a start's input; nothing was stored."""


def check_fair_by(fair_by: Any, *, workflow: str) -> FairBy | None:
    """``fair_by`` as given to a workflow: None, a path into the input (``"input.customer"``,
    which every door computes) or a callable of one argument (the input; code)."""
    try:
        return key_of(fair_by, what="fair_by")
    except ValueError as exc:
        raise WorkflowDefinitionError(
            f"{exc} (e.g. fair_by='input.customer', or fair_by=lambda input: "
            f"input['customer'])", workflow=workflow) from None


def fair_key(fair_by: FairBy, value: Any, *, workflow: str) -> str:
    """The key of a start of ``workflow`` with input ``value`` (as stored). A path reads it;
    whatever a function raises (``BaseException`` included: a ``KeyboardInterrupt`` raised by
    user code ends this start, not the process) or a result that is no short string becomes a
    :class:`FairKeyError` naming the workflow, fair_by and the function."""
    if isinstance(fair_by, KeyPath):
        try:
            found = fair_by.of(value, where=f"fair_by of workflow {workflow!r}")
        except LimitKeyError as exc:
            raise FairKeyError(str(exc)) from None
        return check_key(found, what=f"fair_by of workflow {workflow!r} found")
    try:
        key = fair_by(value)
    except LimitKeyError:  # a stand-in's refusal (KeyNeedsCode) says what it means itself
        raise
    except BaseException as exc:  # user code: KeyboardInterrupt too ends this start only
        raise FairKeyError(f"fair_by of workflow {workflow!r} raised {type(exc).__name__}: "
                           f"{exc} (in the function {function_name(fair_by)})") from exc
    return check_key(key, what=f"fair_by of workflow {workflow!r} returned")


def function_name(fn: object) -> str:
    """How a message names a user's function: its qualified name, else its repr."""
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else repr(fn)


def check_key(key: Any, *, what: str) -> str:
    """``key`` if it is a fair key (text of 1 to 200 characters), else a
    :class:`FairKeyError` saying ``what`` gave it."""
    if not isinstance(key, str):
        raise FairKeyError(f"{what} {type(key).__name__} {key!r:.80}; a fair key is a string")
    if not key or len(key) > MAX_KEY_LENGTH or "\x00" in key:
        raise FairKeyError(f"{what} a key of {len(key)} characters; a fair key has 1 to "
                           f"{MAX_KEY_LENGTH} (and no NUL)")
    return key


def take_slots(next_slot: int | None, clock: int, executions: int,
               width: int) -> tuple[list[int], int]:
    """A start of ``executions`` executions of one key, ``width`` roots each, in a queue at turn
    ``clock`` whose key row says ``next_slot`` (None: no row): each execution's first slot, and
    the key's next slot after them."""
    first = clock * SLOTS_PER_TURN if next_slot is None else max(next_slot,
                                                                 clock * SLOTS_PER_TURN)
    return [first + i * width for i in range(executions)], first + executions * width


def slot_turn(slot: int) -> int:
    """The turn of the task in ``slot`` (konduit_slot_turn, migration 0027)."""
    return slot // SLOTS_PER_TURN


def stale(next_slot: int, clock: int) -> bool:
    """A key row that means the same as no row: its next slot is not ahead of the clock, so
    retention may delete it (take_slots gives the same slots either way)."""
    return next_slot <= clock * SLOTS_PER_TURN
