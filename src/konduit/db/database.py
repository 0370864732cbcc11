"""The one narrow boundary between konduit and the driver.

Queries are called by name (see :mod:`konduit.db.queries`); driver errors leave this module as
:class:`~konduit.errors.DatabaseError` (or :class:`~konduit.errors.DatabaseUnavailable` when the
server cannot be reached) with the original in ``__cause__``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from konduit.db.queries import q
from konduit.errors import DatabaseError, DatabaseUnavailable

Row = dict[str, Any]


def resolve_url(url: str | None = None) -> str:
    """The database URL: the argument, else ``KONDUIT_DATABASE_URL``, else the embedded server."""
    url = url or os.environ.get("KONDUIT_DATABASE_URL") or None
    if url:
        return url
    from konduit.db.embedded import server_url

    return server_url()


def is_embedded(url: str | None) -> bool:
    return not (url or os.environ.get("KONDUIT_DATABASE_URL"))


@contextmanager
def translate_errors() -> Iterator[None]:
    try:
        yield
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"database unavailable: {exc}".strip()) from exc
    except psycopg.Error as exc:
        raise DatabaseError(f"database error: {exc}".strip()) from exc


class Tx:
    """Named-query calls inside one transaction."""

    def __init__(self, conn: psycopg.AsyncConnection[Row]):
        self.conn = conn

    async def one(self, query: str, /, **params: Any) -> Row | None:
        with translate_errors():
            cur = await self.conn.execute(q(query), params)
            return await cur.fetchone()

    async def all(self, query: str, /, **params: Any) -> list[Row]:
        with translate_errors():
            cur = await self.conn.execute(q(query), params)
            return await cur.fetchall()

    async def run(self, query: str, /, **params: Any) -> int:
        with translate_errors():
            cur = await self.conn.execute(q(query), params)
            return cur.rowcount

    async def script(self, sql: str) -> None:
        """Run a whole migration file (several statements, no parameters)."""
        with translate_errors():
            await self.conn.execute(sql.encode())


class Database:
    """A pool of connections to one PostgreSQL database."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10, name: str = "konduit"):
        self.url = url
        self.pool: AsyncConnectionPool[psycopg.AsyncConnection[Row]] = AsyncConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            open=False,
            kwargs={
                "row_factory": dict_row,
                "application_name": name,
                "autocommit": False,
                "connect_timeout": 5,
            },
            check=AsyncConnectionPool.check_connection,
            # A caller waits at most this long for a connection: when the server is down the
            # client raises DatabaseUnavailable instead of hanging (workers retry on their own).
            timeout=10.0,
            reconnect_timeout=60,
        )

    async def open(self, timeout: float = 10.0) -> None:
        with translate_errors():
            try:
                await self.pool.open(wait=True, timeout=timeout)
            except Exception as exc:
                if isinstance(exc, psycopg.Error):
                    raise
                raise DatabaseUnavailable(f"cannot connect to the database: {exc}") from exc

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        with translate_errors():
            async with self.pool.connection() as conn, conn.transaction():
                yield Tx(conn)

    async def one(self, query: str, /, **params: Any) -> Row | None:
        async with self.transaction() as tx:
            return await tx.one(query, **params)

    async def all(self, query: str, /, **params: Any) -> list[Row]:
        async with self.transaction() as tx:
            return await tx.all(query, **params)

    async def run(self, query: str, /, **params: Any) -> int:
        async with self.transaction() as tx:
            return await tx.run(query, **params)

    async def listen_connection(self) -> psycopg.AsyncConnection[Row]:
        """A dedicated autocommit connection for LISTEN (outside the pool)."""
        with translate_errors():
            return await psycopg.AsyncConnection.connect(
                self.url,
                autocommit=True,
                row_factory=dict_row,
                application_name="konduit-listen",
                connect_timeout=5,
            )
