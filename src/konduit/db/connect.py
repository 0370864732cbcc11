"""One way to open the database, for the App, the CLI, the exporter and the dashboard.

The URL is the argument, else ``KONDUIT_DATABASE_URL``, else the embedded server (started on
demand). The embedded server is migrated automatically; a real server never is behind the
operator's back: its schema must already be current (``konduit db migrate``).

A client fails fast when the server does not answer (one direct connection attempt, not the
pool's half-minute of retries); a worker passes ``wait`` to ride out an outage at start.

Behind PgBouncer in transaction pooling mode the URL is the pooler's and
``KONDUIT_DIRECT_DATABASE_URL`` (or ``direct_url=``) names the same server directly, for LISTEN
and the worker heartbeat (see :class:`~konduit.db.database.Database`). A direct URL also marks
the URL as pooled (no prepared statements), unless ``KONDUIT_DATABASE_POOLED=0`` says the
pooler keeps them (PgBouncer >= 1.21 with ``max_prepared_statements``);
``KONDUIT_DATABASE_POOLED=1`` marks a pooler without a direct URL (the worker then polls).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from typing import Any

import psycopg

from konduit.db.database import Database, is_embedded, resolve_url, translate_errors
from konduit.db.migrate import ensure_current, migrate
from konduit.db.sealing import PayloadIO
from konduit.db.sealing import configured as configured_payloads
from konduit.errors import DatabaseError, DatabaseUnavailable
from konduit.settings import settings

log = logging.getLogger(__name__)

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


# Which server and database a connection reached: through a pooler the query runs on the server
# behind it, so a direct URL can be checked to lead to the same place as the pooled one.
_IDENTITY = ("SELECT current_database() AS database, current_setting('port') AS port, "
             "pg_postmaster_start_time() AS started")

def pooled_setting(value: bool | None, direct_url: str | None) -> bool:
    """Whether the URL is a transaction pooler's (``KONDUIT_DATABASE_POOLED``, read by
    :mod:`konduit.settings`): yes or no when set, else yes exactly when a direct URL was given
    for it."""
    return direct_url is not None if value is None else value


async def _identity(url: str, *, connect_timeout: float, name: str) -> dict[str, Any]:
    conn = await psycopg.AsyncConnection.connect(
        url, connect_timeout=max(1, round(connect_timeout)), application_name=name,
        autocommit=True, prepare_threshold=None)
    try:
        cur = await conn.execute(_IDENTITY)
        row = await cur.fetchone()
        assert row is not None
        return {"database": row[0], "port": row[1], "started": row[2]}
    finally:
        await conn.close()


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
    direct_url: str | None = None,
    pooled: bool | None = None,
    payloads: PayloadIO | None = None,
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
    io = configured_payloads() if payloads is None else payloads
    embedded = is_embedded(url)
    deadline = None if wait is None else time.monotonic() + max(0.0, wait)
    backoff = FIRST_RETRY
    while True:
        try:
            return await _open_once(url, embedded, max_size=max_size, min_size=min_size,
                                    name=name, migrate_embedded=migrate_embedded,
                                    check_schema=check_schema, connect_timeout=connect_timeout,
                                    schema_hint=schema_hint, direct_url=direct_url,
                                    pooled=pooled, payloads=io)
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
                     connect_timeout: float, schema_hint: str, direct_url: str | None,
                     pooled: bool | None, payloads: PayloadIO) -> Database:
    # resolve_url starts the embedded server when it is the one: blocking, so off the loop.
    target = await asyncio.to_thread(resolve_url, url) if embedded else resolve_url(url)
    where = describe_url(None if embedded else target)
    given = direct_url is not None
    configured = settings()
    direct = None if embedded else (direct_url or configured.direct_database_url or None)
    if pooled is None:
        pooled = not embedded and pooled_setting(configured.database_pooled, direct)
    try:
        # One connection first: a server that is down fails now, in one line, instead of after
        # the pool's own retries (and the pool does not start with a backlog of them).
        identity = await _identity(target, connect_timeout=connect_timeout, name=name)
    except psycopg.Error as exc:
        message = f"cannot connect to {where}: {_one_line(str(exc))}"
        if _refused_for_good(exc):
            raise DatabaseError(message) from exc  # waiting would not change the answer
        raise DatabaseUnavailable(message) from exc
    if direct is not None:
        direct = await _checked_direct(direct, identity, where=where, given=given,
                                       connect_timeout=connect_timeout, name=name)
    db = Database(target, min_size=min_size, max_size=max_size, name=name, direct_url=direct,
                  pooled=pooled, payloads=payloads)
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


async def _checked_direct(direct: str, identity: dict[str, Any], *, where: str, given: bool,
                          connect_timeout: float, name: str) -> str | None:
    """The direct URL when it reaches the same server and database as the pooled one. A
    heartbeat sent elsewhere would let every lease of the worker lapse, so a direct URL that
    leads anywhere else is never used."""
    there = describe_url(direct)
    try:
        theirs = await _identity(direct, connect_timeout=connect_timeout, name=f"{name}-direct")
    except psycopg.Error as exc:
        problem = f"cannot connect to the direct URL ({there}): {_one_line(str(exc))}"
        if given:
            if _refused_for_good(exc):
                raise DatabaseError(problem) from exc
            raise DatabaseUnavailable(problem) from exc
    else:
        if theirs == identity:
            return direct
        problem = (f"the direct URL ({there}) leads to database {theirs['database']!r} of the "
                   f"server on port {theirs['port']} started {theirs['started']:%Y-%m-%d %H:%M:%S}, "
                   f"not to {where} (database {identity['database']!r} of the server on port "
                   f"{identity['port']} started {identity['started']:%Y-%m-%d %H:%M:%S})")
        if given:
            raise DatabaseError(problem)
    log.warning("KONDUIT_DIRECT_DATABASE_URL not used: %s; LISTEN goes through the pooled URL "
                "and workers poll", problem)
    return None
