"""Find the execution a typed id names: the whole id, or a unique prefix or tail of it.

People copy the piece a face shows (the random tail, :func:`konduit.core.ids.short_id`) or the
start of an id from a log line; both are accepted wherever an id is taken, through
``Client.resolve``. A piece that matches several executions is refused with the candidates,
never guessed.
"""

from __future__ import annotations

from uuid import UUID

from konduit.core.ids import id_pattern, matches, prefix_range, short_id
from konduit.core.search import id_bounds
from konduit.db.database import Database
from konduit.errors import AmbiguousExecutionId, ExecutionNotFound

CANDIDATES = 5  # listed in the error of an ambiguous piece


async def resolve_execution_id(db: Database, execution_id: object) -> UUID:
    """The one execution ``execution_id`` names (see the module docstring)."""
    if isinstance(execution_id, UUID):
        return execution_id
    carried = getattr(execution_id, "id", None)  # a handle or a result
    if isinstance(carried, UUID):
        return carried
    text = str(execution_id)
    try:
        pattern = id_pattern(text)
    except ValueError as exc:
        raise ExecutionNotFound(str(exc)) from None
    if pattern.full is not None:
        return pattern.full  # a whole id is taken as it is: the caller reads it (404 if absent)
    low, high = prefix_range(pattern)
    rows = await db.all("execution_list_ids_by_prefix_or_tail", low=low, high=high,
                        tail_reversed=id_bounds(pattern.hex)[2], limit=CANDIDATES + 1)
    found = [UUID(str(r["id"])) for r in rows]
    found = [f for f in found if matches(pattern, f)]
    if not found:
        raise ExecutionNotFound(f"no execution has an id that starts or ends with {text.strip()!r}")
    if len(found) > 1:
        shown = [str(f) for f in found[:CANDIDATES]]
        more = " and more" if len(found) > CANDIDATES else ""
        raise AmbiguousExecutionId(
            f"{text.strip()!r} matches several executions: {', '.join(shown)}{more}; give more "
            f"of the id (its last {len(short_id(found[0]))} characters tell them apart)", shown)
    return found[0]
