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
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from konduit.app import App
from konduit.core.workflow import Workflow
from konduit.errors import KonduitError

__all__ = ["TestWorkerError", "fresh_database", "run"]


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

    admin = url or os.environ.get("KONDUIT_TEST_DATABASE_URL") or server_url("postgres")
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


@contextmanager
def run(
    workflows: App | Iterable[Workflow],
    database_url: str | None = None,
    *,
    concurrency: int = 4,
    poll_interval: float = 0.1,
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
    """
    with fresh_database(database_url) as url:
        app = App([], database_url=url)
        if isinstance(workflows, App):
            app.registry = workflows.registry
            app.max_payload_bytes = workflows.max_payload_bytes
            app.tracing = workflows.tracing
        else:
            for workflow in workflows:
                app.add(workflow)

        stop = threading.Event()
        errors: list[BaseException] = []

        def work() -> None:
            try:
                app.run_worker(
                    concurrency=concurrency, stop_event=stop, poll_interval=poll_interval,
                    **worker_options,
                )
            except BaseException as exc:  # raised in the test's thread at the end of the block
                errors.append(exc)

        thread = threading.Thread(target=work, name="konduit-testing-worker", daemon=True)
        thread.start()
        try:
            yield app
        finally:
            stop.set()
            grace = float(worker_options.get("shutdown_grace", 10.0))
            thread.join(timeout=grace + 30.0)
            app.close()
            if errors:
                raise TestWorkerError(f"the test worker died: {errors[0]!r}") from errors[0]
            if thread.is_alive():
                raise TestWorkerError(
                    f"the test worker did not stop within {grace + 30.0:.0f}s of the end of the block"
                )
