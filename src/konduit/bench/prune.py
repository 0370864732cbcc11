"""What retention costs (``konduit bench --only prune_day``): the time to prune a day of history,
and what the prune leaves behind in the tables the workers write.

A day of finished executions (``executions`` of them, ``width`` root steps each, every step a
task with one attempt and one output: the rows a real run keeps) is written with SQL, spread
over the UTC day before yesterday, then ``App.prune(older_than="1d")`` deletes them (in its
batches of 500 executions, each cascading to the execution's rows). Reported: the seconds the
prune took, the executions deleted per second, and the dead tuples it left in
``konduit_executions``, ``konduit_steps``, ``konduit_tasks``, ``konduit_attempts`` and
``konduit_outputs`` (work for vacuum: until it runs, every scan of those tables walks past them).

Then the history side (migration 0041): the same day written again, moved into the history
(``history.move_finished``, in the leader's batches of 500) and pruned by the same
``App.prune``, which now drops the day's partitions. Reported: the move's seconds and the dead
tuples it leaves in the hot tables (a move deletes the rows it copies: the dead tuples the
prune used to leave, left earlier and in small steps), the prune's seconds and the dead tuples
and deleted rows it leaves in the hot tables (none), and the ratio of the two prunes."""

from __future__ import annotations

import asyncio
import time
from datetime import date

import psycopg

import konduit
from konduit.bench.fleet import Json, _check, _r

HOT = ("konduit_executions", "konduit_steps", "konduit_tasks", "konduit_attempts",
       "konduit_outputs")


def fill_day(url: str, *, executions: int, width: int, day: date | None = None,
             days: int = 1, tag: str = "prune-day", vacuum: bool = True) -> float:
    """``executions`` finished executions of ``width`` root steps, finished over the day that
    ended 25 hours ago (or over the UTC ``day``; over the ``days`` days ending there), with
    their steps, tasks, attempts and outputs; seconds it took. ``tag``: their input_hash and
    worker_id (what the fill finds its rows by: a second fill of another tag leaves the first
    one's rows alone); ``vacuum``: VACUUM ANALYZE once written."""
    began = time.perf_counter()
    spacing = 86400.0 * days / executions
    # g = 1..executions finish at `end` - g * spacing: over the `days` x 24 hours before `end`.
    end = ("now() - make_interval(secs => 90000)" if day is None
           else "((%(day)s::date + 1)::timestamp AT TIME ZONE 'UTC')")
    with psycopg.connect(url, autocommit=True) as conn:
        version = int(conn.execute("SHOW server_version_num").fetchone()[0])  # type: ignore[index]
        # Execution ids sort by creation time (UUIDv7): the day gets ids from its own time.
        make_id = "uuidv7(fin - now())" if version >= 180000 else "gen_random_uuid()"
        with conn.transaction():
            # The executions' workflow: a row to refer to (nothing here runs it).
            conn.execute("""
                INSERT INTO konduit_workflows (name, version, spec_hash, spec)
                VALUES ('bench-prune', 1, 'bench-prune', '{"name": "bench-prune"}')
                ON CONFLICT DO NOTHING""")
            conn.execute(f"""
                INSERT INTO konduit_executions (id, workflow_name, workflow_version, status,
                    input_hash, steps_pending, output, created_at, finished_at)
                SELECT {make_id}, 'bench-prune', 1, 'succeeded', %(tag)s, 0, '1',
                       fin - interval '1 second', fin
                FROM (SELECT {end} - make_interval(secs => g * %(spacing)s) AS fin
                      FROM generate_series(1, %(executions)s) g) f""",
                         {"spacing": spacing, "executions": executions, "day": day, "tag": tag})
            conn.execute("""
                INSERT INTO konduit_steps (execution_id, step, status, up_total, up_pending,
                    tasks_total, tasks_ok, fired_at, ended_at)
                SELECT e.id, 's' || i, 'succeeded', 0, 0, 1, 1, e.created_at, e.finished_at
                FROM konduit_executions e, generate_series(1, %(width)s) i
                WHERE e.input_hash = %(tag)s""", {"width": width, "tag": tag})
            conn.execute("""
                INSERT INTO konduit_tasks (execution_id, workflow, step, status, attempt,
                    max_attempts, output_hash, created_at, started_at, finished_at, worker_id)
                SELECT e.id, 'bench-prune@1', 's' || i, 'succeeded', 1, 3, 'h' || i,
                       e.created_at, e.created_at, e.finished_at, %(tag)s
                FROM konduit_executions e, generate_series(1, %(width)s) i
                WHERE e.input_hash = %(tag)s""", {"width": width, "tag": tag})
            conn.execute("""
                INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token,
                    started_at, finished_at, outcome)
                SELECT id, 1, %(tag)s, gen_random_uuid(), started_at, finished_at,
                       'succeeded'
                FROM konduit_tasks WHERE worker_id = %(tag)s""", {"tag": tag})
            conn.execute("""
                INSERT INTO konduit_outputs (execution_id, step, map_index, content_hash,
                    payload)
                SELECT execution_id, step, 0, output_hash, '{"ok": true}'
                FROM konduit_tasks WHERE worker_id = %(tag)s""", {"tag": tag})
        if vacuum:
            conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - began


def dead_tuples(url: str) -> dict[str, int]:
    """n_dead_tup of the hot tables, once the statistics collector has the prune's deletes."""
    return {name: dead for name, (dead, _) in hot_stats(url).items()}


def hot_stats(url: str) -> dict[str, tuple[int, int]]:
    """(n_dead_tup, n_tup_del) of each hot table, once this server's statistics are flushed:
    the dead tuples waiting for vacuum, and the rows ever deleted (which vacuum does not
    reset: the difference of two readings is what was deleted between them)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute("SELECT relname::text, n_dead_tup, n_tup_del FROM pg_stat_user_tables"
                            " WHERE relname = ANY(%s)", (list(HOT),)).fetchall()
    return {name: (int(dead), int(deleted)) for name, dead, deleted in rows}


def _deleted_since(before: dict[str, tuple[int, int]],
                   after: dict[str, tuple[int, int]]) -> dict[str, int]:
    return {name: after[name][1] - before[name][1] for name in HOT}


def vacuum_hot(url: str) -> float:
    """VACUUM the hot tables (what autovacuum would do, at once); seconds it took."""
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for table in HOT:
            conn.execute(f"VACUUM {table}")
    return time.perf_counter() - began


def settle_history(url: str) -> float:
    """What a day of history goes through while it waits for its retention (days): vacuumed
    and analyzed (autovacuum), and its files written out (a checkpoint). A drop right after the
    move truncates files the kernel is still writing out and can wait on that I/O (seen: 3.4 s
    for a day of 100,000 executions right after its move, 0.3 s once written); a drop 30 days
    later finds them long written. Seconds it took."""
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for name in history_partitions(url):
            conn.execute(f"VACUUM ANALYZE {name}")
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            pass  # a role without pg_checkpoint: the files are written out when the server will
    return time.perf_counter() - began


def history_partitions(url: str) -> list[str]:
    """The partitions the history holds now, every table's."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("""
            SELECT c.relname::text FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
            WHERE p.relname::text LIKE 'konduit_history_%' AND c.relkind = 'r' ORDER BY 1""").fetchall()
    return [name for (name,) in rows]


async def _move(url: str) -> int:
    from konduit.bench.harness import opened
    from konduit.engine import history

    async with opened(url, 2) as db:
        return await history.move_finished(db, "1d")


def _day_before_yesterday(url: str) -> date:
    """The UTC day that ended between 24 and 48 hours ago: all of it is older than "1d"."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT ((now() AT TIME ZONE 'UTC')::date - 2)").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _prune(url: str) -> tuple[int, float]:
    with konduit.App([], database_url=url) as app:
        app.migrate()  # opens the pool: the prune below is warm
        began = time.perf_counter()
        deleted = app.prune("1d")
        return deleted, time.perf_counter() - began


def prune_day(url: str, *, executions: int, width: int = 10, history: bool = True) -> Json:
    """Fill a day of history (:func:`fill_day`, the UTC day before yesterday), prune it with
    ``App.prune(older_than="1d")`` and report the time it took and the dead tuples it left; then,
    with ``history``, the same day again moved into the history (``history.move_finished``,
    as the leader's moves do, in batches of 500) and pruned: a drop of the day's partitions."""
    day = _day_before_yesterday(url)
    filled = fill_day(url, executions=executions, width=width, day=day)
    before = hot_stats(url)
    deleted, seconds = _prune(url)
    _check(deleted == executions, f"prune_day: {deleted} of {executions} deleted")
    after = hot_stats(url)
    dead = {name: dead for name, (dead, _) in after.items()}
    rows = {"executions": executions, "steps": executions * width,
            "tasks": executions * width, "attempts": executions * width,
            "outputs": executions * width}
    report: Json = {
        "parameters": {"executions": executions, "width": width, "day": day.isoformat(),
                       "rows": rows,
                       "how": "App.prune(older_than='1d'): batches of 500 executions, each a "
                              "DELETE cascading to the execution's rows"},
        "results": {"seconds_to_fill": _r(filled), "prune_seconds": _r(seconds),
                    "executions_pruned_per_second": _r(executions / seconds),
                    "dead_tuples_left": dead,
                    "dead_tuples_left_total": sum(dead.values()),
                    "rows_deleted_in_hot_tables": sum(_deleted_since(before, after).values())},
        "ratios": {},
    }
    if history:
        report["parameters"]["history"] = (
            "the same day written again, moved into the history by history.move_finished("
            "older_than='1d') (batches of 500 executions, as the leader's moves), the hot tables "
            "vacuumed, the day settled as over its retention (its partitions vacuumed, a "
            "checkpoint), then App.prune(older_than='1d'): its drop of the day's partitions")
        report["results"]["history"] = found = prune_day_history(url, executions=executions,
                                                                 width=width, day=day)
        report["ratios"] = {
            "row_deletes_over_partition_drop": _r(seconds / found["prune_seconds"]),
            "partition_drop_over_row_deletes": _r(found["prune_seconds"] / seconds),
            "move_over_row_deletes": _r(found["move_seconds"] / seconds)}
    return report


def prune_day_history(url: str, *, executions: int, width: int, day: date) -> Json:
    """The history side of :func:`prune_day`: the day written, moved, the hot tables vacuumed,
    then pruned (partitions dropped). Leaves every table as it found it (empty, vacuumed)."""
    vacuum_hot(url)  # what the row deletes before left is not counted against the move
    filled = fill_day(url, executions=executions, width=width, day=day, tag="prune-day-history")
    before = hot_stats(url)
    began = time.perf_counter()
    moved = asyncio.run(_move(url))
    move_seconds = time.perf_counter() - began
    _check(moved == executions, f"prune_day: {moved} of {executions} moved into the history")
    after_move = hot_stats(url)
    partitions = history_partitions(url)
    _check(bool(partitions) and all(p.endswith(day.strftime("_p%Y%m%d")) for p in partitions),
           f"prune_day: the history holds {partitions}, not the partitions of {day}")
    vacuum_seconds = vacuum_hot(url)
    after_vacuum = hot_stats(url)
    settle_seconds = settle_history(url)
    pruned, seconds = _prune(url)
    _check(pruned == executions, f"prune_day: {pruned} of {executions} pruned from the history")
    after_prune = hot_stats(url)
    left = history_partitions(url)
    _check(not left, f"prune_day: partitions left after the prune: {left}")
    dead_move = {name: dead for name, (dead, _) in after_move.items()}
    dead_prune = {name: dead for name, (dead, _) in after_prune.items()}
    return {"seconds_to_fill": _r(filled),
            "move_seconds": _r(move_seconds),
            "executions_moved_per_second": _r(executions / move_seconds),
            "move_dead_tuples_left": dead_move,
            "move_dead_tuples_left_total": sum(dead_move.values()),
            "move_rows_deleted_in_hot_tables": sum(_deleted_since(before, after_move).values()),
            "vacuum_after_move_seconds": _r(vacuum_seconds),
            "settle_seconds": _r(settle_seconds),
            "partitions_dropped": len(partitions),
            "prune_seconds": _r(seconds),
            "executions_pruned_per_second": _r(executions / seconds),
            "dead_tuples_left": dead_prune,
            "dead_tuples_left_total": sum(dead_prune.values()),
            "rows_deleted_in_hot_tables": sum(
                _deleted_since(after_vacuum, after_prune).values())}
