"""Find any execution, of the hot tables or the history: one statement
(``execution_search_with_history``) for every face's search."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from konduit.core.search import MAX_LIMIT, ExecutionFilter, SearchError
from konduit.db.database import Database
from konduit.errors import blamed
from konduit.records import ExecutionFound


def check_searchable(db: Database, params: dict[str, Any]) -> None:
    """Refuse, with :class:`SearchError` naming the field ``input``, a filter (``where.params()``)
    by input under a payload codec: inputs are stored sealed, and PostgreSQL cannot look inside
    them (docs/payload-codecs.md). A search and a bulk action alike."""
    if params["input"] is not None and db.io.codec is not None:
        raise blamed(SearchError(
            f"input: executions cannot be found by input while a payload codec "
            f"({db.io.codec.name}) encodes payloads; search by tags, which stay plain text"),
            "input")


async def search_executions(db: Database, where: ExecutionFilter, *,
                            before: tuple[datetime, UUID] | None = None,
                            limit: int = 50) -> list[ExecutionFound]:
    """The executions ``where`` matches, newest first, a keyset page of at most ``limit``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise SearchError(f"limit {limit!r}: a whole number from 1 to {MAX_LIMIT}")
    before_at, before_id = before if before is not None else (None, None)
    p = where.params()
    check_searchable(db, p)
    rows = await db.all(
        "execution_search_with_history", id_low=p["id_low"], id_high=p["id_high"],
        id_tail=p["id_tail"],
        idempotency_key=p["idempotency_key"], tags=p["tags"], input=p["input"],
        status=p["status"], workflow_name=p["workflow_name"],
        workflow_version=p["workflow_version"], since=p["since"], until=p["until"],
        fair_key=p["fair_key"], before_at=before_at, before_id=before_id, limit=limit)
    return [ExecutionFound.from_row(r) for r in rows]
