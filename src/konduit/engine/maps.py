"""Map expansion: a ``map`` step whose join fired becomes one task per item of ``over()``.

``over()`` runs inside the fan-in transaction that fired the step (the execution row stays
locked), so the fan-out's items and their count commit with the decision that caused it or not
at all. Only the first :data:`MAP_CHUNK_ROWS` tasks are created there: the other items are kept
as chunks (``konduit_map_chunks``, one row per chunk, migration 0032) that any worker turns into
tasks later, one chunk per transaction (:func:`create_next_chunk`), beside its claims. The join
after the map counts every item from the start (its ``tasks_total`` is set in the fan-in), so it
waits for the items of chunks not created yet as for any other.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from uuid import UUID

from konduit.core.fair import function_name
from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json
from konduit.core.workflow import StepSpec, WorkflowSpec
from konduit.db.database import Database, Row, Tx
from konduit.engine.deadlines import cut_columns, task_budgets
from konduit.engine.outputs import group_payloads, outputs_query
from konduit.engine.registry import workflow_key
from konduit.errors import PayloadError, UserCodeInterrupted, UserCodeStuck
from konduit.threads import HandlerThreads, call_within

log = logging.getLogger(__name__)

MAP_OVER_SECONDS = 60.0
"""How long a map step's ``over()`` and the encoding of its items may take (a million small items
take about 4 s on a 2-core machine). Past it the execution fails naming the map step, and the
call's thread is abandoned: the expansion runs inside a completion round, which must end, or
every outcome of the worker behind it waits (a thread cannot be killed; it ends when the code
returns)."""

MAP_OVER_MAX_HUNG = 8
"""Calls of ``over()`` that may be left running past :data:`MAP_OVER_SECONDS` in one process;
past them a map step that fires fails at once (:class:`~konduit.errors.UserCodeStuck`) instead
of leaving one more thread behind."""

_over_threads = HandlerThreads(name="konduit-map-over", max_abandoned=MAP_OVER_MAX_HUNG,
                               process_wide=True, what="maps' over()")

MAP_CHUNK_ROWS = 5_000
"""Map tasks created per statement and per chunk: each chunk's parameters are built on the event
loop, and a chunk transaction holds its execution's row (shared) while it inserts, so a chunk
must stay small enough not to stall heartbeats nor the map's own completion rounds, yet big
enough to keep round trips few."""

chunk_hook: Callable[[UUID, int], Awaitable[None]] | None = None
"""Tests only: awaited as (execution id, first index) inside each chunk transaction, after its
tasks were inserted and before it commits; what it raises rolls the chunk back."""


class _SealingFailed(Exception):
    """The payload codec or store failed to seal an item (the cause): raised as it is, not as
    ``over()``'s failure."""


class MapTooLarge(Exception):
    """``over()`` produced more items than the map step's ``max_items``."""


class CannotFanOut(Exception):
    """A map step's items could not be made (too many, too big, or ``over()`` raised): the
    execution fails, and the message says why."""


def map_source(workflow: WorkflowSpec, spec: StepSpec, rows: list[Row],
               loads: Callable[[str], Any] = json.loads) -> Any:
    """What ``over()`` receives, from ``output_get_for_steps`` rows: the upstream payload, or a
    dict of step -> payload with several upstreams (a list in item order for a map)."""
    payloads = group_payloads(workflow, list(spec.after), rows, loads)
    return payloads[spec.after[0]] if len(spec.after) == 1 else payloads


def expand_map(
    over: Callable[[Any], Iterable[Any]],
    source: Any,
    *,
    max_items: int,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> list[str]:
    """The items of a map step as canonical JSON texts, in order. Runs the user's ``over()``
    (on a thread: it may take a while) and stops reading it one item past ``max_items``, so an
    endless or enormous iterable fails with the limit rather than exhausting memory."""
    items: list[str] = []
    for i, item in enumerate(itertools.islice(over(source), max_items + 1)):
        if i == max_items:
            raise MapTooLarge(
                f"over() produced more than {max_items:,} items, the step's limit "
                f"(raise it with Workflow.map(max_items=...))"
            )
        items.append(canonical_json(item, what=f"item {i}", max_bytes=max_bytes))
    return items


async def create_map_tasks(
    tx: Tx,
    workflow: WorkflowSpec,
    spec: StepSpec,
    execution_id: UUID,
    *,
    generation: int,
    window_left: float | None,
    max_payload_bytes: int = DEFAULT_MAX_BYTES,
) -> int:
    """Expand a map step into one task per item; returns how many. The user's ``over()`` and
    the encoding of every item (sealed by the payload codec or store, if any) run on a thread,
    for at most :data:`MAP_OVER_SECONDS`, and the tasks are inserted in chunks: a map of a
    million items must not stall the event loop that also runs this worker's heartbeats and
    other tasks. Raises :class:`CannotFanOut` when the
    items cannot be made (in time)."""
    step = spec.name
    # The upstream payload may be the big list the map fans out over: it is decoded on the
    # thread too, not by the driver on this loop.
    rows = await tx.all(outputs_query(workflow, spec.after),
                        execution_id=execution_id, steps=list(spec.after))
    over = spec.map_over
    assert over is not None

    io = tx.io

    def expand() -> list[str]:
        source = map_source(workflow, spec, rows, io.loads)
        items = expand_map(over, source, max_items=spec.max_items, max_bytes=max_payload_bytes)
        if io.active:
            # Sealed here, on the thread that made them, each as its own payload (they are
            # joined into one text below): encrypting 100,000 items on the event loop stalled
            # it for over a second, past a short lease's heartbeat.
            scope = str(execution_id)
            try:
                items = [io.seal(item, scope=scope) for item in items]
            except Exception as exc:  # the codec's or the store's: not over()'s fault
                raise _SealingFailed from exc
        return items

    try:
        items = await call_within(_over_threads, expand, MAP_OVER_SECONDS)
    except _SealingFailed as failed:
        # As any payload that cannot be sealed: the round fails and is tried again, the
        # execution does not (a payload store that is down for a while).
        assert failed.__cause__ is not None
        raise failed.__cause__ from None
    except TimeoutError:
        log.warning("map step %r: over() still running after %g s (%d such calls abandoned)",
                    step, MAP_OVER_SECONDS, _over_threads.abandoned)
        raise CannotFanOut(f"map step {step!r}: over() and its items' encoding did not return "
                           f"within {MAP_OVER_SECONDS:g} s") from None
    except (MapTooLarge, PayloadError, UserCodeStuck) as exc:
        raise CannotFanOut(f"map step {step!r} cannot fan out: {exc}") from exc
    except Exception as exc:
        # KeyboardInterrupt, SystemExit...: carried out of the thread as UserCodeInterrupted.
        raised = exc.__cause__ if isinstance(exc, UserCodeInterrupted) and exc.__cause__ else exc
        raise CannotFanOut(
            f"map step {step!r}: over() ({function_name(over)}) failed: "
            f"{type(raised).__name__}: {raised}") from exc
    if not items:
        return 0
    (budget,) = await task_budgets(tx, workflow, [spec], window_left)
    cut = cut_columns([budget])
    facts = {
        "execution_id": execution_id,
        "generation": generation,
        "step": step,
        "queue": spec.queue,
        "priority": spec.priority,
        "max_attempts": spec.retry.max_attempts,
        "deadline_seconds": None if budget is None else budget.seconds,
        "limited": spec.flow is not None,
        "policy_revision": workflow.policy_revision,
        "deadline_uncut": cut["deadline_uncuts"][0],
        "deadline_reserve": cut["deadline_reserves"][0],
    }
    await tx.run(
        "task_insert_map_chunk_if_running",
        workflow=workflow_key(workflow.name, workflow.version),
        first_index=0,
        # One text, not a text[]: compact JSON never holds a raw newline, and psycopg
        # escapes the elements of a text array one by one in Python, on this loop.
        items="\n".join(items[:MAP_CHUNK_ROWS]),
        **facts,
    )
    # The rest waits as chunks, created by whichever worker takes them (create_next_chunk),
    # one row per chunk. Each statement is waited for (run, not send): queued unanswered in
    # the round's pipeline, 19 of them (750 kB each, 150-byte items) hung a 100,000-item
    # fan-in for good, the server session "active" in ClientRead on one of these inserts
    # (tests/test_big_map.py).
    for first in range(MAP_CHUNK_ROWS, len(items), MAP_CHUNK_ROWS):
        chunk = items[first : first + MAP_CHUNK_ROWS]
        await tx.run("map_chunk_insert", first_index=first, item_count=len(chunk),
                     items="\n".join(chunk), **facts)
    if len(items) > MAP_CHUNK_ROWS:
        await tx.send("map_chunk_notify_pending")
    return len(items)


async def create_next_chunk(db: Database) -> int | None:
    """Create the tasks of one pending chunk of a map's items, in one transaction, and delete
    the chunk: returns how many tasks it created (0 for a chunk of an execution that ended,
    deleted all the same), None when no chunk is left that another taker does not hold.

    Exactly once: the chunk row is locked (SKIP LOCKED: takers never wait for each other) and
    deleted in the statement that inserts its tasks, so a crash before the commit leaves the
    row to the next taker and the commit leaves the tasks and no row. No claim slot, no
    execution lock held for long: it runs beside the worker's claims and rounds."""
    async def take(tx: Tx) -> int | None:
        chunk = await tx.one("map_chunk_take_next")
        if chunk is None:
            return None
        try:
            row = await tx.one("task_insert_map_chunk_taken", id=chunk["id"])
            assert row is not None
            made = int(row["made"])
            if chunk["live"] and made != chunk["item_count"]:
                # The tasks' unique key refused some: they existed already, which the chunk's
                # row (gone with the tasks it made) should make impossible. Worth a line.
                log.warning("map step %r of execution %s: the chunk at item %d created %d of "
                            "its %d items (the others existed)", chunk["step"],
                            chunk["execution_id"], chunk["first_index"], made,
                            chunk["item_count"])
            if chunk_hook is not None:
                await chunk_hook(chunk["execution_id"], chunk["first_index"])
        except Exception as exc:  # whoever logs it can say which chunk failed
            first = chunk["first_index"]
            exc.add_note(f"map step {chunk['step']!r} of execution {chunk['execution_id']}, "
                         f"items {first} to {first + chunk['item_count'] - 1}")
            raise
        return made

    return await db.atomic(take)
