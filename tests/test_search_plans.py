"""Every kind of search is index-backed (issue 18, item 6): on a table of some thousands of
executions (filled as the search benchmark fills its million), ``EXPLAIN`` of the search
statement, with each filter's own parameters, reads konduit_executions through the index made
for that part (migration 0024), never by a sequential scan. The control shows the check can
fail: without the index, the same search is a sequential scan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from konduit.bench.search import fill
from konduit.core.search import ExecutionFilter
from konduit.db.queries import q

pytestmark = [pytest.mark.storage]

ROWS = 5_000


def plan_of(conn: psycopg.Connection[Any], where: ExecutionFilter,
            statement: str = "execution_search") -> dict[str, Any]:
    row = conn.execute(f"EXPLAIN (FORMAT JSON) {q(statement)}".encode(),
                       {**where.params(), "before_at": None, "before_id": None,
                        "limit": 50}).fetchone()
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += nodes(child)
    return found


def scans(plan: dict[str, Any]) -> set[tuple[str, str]]:
    """(node type, index or relation) of every scan in the plan."""
    return {(n["Node Type"], n.get("Index Name") or n.get("Relation Name", ""))
            for n in nodes(plan) if "Scan" in n["Node Type"]}


@pytest.fixture
def history(db_url: str) -> list[str]:
    fill(db_url, ROWS)
    with psycopg.connect(db_url) as conn:
        return [str(r[0]) for r in conn.execute(
            "SELECT id FROM konduit_executions ORDER BY id LIMIT 3")]


@pytest.mark.parametrize("statement", ["execution_search", "execution_search_with_history"])
def test_each_search_reads_its_index_not_the_table(db_url: str, history: list[str],
                                                   statement: str) -> None:
    """The bulk actions' search (the hot table) and every face's (the history beside it)."""
    some_id = history[1]
    expected = {
        "tag": (ExecutionFilter(tags={"customer": "c1234"}), "konduit_executions_tags"),
        "key": (ExecutionFilter(idempotency_key="key-1234"), "konduit_executions_key"),
        "id_start": (ExecutionFilter(id_prefix=some_id[:18]), "konduit_executions_pkey"),
        "id_end": (ExecutionFilter(id_prefix=some_id[-12:]), "konduit_executions_id_tail"),
        "input": (ExecutionFilter(input={"episode": 1234}), "konduit_executions_input"),
        "tag_status_workflow": (ExecutionFilter(tags={"customer": "c77"}, status="succeeded",
                                                workflow="bench-search", version=1),
                                "konduit_executions_tags"),
        "since": (ExecutionFilter(since=datetime.now(UTC) - timedelta(seconds=30)),
                  "konduit_executions_created_at"),
    }
    with psycopg.connect(db_url) as conn:
        for kind, (where, index) in expected.items():
            plan = plan_of(conn, where, statement)
            read = scans(plan)
            assert not any(t == "Seq Scan" for t, _ in read), (kind, read)
            assert index in {name for _, name in read}, (kind, read)


def test_the_check_fails_without_the_index(db_url: str, history: list[str]) -> None:
    with psycopg.connect(db_url) as conn, conn.transaction(force_rollback=True):
        conn.execute("DROP INDEX konduit_executions_tags")
        read = scans(plan_of(conn, ExecutionFilter(tags={"customer": "c1234"})))
        assert "konduit_executions_tags" not in {name for _, name in read}
        assert ("Seq Scan", "konduit_executions") in read or any(
            name == "konduit_executions_created_at" for _, name in read), read
