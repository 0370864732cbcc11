"""The search benchmark: find one execution among 1,000,000.

A fresh database is filled with ``executions`` finished executions in a few set-based statements
(``INSERT ... SELECT generate_series``, not through ``start``: the search reads rows, however
they were made), shaped like a real history: UUIDv7-like ids (a millisecond-time prefix, random
tail), one every 100 ms, an input ``{"episode": i, "show": "show-<i % 100>"}``, an idempotency
key on half of them, tags ``{"customer": "c<i % 10000>", "region": ...}`` (100 executions a
customer). Then the search (``Client.search``, the statement every face runs) is timed for each
kind of part: a tag, a key, the start of an id, the end of an id, an input field, and a tag with
a status and a time range, each ``repeats`` times with a different value. ``search_history``
first moves the older half into the history (``App(history_after=)``'s tables): every search
reads both sides.

Not part of the API.
"""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime, timedelta

import psycopg

from konduit.bench.fleet import Json, _check, _r, dist_ms
from konduit.bench.harness import opened
from konduit.core.search import ExecutionFilter
from konduit.db.sealing import PLAIN
from konduit.engine.search import search_executions

CUSTOMERS = 10_000
FILL_CHUNK = 250_000


def fill(url: str, executions: int) -> float:
    """Fill ``executions`` finished executions of one workflow; returns the seconds it took
    (VACUUM ANALYZE included, as a database with a history has statistics)."""
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO konduit_workflows (name, version, spec_hash, spec)
            VALUES ('bench-search', 1, 'bench', '{}') ON CONFLICT DO NOTHING""")
        for first in range(1, executions + 1, FILL_CHUNK):
            last = min(executions, first + FILL_CHUNK - 1)
            conn.execute("""
                INSERT INTO konduit_executions (id, workflow_name, workflow_version, status,
                    input, input_hash, idempotency_key, steps_pending, created_at, finished_at,
                    tags)
                SELECT (lpad(to_hex((extract(epoch FROM t.at) * 1000)::bigint), 12, '0')
                        || '7' || substr(h.md, 1, 3) || '8' || substr(h.md, 4, 15))::uuid,
                       'bench-search', 1, 'succeeded',
                       jsonb_build_object('episode', g, 'show', 'show-' || (g %% 100)),
                       h.md, CASE WHEN g %% 2 = 0 THEN 'key-' || g END, 0, t.at,
                       t.at + interval '1 second',
                       jsonb_build_object('customer', 'c' || (g %% %(customers)s),
                                          'region', 'r' || (g %% 7))
                FROM generate_series(%(first)s::int, %(last)s::int) g
                CROSS JOIN LATERAL (SELECT now() - make_interval(
                    secs => (%(n)s::int - g) * 0.1) AS at) t
                CROSS JOIN LATERAL (SELECT md5(g::text) AS md) h""",
                {"first": first, "last": last, "n": executions, "customers": CUSTOMERS})
        conn.execute("VACUUM ANALYZE konduit_executions")
    return time.perf_counter() - began


def _filters(ids: list[str], executions: int, repeats: int, rng: random.Random,
             ) -> dict[str, list[ExecutionFilter]]:
    def some(count: int) -> list[int]:
        return [rng.randrange(1, executions + 1) for _ in range(count)]

    return {
        "tag": [ExecutionFilter(tags={"customer": f"c{i % CUSTOMERS}"}) for i in some(repeats)],
        "key": [ExecutionFilter(idempotency_key=f"key-{i - i % 2 or 2}") for i in some(repeats)],
        "id_prefix": [ExecutionFilter(id_prefix=rng.choice(ids)[:18]) for _ in range(repeats)],
        "id_tail": [ExecutionFilter(id_prefix=rng.choice(ids)[-12:]) for _ in range(repeats)],
        "input": [ExecutionFilter(input={"episode": i}) for i in some(repeats)],
        "tag_status_since": [
            ExecutionFilter(tags={"customer": f"c{i % CUSTOMERS}"}, status="succeeded",
                            since=_since(executions)) for i in some(repeats)],
    }


def _since(executions: int) -> datetime:
    """The start of the newer half of the history."""
    return datetime.now(UTC) - timedelta(seconds=executions * 0.05)


async def _measure(url: str, filters: dict[str, list[ExecutionFilter]],
                   ) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    # Without a codec: the rows were written plain by SQL (fill), and a search by input is
    # refused under one (suite.WITHOUT_CODEC says so in the report).
    async with opened(url, 1, payloads=PLAIN) as db:
        seconds: dict[str, list[float]] = {}
        found: dict[str, list[int]] = {}
        for kind, wheres in filters.items():
            # One search first, unmeasured: the connection and the catalog caches warm.
            await search_executions(db, wheres[0], limit=50)
            for where in wheres:
                began = time.perf_counter()
                rows = await search_executions(db, where, limit=50)
                seconds.setdefault(kind, []).append(time.perf_counter() - began)
                found.setdefault(kind, []).append(len(rows))
        return seconds, found


def server_ms(url: str, filters: dict[str, list[ExecutionFilter]], count: int = 20) -> Json:
    """The server's own planning and execution time of ``count`` searches of each kind
    (``EXPLAIN ANALYZE``), apart from the round trip and the client: what the index costs, on
    a machine whose load is in the round trip."""
    from konduit.db.queries import q

    out: Json = {}
    with psycopg.connect(url) as conn:
        for kind, wheres in filters.items():
            plans, runs, indexes = [], [], set()
            for where in wheres[:count]:
                row = conn.execute(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) {q('execution_search_with_history')}"
                    .encode(),
                    {**where.params(), "before_at": None, "before_id": None, "limit": 50},
                ).fetchone()
                assert row is not None
                top = row[0][0]
                plans.append(float(top["Planning Time"]) / 1000)
                runs.append(float(top["Execution Time"]) / 1000)
                indexes |= _indexes(top["Plan"])
            out[kind] = {"planning": dist_ms(plans), "execution": dist_ms(runs),
                         "indexes": sorted(indexes)}
    return out


def _indexes(plan: Json) -> set[str]:
    found = {plan["Index Name"]} if "Index Name" in plan else set()
    for child in plan.get("Plans", []):
        found |= _indexes(child)
    return found


async def _move_older(url: str, executions: int, fraction: float) -> tuple[int, float]:
    """Move the older ``fraction`` of the filled executions into the history (as
    ``App(history_after=)`` would have): how many moved, in how many seconds."""
    from konduit.engine.history import move_finished

    began = time.perf_counter()
    async with opened(url, 1, payloads=PLAIN) as db:
        # One execution every 100 ms, the newest now: the older fraction finished before this.
        moved = await move_finished(db, executions * 0.1 * (1 - fraction), batch_size=5_000)
    return moved, time.perf_counter() - began


def search(url: str, *, executions: int = 1_000_000, repeats: int = 200,
           history_fraction: float = 0.0) -> Json:
    """Fill ``executions`` and time ``repeats`` searches of each kind (p50/p95 in ms);
    ``history_fraction``: first move the older part of them into the history, and find them
    there (``search_history``)."""
    fill_seconds = fill(url, executions)
    moved, move_seconds = (asyncio.run(_move_older(url, executions, history_fraction))
                           if history_fraction else (0, 0.0))
    with psycopg.connect(url, autocommit=True) as conn:
        if moved:
            conn.execute("VACUUM ANALYZE konduit_history_executions")
        ids = [str(r[0]) for r in conn.execute(
            "(SELECT id FROM konduit_executions TABLESAMPLE SYSTEM (1) LIMIT 1000) UNION ALL"
            " (SELECT id FROM konduit_history_executions TABLESAMPLE SYSTEM (1) LIMIT 1000)")]
        if len(ids) < 100:  # a small fill: a page in a hundred may hold none of it
            ids = [str(r[0]) for r in conn.execute(
                "(SELECT id FROM konduit_executions ORDER BY random() LIMIT 1000) UNION ALL"
                " (SELECT id FROM konduit_history_executions ORDER BY random() LIMIT 1000)")]
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('konduit_executions'))"
                            ).fetchone()
        days = conn.execute("SELECT count(*) FROM konduit_history_days()").fetchone()
    _check(len(ids) > 0, "the filled table has no rows")
    filters = _filters(ids, executions, repeats, random.Random(18))
    seconds, found = asyncio.run(_measure(url, filters))
    for kind in ("key", "id_tail", "input"):
        _check(all(n >= 1 for n in found[kind]), f"a {kind} search found nothing")
    results: Json = {
        "executions": executions, "fill_seconds": _r(fill_seconds),
        "table_size": size[0] if size else None,
        **({"history_executions": moved, "history_days": days[0] if days else None,
            "move_seconds": _r(move_seconds)} if history_fraction else {}),
        "searches": {kind: {**dist_ms(s), "rows_found_max": max(found[kind])}
                     for kind, s in seconds.items()},
        "server": server_ms(url, filters),
    }
    worst = max(r["p95_ms"] for r in results["searches"].values())
    return {"parameters": {"executions": executions, "repeats": repeats, "limit": 50,
                           **({"history_fraction": history_fraction} if history_fraction
                              else {})},
            "results": results, "ratios": {"worst_p95_ms": worst}}
