"""Map expansion: a ``map`` step whose join fired becomes one task per item of ``over()``.

Runs inside the fan-in transaction that fired the step (the execution row stays locked), so the
fan-out commits with the decision that caused it or not at all.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any
from uuid import UUID

from konduit.core.fair import function_name
from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json
from konduit.core.workflow import StepSpec, WorkflowSpec
from konduit.db.database import Row, Tx
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
"""Map tasks created per statement: each chunk's parameters are built on the event loop, so a
chunk must stay small enough not to stall heartbeats, yet big enough to keep round trips few."""


class MapTooLarge(Exception):
    """``over()`` produced more items than the map step's ``max_items``."""


class CannotFanOut(Exception):
    """A map step's items could not be made (too many, too big, or ``over()`` raised): the
    execution fails, and the message says why."""


def map_source(workflow: WorkflowSpec, spec: StepSpec, rows: list[Row]) -> Any:
    """What ``over()`` receives, from ``output_get_for_steps`` rows: the upstream payload, or a
    dict of step -> payload with several upstreams (a list in item order for a map)."""
    payloads = group_payloads(workflow, list(spec.after), rows)
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
    the encoding of every item run on a thread, for at most :data:`MAP_OVER_SECONDS`, and the
    tasks are inserted in chunks: a map of a million items must not stall the event loop that
    also runs this worker's heartbeats and other tasks. Raises :class:`CannotFanOut` when the
    items cannot be made (in time)."""
    step = spec.name
    # The upstream payload may be the big list the map fans out over: it is decoded on the
    # thread too, not by the driver on this loop.
    rows = await tx.all(outputs_query(workflow, spec.after),
                        execution_id=execution_id, steps=list(spec.after))
    over = spec.map_over
    assert over is not None

    def expand() -> list[str]:
        source = map_source(workflow, spec, rows)
        return expand_map(over, source, max_items=spec.max_items, max_bytes=max_payload_bytes)

    try:
        items = await call_within(_over_threads, expand, MAP_OVER_SECONDS)
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
    for first in range(0, len(items), MAP_CHUNK_ROWS):
        await tx.run(
            "task_insert_map_chunk_if_running",
            execution_id=execution_id,
            workflow=workflow_key(workflow.name, workflow.version),
            generation=generation,
            step=step,
            first_index=first,
            # One text, not a text[]: compact JSON never holds a raw newline, and psycopg
            # escapes the elements of a text array one by one in Python, on this loop.
            items="\n".join(items[first : first + MAP_CHUNK_ROWS]),
            queue=spec.queue,
            priority=spec.priority,
            max_attempts=spec.retry.max_attempts,
            deadline_seconds=None if budget is None else budget.seconds,
            limited=spec.flow is not None,
            policy_revision=workflow.policy_revision,
            deadline_uncut=cut["deadline_uncuts"][0],
            deadline_reserve=cut["deadline_reserves"][0],
        )
    return len(items)
