"""One way to open the database, for the App, the CLI, the exporter and the dashboard.

The URL is the argument, else ``KONDUIT_DATABASE_URL``, else the embedded server (started on
demand). The embedded server is migrated automatically; a real server never is behind the
operator's back: its schema must already be current (``konduit db migrate``).

A client fails fast when the server does not answer (one direct connection attempt, not the
pool's half-minute of retries); a worker passes ``wait`` to ride out an outage at start.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time

import psycopg

from konduit.db.database import Database, is_embedded, resolve_url, translate_errors
from konduit.db.migrate import ensure_current, migrate
from konduit.errors import DatabaseError, DatabaseUnavailable

log = logging.getLogger("konduit.db")

FIRST_RETRY = 0.5
"""Seconds before the first retry; doubled after each failure up to :data:`MAX_RETRY`."""
MAX_RETRY = 5.0
"""Longest pause between connection attempts: a worker waiting out an outage comes up at most
this long after the server does."""


# A server that answered and said no (bad password, no such database or role): not retried.
# Everything else (refused, timed out, starting up, shutting down, out of connection slots) is
# the server being unavailable, which is worth waiting out. libpq reports a failed login without
# a SQLSTATE, so its message is what tells.
_REFUSED_FOR_GOOD = {"28", "3D"}  # SQLSTATE classes: authorization, invalid catalog name
_REFUSED_MESSAGE = re.compile(
    r"FATAL:.*(does not exist|authentication failed|no pg_hba\.conf entry|permission denied)")


def _refused_for_good(exc: psycopg.Error) -> bool:
    if exc.sqlstate:
        return exc.sqlstate[:2] in _REFUSED_FOR_GOOD
    return bool(_REFUSED_MESSAGE.search(str(exc)))


def describe_url(url: str | None) -> str:
    """Where a URL points, without its password (for messages and logs)."""
    if not url:
        return "the embedded PostgreSQL server"
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except Exception:
        return "the configured database"
    host = str(params.get("host") or "localhost")
    port = str(params.get("port") or "5432")
    name = str(params.get("dbname") or params.get("user") or "?")
    if host.startswith("/"):
        return f"database {name} (socket in {host})"
    return f"database {name} on {host}:{port}"


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


async def open_database(
    url: str | None = None,
    *,
    max_size: int = 10,
    min_size: int = 1,
    name: str = "konduit",
    migrate_embedded: bool = True,
    check_schema: bool = True,
    wait: float | None = 0.0,
    connect_timeout: float = 5.0,
    schema_hint: str = "konduit db migrate",
) -> Database:
    """Open a pool on ``url`` (else ``KONDUIT_DATABASE_URL``, else the embedded server), ready
    for konduit's queries.

    The embedded server is migrated (unless ``migrate_embedded`` is false); on a real server,
    ``check_schema`` raises :class:`~konduit.errors.SchemaOutdated` naming ``schema_hint`` when
    the schema is older than this konduit needs.

    ``wait`` is how long to keep trying while the server does not answer: ``0`` (the default)
    tries once and raises :class:`~konduit.errors.DatabaseUnavailable` at once, a number of
    seconds retries with backoff for that long, ``None`` retries until the server answers (cancel
    the awaiting task to give up). Each failed attempt is logged at WARNING, naming the database
    without its password. Only an unreachable server is retried: a rejected login, a missing
    database or an outdated schema is raised at once.
    """
    embedded = is_embedded(url)
    deadline = None if wait is None else time.monotonic() + max(0.0, wait)
    backoff = FIRST_RETRY
    while True:
        try:
            return await _open_once(url, embedded, max_size=max_size, min_size=min_size,
                                    name=name, migrate_embedded=migrate_embedded,
                                    check_schema=check_schema, connect_timeout=connect_timeout,
                                    schema_hint=schema_hint)
        except DatabaseUnavailable as exc:
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise
            pause = min(backoff, remaining)
            log.warning("%s; retrying in %.1f s", exc, pause)
            await asyncio.sleep(pause)
            backoff = min(backoff * 2, MAX_RETRY)


async def _open_once(url: str | None, embedded: bool, *, max_size: int, min_size: int,
                     name: str, migrate_embedded: bool, check_schema: bool,
                     connect_timeout: float, schema_hint: str) -> Database:
    # resolve_url starts the embedded server when it is the one: blocking, so off the loop.
    target = await asyncio.to_thread(resolve_url, url) if embedded else resolve_url(url)
    where = describe_url(None if embedded else target)
    try:
        # One direct connection first: a server that is down fails now, in one line, instead of
        # after the pool's own retries (and the pool does not start with a backlog of them).
        conn = await psycopg.AsyncConnection.connect(
            target, connect_timeout=max(1, round(connect_timeout)), application_name=name)
        await conn.close()
    except psycopg.Error as exc:
        message = f"cannot connect to {where}: {_one_line(str(exc))}"
        if _refused_for_good(exc):
            raise DatabaseError(message) from exc  # waiting would not change the answer
        raise DatabaseUnavailable(message) from exc
    db = Database(target, min_size=min_size, max_size=max_size, name=name)
    try:
        with translate_errors():
            await db.open(timeout=max(connect_timeout, 1.0))
        if embedded and migrate_embedded:
            await migrate(db)
        elif check_schema:
            await ensure_current(db, command_hint=schema_hint)
    except BaseException:
        await db.close()
        raise
    return db
