"""Run workflows in-process in your own tests, on a fresh real PostgreSQL database.

::

    import konduit
    import konduit.testing

    def test_publish():
        with konduit.testing.run([wf]) as app:
            result = app.start("publish-content", input={"episode": 1}).wait(timeout=30)
        assert result.output["published"]

:func:`run` gives a :class:`konduit.App` on a database created for the block (on the embedded
server, or on the server of ``database_url`` / ``KONDUIT_TEST_DATABASE_URL``), migrated, with a
worker running on a background thread; at the end of the block the worker is stopped and joined,
an error it died of is raised, and the database is dropped. :func:`fresh_database` gives only
the database. Both are safe to use from many threads and processes at once (e.g. ``pytest -n``).

For a suite with many database tests, a :class:`DatabasePool` hands out migrated databases that
are emptied and reused between tests instead of created and dropped (a clone costs a second on
a busy server, a reset tens of milliseconds), and :func:`worker_thread` runs the worker of
:func:`run` for an App on a database of your own.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from konduit.app import App
from konduit.core.durations import Duration, parse_duration
from konduit.core.workflow import Workflow
from konduit.errors import KonduitError
from konduit.settings import settings
from konduit.worker.worker import Worker

__all__ = ["DatabasePool", "TestClock", "TestWorkerError", "WorkerThread", "advance",
           "clock_of", "fresh_database", "run", "virtual_clock", "wait_for_passes",
           "worker_thread"]


class TestWorkerError(KonduitError):
    """The background worker of :func:`run` died, or did not stop in time; the cause is in
    ``__cause__``."""

    __test__ = False  # not a test class, whatever pytest thinks of the name


@contextmanager
def fresh_database(url: str | None = None, *, migrate: bool = True) -> Iterator[str]:
    """Create a database with a unique name, migrated (``migrate=False``: empty), yield its
    URL, drop it at exit.

    ``url`` names the server: its database is used only to create and drop the new one, and
    its user must be allowed to create databases. Without it: ``KONDUIT_TEST_DATABASE_URL``,
    else the embedded server. The drop is ``DROP DATABASE ... WITH (FORCE)``, so connections
    left open (a pool not closed, a stuck handler) do not keep it alive.

    The schema is migrated once per server into a template database
    (``konduit_testing_template_<hash of the migrations>``) and cloned from there.
    """
    import psycopg

    from konduit.db.embedded import server_url, with_database

    admin = url or settings().test_database_url or server_url("postgres")
    name = f"konduit_test_{os.getpid()}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        if not migrate:
            conn.execute(f'CREATE DATABASE "{name}"')
        else:
            template = _template(admin)
            try:
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            except psycopg.errors.InvalidCatalogName:  # dropped behind our back: build it again
                _templates.discard((admin, template))
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{_template(admin)}"')
    try:
        yield with_database(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_templates: set[tuple[str, str]] = set()
_templates_lock = threading.Lock()


def _template(admin: str) -> str:
    """A migrated template database on ``admin``'s server, built once per schema: cloning it
    takes milliseconds where migrating takes a second.

    Named after a hash of the migrations, so a changed schema gets a new one. Built under a
    temporary name and renamed when complete, under an advisory lock: a concurrent process
    either waits for it or finds it whole, never half-migrated.
    """
    import hashlib

    import psycopg

    from konduit.db.embedded import with_database
    from konduit.db.migrate import migrations

    digest = hashlib.sha256()
    for m in migrations():
        digest.update(f"{m.version}:{m.name}:{m.sql}".encode())
    name = f"konduit_testing_template_{digest.hexdigest()[:16]}"
    with _templates_lock:
        if (admin, name) in _templates:
            return name
        with psycopg.connect(admin, autocommit=True) as conn:
            exists = "SELECT 1 FROM pg_database WHERE datname = %s"
            if not conn.execute(exists, (name,)).fetchone():
                conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (name,))
                try:
                    if not conn.execute(exists, (name,)).fetchone():
                        building = f"konduit_testing_building_{uuid.uuid4().hex[:12]}"
                        conn.execute(f'CREATE DATABASE "{building}"')
                        try:
                            with App([], database_url=with_database(admin, building)) as migrator:
                                migrator.migrate()
                            conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
                        except BaseException:
                            conn.execute(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
                            raise
                finally:
                    conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (name,))
        _templates.add((admin, name))
    return name



class DatabasePool:
    """Migrated databases reused from test to test: each comes back empty, as if just created.

    ::

        pool = konduit.testing.DatabasePool()
        with pool.database() as url:      # a migrated database, empty
            ...
        pool.close()                      # drops the databases kept for reuse

    Cloning and dropping a database costs a second or more on a busy server (the clone is
    written through the WAL and the drop waits for a checkpoint); emptying one costs tens of
    milliseconds. So at the end of a block the database is reset instead of dropped and kept
    for the next block: every connection to it is terminated, every table is truncated (rows
    the migrations seeded, such as the schema version, are written back), every sequence is
    set back to where the migrations left it, and the planner statistics and activity counters
    are cleared, so plans and autovacuum start from the same point as in a new clone.

    A block that changed the schema (a table, index, function, trigger, column or database
    setting added, dropped or altered) hands back a database that cannot be reset: it is found
    by comparing a fingerprint of the catalog with the pristine one, and dropped. Ask for
    ``database(fresh=True)`` when a block needs a database no one used before for another
    reason; it is dropped at the end.

    Each block gets the database under a new name (a rename costs one catalog row), so a
    process that a test leaked and that reconnects by the old name is refused, as it would be
    by a dropped database, instead of writing into the next test's rows.

    ``url`` names the server as in :func:`fresh_database`. Not shared between processes; safe
    to use from several threads.
    """

    def __init__(self, url: str | None = None) -> None:
        from konduit.db.embedded import server_url

        self.admin_url = url or settings().test_database_url or server_url("postgres")
        self._free: list[str] = []
        self._lock = threading.Lock()
        self._pristine: _Pristine | None = None
        # One connection to the server's admin database for the renames, clones and drops
        # (a new connection costs 5-15 ms, and a test took three): under its own lock.
        self._admin_conn: Any = None
        self._admin_lock = threading.Lock()
        # What happened to the blocks: how many got a reset database, how many a new clone,
        # and why a database could not be reset (it was dropped instead).
        self.reused = 0
        self.created = 0
        self.not_reset: list[str] = []

    @contextmanager
    def database(self, *, fresh: bool = False) -> Iterator[str]:
        """Yield the URL of a migrated, empty database; reset it for reuse at exit (``fresh``:
        a new one, dropped at exit)."""
        name = self._acquire(fresh)
        url = self._url(name)
        reusable = False
        try:
            yield url
            reusable = not fresh
        finally:
            if reusable and self._reset(name):
                with self._lock:
                    self._free.append(name)
            else:
                self._drop(name)

    def close(self) -> None:
        """Drop every database kept for reuse."""
        with self._lock:
            free, self._free = self._free, []
        for name in free:
            self._drop(name)
        with self._admin_lock:
            if self._admin_conn is not None:
                self._admin_conn.close()
                self._admin_conn = None

    # -- internals --------------------------------------------------------------------------

    def _admin(self, sql: str) -> None:
        """Run ``sql`` on the admin connection, connecting again (once) if the kept one
        broke (a server restarted since, an idle connection cut)."""
        import psycopg

        with self._admin_lock:
            for retry in (False, True):
                if self._admin_conn is None or self._admin_conn.closed:
                    self._admin_conn = psycopg.connect(self.admin_url, autocommit=True)
                try:
                    self._admin_conn.execute(sql)
                    return
                except psycopg.OperationalError:
                    if retry or not self._admin_conn.broken:
                        raise  # an error of the statement (e.g. ObjectInUse), not of the link
                    self._admin_conn.close()

    def _acquire(self, fresh: bool) -> str:
        import psycopg

        if fresh and self._pristine is None:
            # The first image is read from a clone of its own (then kept for reuse): a fresh
            # database is one no backend used before, whose statistics count from zero.
            spare = f"konduit_test_{os.getpid()}_{uuid.uuid4().hex[:12]}"
            self._admin(f'CREATE DATABASE "{spare}" TEMPLATE "{_template(self.admin_url)}"')
            self.created += 1
            with self._lock:
                if self._pristine is None:
                    self._pristine = _Pristine.read(self._url(spare))
                self._free.append(spare)
        name = f"konduit_test_{os.getpid()}_{uuid.uuid4().hex[:12]}"
        with self._lock:
            reused = None if fresh or not self._free else self._free.pop()
        if reused is not None:
            try:
                self._admin(f'ALTER DATABASE "{reused}" RENAME TO "{name}"')
                self.reused += 1
                return name
            except psycopg.errors.ObjectInUse:  # someone reconnected since the reset
                self._drop(reused)
        template = _template(self.admin_url)
        self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        self.created += 1
        with self._lock:
            if self._pristine is None:  # a new clone, untouched yet: what a reset restores
                self._pristine = _Pristine.read(self._url(name))
        return name

    def _reset(self, name: str) -> bool:
        """Empty ``name`` for the next block; False when it cannot be (then it is dropped)."""
        import psycopg

        pristine = self._pristine
        assert pristine is not None  # read from the first database handed out
        try:
            with psycopg.connect(self._url(name), autocommit=True) as conn:
                # Cut whatever the test left connected (from inside: one connection a reset).
                _terminate_others(conn, name)
                if _fingerprint(conn) != pristine.fingerprint:
                    self.not_reset.append(f"{name}: the schema changed")
                    return False
                # Nothing else is connected, so only a prepared transaction could hold a lock;
                # the fingerprint counts those, but a reset must never hang a test run.
                conn.execute("SET lock_timeout = '10s'")
                with conn.transaction():
                    pristine.restore(conn)
                conn.execute("SELECT pg_stat_reset()")
            return True
        except psycopg.Error as exc:  # whatever a test left behind that a reset cannot undo
            self.not_reset.append(f"{name}: {exc!r}")
            return False

    def _url(self, name: str) -> str:
        from konduit.db.embedded import with_database

        return with_database(self.admin_url, name)

    def _drop(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _terminate_others(conn: Any, name: str) -> None:
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_backend_pid()",
        (name,),
    )


# Everything a test could change in the schema of a database, as one hash; the user schemas
# only, so the server's own catalog churn does not count.
_FINGERPRINT = """
WITH user_namespaces AS (
    SELECT oid, nspname FROM pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
      AND nspname NOT LIKE 'pg_temp_%' AND nspname NOT LIKE 'pg_toast_temp_%'
)
SELECT md5(concat_ws('|',
    (SELECT string_agg(nspname, ',' ORDER BY nspname) FROM user_namespaces),
    (SELECT string_agg(format('%s.%s:%s:%s', n.nspname, c.relname, c.relkind, c.reloptions),
                       ',' ORDER BY n.nspname, c.relname)
       FROM pg_class c JOIN user_namespaces n ON n.oid = c.relnamespace),
    (SELECT string_agg(format('%s.%s:%s:%s:%s', c.relname, a.attname, a.atttypid, a.attnotnull,
                              pg_get_expr(d.adbin, d.adrelid)),
                       ',' ORDER BY c.relname, a.attnum)
       FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
       JOIN user_namespaces n ON n.oid = c.relnamespace
       LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
       WHERE a.attnum > 0 AND NOT a.attisdropped),
    (SELECT string_agg(format('%s.%s:%s', n.nspname, p.proname, md5(p.prosrc)),
                       ',' ORDER BY n.nspname, p.proname, md5(p.prosrc))
       FROM pg_proc p JOIN user_namespaces n ON n.oid = p.pronamespace),
    (SELECT string_agg(format('%s:%s:%s', t.tgrelid::regclass, t.tgname, t.tgenabled),
                       ',' ORDER BY t.tgname)
       FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
       JOIN user_namespaces n ON n.oid = c.relnamespace),
    (SELECT string_agg(format('%s:%s', conrelid::regclass, pg_get_constraintdef(oid)),
                       ',' ORDER BY conrelid::regclass::text, conname)
       FROM pg_constraint WHERE connamespace IN (SELECT oid FROM user_namespaces)),
    (SELECT string_agg(array_to_string(setconfig, ','), ';')
       FROM pg_db_role_setting
       WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())),
    (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()),
    (SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension)
))
"""


def _fingerprint(conn: Any) -> str:
    return str(conn.execute(_FINGERPRINT).fetchone()[0])


class _Pristine:
    """A database as the migrations leave it: its schema's fingerprint, its tables, the rows
    the migrations wrote (``COPY`` images) and where its sequences stand."""

    def __init__(self, fingerprint: str, tables: list[str], seeds: dict[str, tuple[str, bytes]],
                 sequences: list[tuple[str, int, bool]]) -> None:
        self.fingerprint = fingerprint
        self.tables = tables
        self.seeds = seeds
        self.sequences = sequences

    @classmethod
    def read(cls, url: str) -> _Pristine:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            tables = [
                str(name) for (name,) in conn.execute(
                    "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
                    " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
                    " AND n.nspname NOT LIKE 'pg_temp_%' AND n.nspname NOT LIKE 'pg_toast%'"
                    " ORDER BY 1"
                ).fetchall()
            ]
            seeds: dict[str, tuple[str, bytes]] = {}
            for table in tables:
                if conn.execute(f"SELECT EXISTS (SELECT FROM {table})").fetchone()[0]:  # type: ignore[index]
                    image = bytearray()
                    with conn.cursor().copy(f"COPY {table} TO STDOUT (FORMAT binary)") as copy:
                        for chunk in copy:
                            image += chunk
                    seeds[table] = (_digest(conn, table), bytes(image))
            sequences = [
                (str(name), int(value), bool(called)) for name, value, called in conn.execute(
                    "SELECT format('%I.%I', schemaname, sequencename),"
                    " coalesce(last_value, start_value), last_value IS NOT NULL FROM pg_sequences"
                    " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
                ).fetchall()
            ]
            return cls(_fingerprint(conn), tables, seeds, sequences)

    def restore(self, conn: Any) -> None:
        # Only the tables that hold anything: truncating costs a new file per table and index
        # (~20 ms each on a busy server), and a test writes a handful of the tables. A table
        # holds nothing when its main file is empty: every row, live or dead (a deleted row
        # leaves its dead version there, so it counts as written), has its version in the main
        # file, whatever it keeps in TOAST. Not pg_table_size: it counts the TOAST table's
        # index, whose metapage is never empty, so every table with a TOAST table counted as
        # written and each reset truncated ~40 tables an untouched database (800 ms).
        # The seeded tables are compared below and rewritten only when they changed.
        written = [
            str(name) for (name,) in conn.execute(
                "SELECT format('%%I.%%I', n.nspname, c.relname) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind IN ('r', 'p') AND format('%%I.%%I', n.nspname, c.relname) = ANY(%s)"
                " AND NOT (format('%%I.%%I', n.nspname, c.relname) = ANY(%s))"
                " AND pg_relation_size(c.oid, 'main') > 0",
                (self.tables, list(self.seeds)),
            ).fetchall()
        ]
        if written:
            conn.execute(f"TRUNCATE {', '.join(written)} RESTART IDENTITY CASCADE")
        for table, (digest, image) in self.seeds.items():
            if _digest(conn, table) != digest:
                conn.execute(f"TRUNCATE {table}")
                with conn.cursor().copy(f"COPY {table} FROM STDIN (FORMAT binary)") as copy:
                    copy.write(image)
        if self.sequences:
            names, values, called = zip(*self.sequences, strict=True)
            conn.execute(
                "SELECT setval(name::regclass, value, called)"
                " FROM unnest(%s::text[], %s::bigint[], %s::bool[]) AS s(name, value, called)",
                (list(names), list(values), list(called)),
            )
        # Statistics an ANALYZE (a test's, or autovacuum's) gathered on the old rows would steer
        # the next test's plans; a new clone has none. Needs a superuser, as the server of a
        # test suite usually has; without one the database is dropped instead.
        conn.execute(
            "DELETE FROM pg_statistic s USING pg_class c, pg_namespace n"
            " WHERE c.oid = s.starelid AND n.oid = c.relnamespace"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND n.nspname NOT LIKE 'pg_toast%'"
        )


def _digest(conn: Any, table: str) -> str:
    """The rows of ``table``, as one hash (for the few small tables the migrations seed)."""
    row = conn.execute(
        f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {table} t"
    ).fetchone()
    return str(row[0])


@contextmanager
def run(
    workflows: App | Iterable[Workflow],
    database_url: str | None = None,
    *,
    concurrency: int = 4,
    poll_interval: float = 0.1,
    clock: str = "real",
    auto_skip: bool = True,
    **worker_options: Any,
) -> Iterator[App]:
    """Yield an :class:`~konduit.App` for ``workflows`` (a list of workflows, or an App whose
    workflows to use) on a :func:`fresh_database`, with a worker running on a background thread.

    ``database_url`` names the server as in :func:`fresh_database`; the App you pass is not
    changed (its workflows are used on the fresh database). ``concurrency``, ``poll_interval``
    and any other keyword (``lease_seconds``, ``shutdown_grace``, ...) configure the worker.

    At the end of the block the worker is asked to stop and joined (running tasks get its
    ``shutdown_grace``, 10 s by default), the App is closed and the database dropped. If the
    worker thread died, or did not stop, :class:`TestWorkerError` is raised with the cause.

    ``clock="virtual"`` runs the block on a :class:`TestClock` (:func:`virtual_clock`): move it
    with ``konduit.testing.advance(app, "10m")``; with ``auto_skip`` (the default) it also skips
    ahead by itself to the next thing due whenever nothing runs or is ready to run.
    """
    if clock not in ("real", "virtual"):
        raise ValueError(f"clock must be 'real' or 'virtual' (got {clock!r})")
    with fresh_database(database_url) as url:
        if clock == "virtual":
            with virtual_clock(url, auto_skip=auto_skip) as moving, \
                    _run_on(workflows, url, concurrency, poll_interval, worker_options) as app:
                moving.app = app
                _clocks[id(app)] = moving
                try:
                    yield app
                finally:
                    _clocks.pop(id(app), None)
        else:
            with _run_on(workflows, url, concurrency, poll_interval, worker_options) as app:
                yield app


@contextmanager
def _run_on(workflows: App | Iterable[Workflow], url: str, concurrency: int,
            poll_interval: float, worker_options: dict[str, Any]) -> Iterator[App]:
    app = App([], database_url=url)
    if isinstance(workflows, App):
        app.registry = workflows.registry
        app.max_payload_bytes = workflows.max_payload_bytes
        app.payload_io = workflows.payload_io
        app.tracing = workflows.tracing
    else:
        for workflow in workflows:
            app.add(workflow)
    try:
        with worker_thread(
            app, concurrency=concurrency, poll_interval=poll_interval, **worker_options
        ):
            yield app
    finally:
        app.close()


@contextmanager
def worker_thread(
    app: App, *, concurrency: int = 4, poll_interval: float = 0.1, **worker_options: Any
) -> Iterator[WorkerThread]:
    """Run a worker of ``app`` on a background thread for the duration of the block (the
    worker of :func:`run`, for an App of your own on a database of your own). The block gets
    a :class:`WorkerThread`, to wait for the passes of the worker's background services.

    At the end of the block the worker is asked to stop and joined (running tasks get its
    ``shutdown_grace``, 10 s by default). If the worker thread died, or did not stop,
    :class:`TestWorkerError` is raised with the cause.
    """
    stop = threading.Event()
    errors: list[BaseException] = []
    handle = WorkerThread()

    def work() -> None:
        try:
            app.run_worker(
                concurrency=concurrency, stop_event=stop, poll_interval=poll_interval,
                on_worker=handle._built, **worker_options,
            )
        except BaseException as exc:  # raised in the test's thread at the end of the block
            errors.append(exc)
        finally:
            handle._ended.set()  # a waiter must not wait out its timeout for a dead worker

    thread = threading.Thread(target=work, name="konduit-testing-worker", daemon=True)
    thread.start()
    moving = _active_clock
    if moving is not None:
        moving._workers.append(handle)
    try:
        yield handle
    finally:
        if moving is not None:
            moving._workers.remove(handle)
        stop.set()
        grace = float(worker_options.get("shutdown_grace", 10.0))
        thread.join(timeout=grace + 30.0)
    if errors:
        raise TestWorkerError(f"the test worker died: {errors[0]!r}") from errors[0]
    if thread.is_alive():
        raise TestWorkerError(
            f"the test worker did not stop within {grace + 30.0:.0f}s of the end of the block;"
            f" {_where(thread, handle)}"
        )


def _where(thread: threading.Thread, handle: WorkerThread) -> str:
    """Where a worker thread that does not stop is: its thread's stack and its event loop's
    unfinished tasks (read from another thread: a best effort, for the error message)."""
    parts = []
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is not None:
        parts.append("its thread is at:\n" + "".join(traceback.format_stack(frame, limit=12)))
    loop = handle._loop
    if loop is not None:
        try:
            tasks = list(asyncio.all_tasks(loop))
        except RuntimeError:  # the loop's task set changed while read
            tasks = []
        for task in tasks:
            try:
                stack = task.get_stack(limit=3)
            except Exception:
                stack = []
            at = "; ".join(f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}"
                           for f in stack)
            parts.append(f"task {task.get_name()} at {at or '?'}")
    return "\n".join(parts) or "no stack found"


class WorkerThread:
    """The worker of a :func:`worker_thread` block, seen from the test's thread."""

    def __init__(self) -> None:
        self._worker: Worker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._ended = threading.Event()

    def _built(self, worker: Worker) -> None:
        self._worker = worker
        self._loop = asyncio.get_running_loop()  # called on the worker's loop, before it runs
        self._ready.set()

    def worker(self, timeout: float = 30.0) -> Worker:
        """The worker itself, once it is built (it may still be waiting for the database);
        :class:`TestWorkerError` if it is not within ``timeout``."""
        if not self._ready.wait(timeout) or self._worker is None:
            raise TestWorkerError(f"the test worker was not built within {timeout} s")
        return self._worker

    def wait_for_passes(self, service: str, n: int = 2, timeout: float = 30.0) -> int:
        """Block until the worker's ``service`` (one of its background services:
        ``"maintenance"``, ``"stalls"``, ``"repair"``, ``"alerts"``, ``"hedging"`` ...)
        completes ``n`` more passes; return its count of passes. ``n=2``, the default, makes
        sure one whole pass began after the call. :class:`TimeoutError` names the service."""
        if n < 1:
            raise ValueError(f"n must be at least 1 (got {n!r})")
        deadline = time.monotonic() + timeout
        passes = self.worker(timeout).passes
        goal = passes.count(service) + n
        # In slices: a worker that died sends no more passes, and must not cost the timeout.
        while not passes.reach(service, goal, min(0.5, max(0.0, deadline - time.monotonic()))):
            if self._ended.is_set():
                raise TestWorkerError(f"the test worker ended before {n} more {service!r} "
                                      f"passes (it did {passes.count(service) - goal + n})")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the {service!r} service completed "
                                   f"{passes.count(service) - goal + n} of {n} passes within "
                                   f"{timeout} s")
        return passes.count(service)

def wait_for_passes(worker: WorkerThread | Worker, service: str, n: int = 2,
                    timeout: float = 30.0) -> int:
    """Wait for ``n`` more completed passes of ``service`` of ``worker`` (a worker, or the
    :class:`WorkerThread` of a :func:`worker_thread` block): a test waits for the event
    it needs (the watchdog looked again) rather than sleeping for a guess."""
    if isinstance(worker, WorkerThread):
        return worker.wait_for_passes(service, n, timeout)
    return worker.passes.wait(service, n, timeout=timeout)


# -- the virtual clock ------------------------------------------------------------------------

_clocks: dict[int, TestClock] = {}  # id(App of a run() block) -> its clock
_active_clock: TestClock | None = None
_active_lock = threading.Lock()

SKIP_LOOK = 0.02
"""Seconds between two looks of the automatic skip at the database."""
SKIP_SETTLE = 3
"""Consecutive looks that must find nothing to do, and the same next moment, before a skip: a
start or a completion committing between two looks is seen by the next."""
SKIP_PAST = 0.1
"""Seconds past the next moment an automatic skip lands, as a real clock would be when its
worker looks: a moment is often computed from a transaction's start (``now()``) while what
takes it re-checks against the clock of its own statement, a few milliseconds later."""
OVERDUE = 30.0
"""Seconds something may stay overdue (a timer whose pass has not come yet) and still hold the
automatic skip back: see ``clock_next_due_if_idle``."""


class TestClock:
    """A virtual clock shared by a test database and the workers of this process.

    Its time is the real time plus an offset that only grows. :meth:`advance` moves it: in the
    database (``konduit_now()`` and its siblings read the offset, migration 0036) and in
    Python (the worker's deadlines, timers and schedule waits read the same clock), then
    wakes the workers of this process. What only proves a process alive (task leases, worker
    heartbeats, the leaders' terms) moves with it, as if renewed meanwhile: a handler running
    across a jump keeps its lease, and its deadline fires (a sync handler's thread is abandoned,
    as on the real clock).

    With ``auto_skip``, a background thread looks at the database every :data:`SKIP_LOOK`
    seconds and, when nothing runs or is ready to run and something comes due later (a timer,
    a deadline, a back-off, a schedule's tick, a wait's time limit, an automatic repair), moves
    the clock to that moment. A handler that is running holds the clock: its own deadline
    comes only by :meth:`advance`.

    Get one from :func:`virtual_clock`, or ``run(..., clock="virtual")`` and
    :func:`clock_of`. Workers in other processes follow the database's time but not the
    Python side's.
    """

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, url: str, *, auto_skip: bool = True) -> None:
        from konduit.core.clock import VirtualClock

        self.url = url
        self.app: App | None = None
        self.python = VirtualClock()
        self.auto_skip = auto_skip
        self._skips = 0
        self._workers: list[WorkerThread] = []
        self._lock = threading.Lock()  # one move at a time
        self._conn: _SyncDatabase | None = None
        self._stop = threading.Event()
        self._paused = 0
        self._skipper: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- reading ----------------------------------------------------------------------------

    @property
    def skips(self) -> int:
        """How many automatic skips moved the clock."""
        return self._skips

    @property
    def offset(self) -> float:
        """Seconds the clock is ahead of the real time."""
        return self.python.offset

    def now(self) -> datetime:
        """The current time on this clock (aware, UTC)."""
        return datetime.now(UTC) + timedelta(seconds=self.python.offset)

    # -- moving -----------------------------------------------------------------------------

    def advance(self, duration: Duration | timedelta) -> float:
        """Move the clock forward by ``duration`` (``"10m"``, seconds, a ``timedelta``) and wake
        the workers; returns the new offset in seconds."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else \
            parse_duration(duration, what="advance")
        if seconds < 0:
            raise ValueError(f"a clock only moves forward (asked to advance {duration!r})")
        with self._lock:
            return self._move(seconds)

    def advance_to(self, moment: datetime) -> float:
        """Move the clock forward to ``moment`` (aware); nothing when it is past already."""
        if moment.tzinfo is None:
            raise ValueError(f"advance_to needs an aware datetime (got {moment!r})")
        return self.advance(max(0.0, (moment - self.now()).total_seconds()))

    @contextmanager
    def paused(self) -> Iterator[TestClock]:
        """No automatic skip inside the block (:meth:`advance` still moves the clock): for a
        test that must act before the next thing due, such as answering a wait before its
        time limit."""
        with self._lock:
            self._paused += 1
        try:
            yield self
        finally:
            with self._lock:
                self._paused -= 1

    def _move(self, seconds: float) -> float:
        row = self._db.one("clock_advance_by", seconds=seconds)
        offset = float(row["offset_seconds"])
        # Python's clock follows the database's (the database first: a deadline the worker
        # sees pass is past for the statements it then runs).
        self.python.advance(max(0.0, offset - self.python.offset))
        for handle in list(self._workers):
            worker, loop = handle._worker, handle._loop
            if worker is None or loop is None:
                continue
            # The claim loop looks again (a back-off ended). The maintenance loop wakes by
            # itself: it sleeps on this clock, towards due times it read before the move (a
            # re-read now would miss them: what is due is no longer ahead), and a move past
            # its interval brings its full pass.
            try:
                loop.call_soon_threadsafe(worker._wake.set)
            except RuntimeError:  # its loop is closed: that worker ended
                pass
        return offset

    @property
    def _db(self) -> _SyncDatabase:
        if self._conn is None or self._conn.closed:
            self._conn = _SyncDatabase(self.url)
        return self._conn

    # -- the automatic skip -----------------------------------------------------------------

    def skip(self) -> bool:
        """One look: when nothing runs or is ready to run, move the clock to the next thing
        due and return True; otherwise False."""
        with self._lock:
            if self._paused:
                return False
            due = self._next_due()
            if due is None:
                return False
            seconds = due
            self._move(seconds)
            self._skips += 1
            return True

    def _next_due(self) -> float | None:
        """Seconds to the next thing due, or None when something can run now (or nothing is
        due ever)."""
        from konduit.engine.schedules import timing_of

        row = self._db.one("clock_next_due_if_idle", overdue_seconds=OVERDUE)
        busy, next_due, now = row["busy"], row["next_due"], row["now"]
        if busy:
            return None
        for schedule in self._db.all("schedule_list"):
            if schedule["paused"]:
                continue
            tick = timing_of(schedule).next_after(schedule["last_tick"])
            if tick is None:
                continue
            if tick <= now:
                if (now - tick).total_seconds() < OVERDUE:
                    return None  # a tick no round started yet
                tick = timing_of(schedule).next_after(now)
                if tick is None:
                    continue
            next_due = tick if next_due is None else min(next_due, tick)
        if next_due is None:
            return None
        return max(0.0, float((next_due - now).total_seconds())) + SKIP_PAST

    def _skip_loop(self) -> None:
        settled, last = 0, None
        while not self._stop.wait(SKIP_LOOK):
            try:
                with self._lock:
                    due = None if self._paused else self._next_due()
                    if due is None:
                        settled, last = 0, None
                        continue
                    moment = self.python.time() + due
                    if last is not None and abs(moment - last) > 0.05:
                        settled = 0  # the next moment changed: the state is still moving
                    last = moment
                    settled += 1
                    if settled < SKIP_SETTLE:
                        continue
                    self._move(due)
                    self._skips += 1
                    settled, last = 0, None
            except Exception as exc:  # a look failed: report at the end, keep looking
                self._error = exc
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

    # -- life -------------------------------------------------------------------------------

    def _start(self) -> None:
        from konduit.core import clock as core_clock

        self._db.run("clock_virtual_install")
        core_clock.install(self.python)
        if self.auto_skip:
            self._skipper = threading.Thread(target=self._skip_loop, daemon=True,
                                             name="konduit-testing-clock")
            self._skipper.start()

    def _end(self) -> None:
        from konduit.core import clock as core_clock

        self._stop.set()
        if self._skipper is not None:
            self._skipper.join(timeout=30.0)
        core_clock.install(None)
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _SyncDatabase:
    """One autocommit connection running the named queries (``konduit/db/sql``) from a test's
    thread: what the virtual clock needs of the database, without an event loop."""

    def __init__(self, url: str) -> None:
        import psycopg
        from psycopg.rows import dict_row

        self._conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)

    @property
    def closed(self) -> bool:
        return bool(self._conn.closed)

    def one(self, query: str, /, **params: Any) -> dict[str, Any]:
        from konduit.db.queries import q

        row = self._conn.execute(q(query), params or None).fetchone()
        assert row is not None, f"{query} returned no row"
        return dict(row)

    def all(self, query: str, /, **params: Any) -> list[dict[str, Any]]:
        from konduit.db.queries import q

        return [dict(r) for r in self._conn.execute(q(query), params or None).fetchall()]

    def run(self, query: str, /, **params: Any) -> None:
        from konduit.db.queries import q

        self._conn.execute(q(query), params or None)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> _SyncDatabase:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextmanager
def virtual_clock(database: str | App, *, auto_skip: bool = True) -> Iterator[TestClock]:
    """Run the block on a :class:`TestClock`: install it in the test database ``database`` (a
    URL, or an App on it) and in this process, yield it, and put the real clock back at the end
    (the database's functions as the migrations define them).

    Never on a production database: it replaces ``konduit_now()`` and its siblings there for
    every connection. One virtual clock per process at a time; workers started inside the
    block (:func:`worker_thread`) are woken at each move.
    """
    global _active_clock
    url = database.database_url if isinstance(database, App) else database
    if not url:
        raise ValueError("virtual_clock needs the URL of a test database (or an App on one)")
    moving = TestClock(url, auto_skip=auto_skip)
    with _active_lock:
        if _active_clock is not None:
            raise TestWorkerError("a virtual clock is running already in this process; "
                                  "one test at a time may run on a virtual clock")
        _active_clock = moving
    try:
        moving._start()
        yield moving
    finally:
        try:
            moving._end()
            with _SyncDatabase(url) as db:
                db.run("clock_virtual_remove")
        except Exception:  # a database the block dropped: nothing to put back
            pass
        finally:
            with _active_lock:
                _active_clock = None
    if moving._error is not None and not moving.skips:
        raise TestWorkerError(f"the virtual clock could not look at the database: "
                              f"{moving._error!r}") from moving._error


def clock_of(app: App) -> TestClock:
    """The :class:`TestClock` of a ``run(..., clock="virtual")`` block's App (or of the block
    of :func:`virtual_clock` running now)."""
    found = _clocks.get(id(app)) or _active_clock
    if found is None:
        raise TestWorkerError("no virtual clock: use konduit.testing.run(..., clock='virtual') "
                              "or konduit.testing.virtual_clock(...)")
    return found



def advance(app: App, duration: Duration | timedelta) -> float:
    """Move the virtual clock of ``app``'s ``run(..., clock="virtual")`` block forward by
    ``duration`` (``"10m"``, seconds, a ``timedelta``): timers, deadlines, back-offs,
    schedules and waits follow. Returns the clock's offset in seconds."""
    return clock_of(app).advance(duration)
