"""Shared fixtures: every storage test gets its own real PostgreSQL database.

The schema is migrated once per session into a template database; each test clones it
(``CREATE DATABASE ... TEMPLATE``), which takes milliseconds. The server is the embedded one by
default, or the one named by ``KONDUIT_TEST_DATABASE_URL`` (a URL whose database is used only to
create and drop the test databases).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

import konduit
from konduit.db.database import Database
from konduit.db.embedded import server_url, with_database
from konduit.db.migrate import migrate

pytest_plugins = ["tests.browser_support"]  # the browser fixture of the dashboard tests

_counter = itertools.count()


def _admin_url() -> str:
    return os.environ.get("KONDUIT_TEST_DATABASE_URL") or server_url("postgres")


@pytest.fixture(scope="session")
def admin_url() -> str:
    return _admin_url()


@pytest.fixture(scope="session")
def template_db(admin_url: str) -> Iterator[str]:
    name = f"konduit_tpl_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')

    async def go() -> None:
        db = Database(with_database(admin_url, name), min_size=1, max_size=2)
        await db.open()
        try:
            await migrate(db)
        finally:
            await db.close()

    asyncio.run(go())
    yield name
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(admin_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    name = f"konduit_t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield with_database(admin_url, name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_db_url(admin_url: str) -> Iterator[str]:
    """A database on the test server that was never migrated."""
    name = f"konduit_empty_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def make_app(db_url: str) -> Iterator[Callable[..., konduit.App]]:
    """Build Apps on this test's database; all are closed after the test."""
    apps: list[konduit.App] = []

    def make(*workflows: konduit.Workflow, **kwargs: object) -> konduit.App:
        app = konduit.App(list(workflows), database_url=db_url, **kwargs)  # type: ignore[arg-type]
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@contextmanager
def running_worker(app: konduit.App, concurrency: int = 8, **options: object) -> Iterator[None]:
    """Run a worker of ``app`` on a thread for the duration of the block."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            app.run_worker(concurrency=concurrency, stop_event=stop, **options)  # type: ignore[arg-type]
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)

    options.setdefault("poll_interval", 0.2)
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
    if errors:
        raise errors[0]


@pytest.fixture
def worker() -> Callable[..., object]:
    return running_worker
