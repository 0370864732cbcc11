"""The one narrow boundary between konduit and the driver.

Queries are called by name (see :mod:`konduit.db.queries`). Driver errors leave this module as
a :class:`~konduit.errors.DatabaseError` that says what happened, with the driver's original in
``__cause__``:

- :class:`~konduit.errors.DatabaseUnavailable`: the server cannot be reached (connection
  refused or lost, shutting down, not accepting connections, no connection slot left);
- :class:`~konduit.errors.DatabaseConflict`: a transient conflict between transactions
  (deadlock, serialization failure, lock not available) that retrying did not clear;
- :class:`~konduit.errors.PoolExhausted`: the server answers but every pooled connection stayed
  in use for the pool's whole timeout;
- :class:`~konduit.errors.DatabaseError`: anything else.

:meth:`Database.one`, :meth:`Database.all`, :meth:`Database.run` and :meth:`Database.atomic`
rerun their transaction on a conflict, a few times with a short jittered pause, before raising
it: a conflict is resolved by PostgreSQL aborting one side, which then simply goes again.

Behind PgBouncer in transaction pooling mode (``pooled=True``) consecutive transactions of one
pooled connection may run on different server connections, so no session state may outlive a
transaction: konduit sets none (no ``SET``, no session advisory lock; the migration lock is
``pg_advisory_xact_lock``), and psycopg's automatic prepared statements are turned off, since a
statement prepared on one server connection is missing (or already present) on the next.
LISTEN/NOTIFY is session state too: :meth:`Database.listen_connection` opens ``direct_url``,
a connection straight to PostgreSQL, when one is configured.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import select
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.generators import send as send_all
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from konduit.db.arrays import with_array_literals
from konduit.db.queries import custom_plans, pinned_plans, q, sealed_texts, statement
from konduit.db.sealing import PLAIN, PayloadIO
from konduit.errors import DatabaseConflict, DatabaseError, DatabaseUnavailable, PoolExhausted
from konduit.settings import settings

log = logging.getLogger(__name__)

Row = dict[str, Any]
T = TypeVar("T")

CONFLICT_ATTEMPTS = 5
"""How many times a transaction runs before a conflict it keeps meeting is raised."""

PROBE_TIMEOUT = 2.0
"""Seconds a direct connection attempt may take when the pool timed out, to tell a server that
does not answer from a pool that is too small."""

IDLE_CHECK_AFTER = 2.0
"""Seconds a pooled connection may sit idle and still be handed out unchecked. A busy worker
reuses its connections within milliseconds and pays no check round trip; one idle longer (and
any whose socket has something to read, such as the FATAL a stopping server sends) is checked
with an empty query first, so a server restart is noticed before the connection is used."""

RECONNECT_MAX_DELAY = 1.0
"""Longest pause, in seconds, between the pool's attempts to replace a lost connection. The
driver's pool doubles its pause after each failure (1, 2, 4, 8 s...): after a failover that
took 5 s it would come back up to 3 s after the new primary, after one of 8 s up to 7 s. A
refused connection costs next to nothing, so trying every second is cheap."""

TCP_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
"""TCP settings of every connection, unless the URL sets them: a primary whose machine vanished
(no RST, no FIN) is noticed within about 30 s instead of the operating system's ~15 minutes of
retransmissions, so a query waiting on it fails and the worker reconnects to the new primary."""


def tcp_options(url: str) -> dict[str, Any]:
    """The :data:`TCP_DEFAULTS` that ``url`` does not set itself."""
    try:
        given = conninfo_to_dict(url)
    except psycopg.Error:
        given = {}
    return {key: value for key, value in TCP_DEFAULTS.items() if key not in given}


class _CappedBackoff(AttemptWithBackoff):
    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_MAX_DELAY)


class _Pool(AsyncConnectionPool[psycopg.AsyncConnection[Row]]):
    """The driver's pool, reconnecting at most :data:`RECONNECT_MAX_DELAY` apart. The pool
    takes no option for its backoff, so the first attempt of each reconnection is given a
    capped one (the pool passes the same object on to the later attempts)."""

    async def _add_connection(self, attempt: AttemptWithBackoff | None,
                              growing: bool = False) -> None:
        await super()._add_connection(
            attempt or _CappedBackoff(timeout=self.reconnect_timeout), growing=growing)


# The override relies on the pool's private method as psycopg-pool 3.2 and 3.3 have it; a pool
# that changed it is used as it is (slower to reconnect, never broken).
_POOL: type[AsyncConnectionPool[psycopg.AsyncConnection[Row]]] = (
    _Pool if list(inspect.signature(AsyncConnectionPool._add_connection).parameters)
    == ["self", "attempt", "growing"] else AsyncConnectionPool)

# SQLSTATEs of transient conflicts: PostgreSQL aborted this transaction so another could go on.
_CONFLICTS = {
    "40P01": "deadlock",
    "40001": "serialization failure",
    "55P03": "lock not available",
}
# SQLSTATEs of a server that is there but cannot serve us now (class 08, connection exceptions,
# is matched by prefix). Errors raised without a SQLSTATE come from the client side: the
# connection was refused, timed out or was lost.
_UNREACHABLE = {
    "57P01": "server shutting down",  # admin_shutdown
    "57P02": "server crashed",  # crash_shutdown
    "57P03": "server not accepting connections yet",  # cannot_connect_now
    "53300": "no connection slot left on the server",  # too_many_connections
}


def resolve_url(url: str | None = None) -> str:
    """The database URL: the argument, else ``KONDUIT_DATABASE_URL``, else the embedded server."""
    url = url or settings().database_url or None
    if url:
        return url
    from konduit.db.embedded import server_url

    return server_url()


def is_embedded(url: str | None) -> bool:
    return not (url or settings().database_url)


def _text(exc: BaseException) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def translated(exc: psycopg.Error) -> DatabaseError:
    """The konduit error that tells the truth about a driver error (raise it ``from exc``)."""
    state = exc.sqlstate
    if state in _CONFLICTS:
        return DatabaseConflict(f"database conflict ({_CONFLICTS[state]}, {state}): {_text(exc)}")
    if isinstance(exc, PoolClosed):
        return DatabaseError(f"database error: the connection pool is closed: {_text(exc)}")
    if isinstance(exc, PoolTimeout):
        # Only Database.open gets here (a pool that could not fill up in time); a caller waiting
        # for a pooled connection is told PoolExhausted or DatabaseUnavailable by Database.
        return DatabaseUnavailable(f"database unavailable: {_text(exc)}")
    if isinstance(exc, psycopg.OperationalError) and (
        state is None or state.startswith("08") or state in _UNREACHABLE
    ):
        why = _UNREACHABLE.get(state or "")
        return DatabaseUnavailable(
            f"database unavailable{f' ({why}, {state})' if why else ''}: {_text(exc)}"
        )
    return DatabaseError(f"database error{f' ({state})' if state else ''}: {_text(exc)}")


@contextmanager
def translate_errors() -> Iterator[None]:
    """Raise driver errors met in the block as konduit errors (see the module docstring)."""
    try:
        yield
    except psycopg.Error as exc:
        raise translated(exc) from exc


def _has_input(conn: psycopg.AsyncConnection[Row]) -> bool:
    """Whether an idle connection's socket is readable (or unusable): an idle session is sent
    nothing unless the server is closing it (a FATAL, then EOF), so no round trip is needed to
    see that."""
    try:
        fd = conn.fileno()
        if hasattr(select, "poll"):  # no FD_SETSIZE limit, unlike select()
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
            return bool(poller.poll(0))
        readable, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


def _pause(attempt: int) -> float:
    """Jittered, growing pause before rerunning a conflicted transaction: 10-20 ms, then twice
    as long each time, so the two sides of a deadlock do not collide again in step."""
    return random.uniform(0.5, 1.0) * min(0.5, 0.02 * 2.0 ** (attempt - 1))


async def _rerun_on_conflict(run: Callable[[], Awaitable[T]], attempts: int, what: str) -> T:
    """``run()``, run again after a jittered pause while PostgreSQL aborts it for a conflict
    (deadlock, serialization failure, lock not available), up to ``attempts`` times in all;
    then the DatabaseConflict, saying how many attempts met it."""
    attempt = 1
    while True:
        try:
            return await run()
        except DatabaseConflict as exc:
            if attempt >= attempts:
                if attempts > 1:
                    raise DatabaseConflict(
                        f"{exc} (still conflicting after {attempts} attempts)"
                    ) from exc.__cause__
                raise
            pause = _pause(attempt)
            log.debug("%s; running %s again in %.0f ms", exc, what, pause * 1000)
            attempt += 1
            await asyncio.sleep(pause)


def open_payloads(conn: psycopg.AsyncConnection[Any], io: PayloadIO) -> None:
    """Read every ``jsonb`` value of ``conn`` through ``io.loads``: each envelope in it is
    opened where this process holds the codec's keys (and the store)."""
    from psycopg.types.json import JsonbBinaryLoader, JsonbLoader

    class Opening(JsonbLoader):
        def load(self, data: Any) -> Any:
            return io.loads(data)

    class OpeningBinary(JsonbBinaryLoader):
        def load(self, data: Any) -> Any:
            data = bytes(data)
            if data and data[0] != 1:
                raise psycopg.DataError(f"unknown jsonb binary format: {data[0]}")
            return io.loads(data[1:])

    conn.adapters.register_loader("jsonb", Opening)
    conn.adapters.register_loader("jsonb", OpeningBinary)


def open_texts(conn: psycopg.AsyncConnection[Any], io: PayloadIO) -> None:
    """Read every ``text`` value of ``conn`` through ``io.open_text``: an error text sealed
    under a codec (a statement's ``-- sealed:`` parameter) is opened, or reads ``encrypted
    (key k1)`` where this process cannot open it. On every connection, with a codec or not: a
    process without one must not show the envelope as the text."""
    from psycopg.types.string import TextBinaryLoader, TextLoader

    def opening(text: str | bytes) -> Any:
        return io.open_text(text) if type(text) is str else text

    class Opening(TextLoader):
        def load(self, data: Any) -> Any:
            return opening(super().load(data))

    class OpeningBinary(TextBinaryLoader):
        def load(self, data: Any) -> Any:
            return opening(super().load(data))

    conn.adapters.register_loader("text", Opening)
    conn.adapters.register_loader("text", OpeningBinary)


class Tx:
    """Named-query calls inside one transaction.

    Each call translates driver errors as :func:`translate_errors` does, written out (a
    generator-based ``with`` per statement is several calls on the hot path), and looks its
    statement up once (:func:`~konduit.db.queries.statement`).

    In a pipelined transaction (``Database.transaction(pipeline=True)``) statements go to the
    server without waiting for each other's answers: :meth:`send` (a write whose result nobody
    reads) and :meth:`later` (rows fetched when awaited) queue a statement, and the next call that
    needs an answer (:meth:`one`, :meth:`all`, :meth:`run`, a fetch) sends everything queued in
    one round trip. The server still runs them one after the other, in the order sent, so a
    statement queued after a lock runs only once the lock is held. An error in a queued statement
    surfaces at that next call, and fails the transaction as a whole."""

    def __init__(self, conn: psycopg.AsyncConnection[Row],
                 pipeline: psycopg.AsyncPipeline | None = None, io: PayloadIO = PLAIN,
                 atomic: bool = True):
        self.conn = conn
        self.atomic = atomic
        """A transaction (False: each statement its own, autocommit)."""
        self.pipeline = pipeline
        self.io = io
        """The codec and payload store its parameters are sealed with (konduit.db.sealing)."""
        self.plan_pinned = False
        """Whether this transaction's planner settings are the pin's (task_claim_plan_pinned)."""

    async def _statement(self, query: str) -> tuple[str, bool | None]:
        """:func:`~konduit.db.queries.statement`, under the planner settings its kind asks for
        (konduit/db/queries.py): before the transaction's first ``-- plan: pinned`` statement
        the pin is sent (queued in a pipeline); before a ``-- plan: custom`` one in a pinned
        transaction, the settings go back to the session's. Outside a transaction a pinned
        statement is planned per run, never prepared (a pin would end with its own statement)."""
        if query in pinned_plans():
            if not self.atomic:
                return q(query), False
            if not self.plan_pinned:
                self.plan_pinned = True
                await self.send("task_claim_plan_pinned")  # queued in a pipeline
        elif self.plan_pinned and query in custom_plans():
            self.plan_pinned = False
            await self.send("task_claim_plan_unpinned")
        return statement(query)

    async def _sealed(self, query: str, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with their payloads sealed, and the texts ``query`` names on its
        ``-- sealed:`` line (off the event loop when one goes to the store or there is much for
        the codec: :meth:`PayloadIO.heavy`)."""
        io = self.io
        texts = sealed_texts(query)
        if io.heavy(params):
            return await asyncio.to_thread(io.sealed_params, params, texts)
        return io.sealed_params(params, texts)

    async def one(self, query: str, /, **params: Any) -> Row | None:
        sql, prepare = await self._statement(query)
        if self.io.active:
            params = await self._sealed(query, params)
        try:
            cur = await self.conn.execute(sql, with_array_literals(params), prepare=prepare)
            return await cur.fetchone()
        except psycopg.Error as exc:
            raise translated(exc) from exc

    async def all(self, query: str, /, **params: Any) -> list[Row]:
        sql, prepare = await self._statement(query)
        if self.io.active:
            params = await self._sealed(query, params)
        try:
            cur = await self.conn.execute(sql, with_array_literals(params), prepare=prepare)
            return await cur.fetchall()
        except psycopg.Error as exc:
            raise translated(exc) from exc

    async def run(self, query: str, /, **params: Any) -> int:
        sql, prepare = await self._statement(query)
        if self.io.active:
            params = await self._sealed(query, params)
        try:
            cur = await self.conn.execute(sql, with_array_literals(params), prepare=prepare)
            if self.pipeline is not None:
                # The count is only known once the answer is in.
                await synced(self.conn, self.pipeline)
            return cur.rowcount
        except psycopg.Error as exc:
            raise translated(exc) from exc

    async def send(self, query: str, /, **params: Any) -> None:
        """Run a statement whose result nobody reads (queued in a pipelined transaction)."""
        sql, prepare = await self._statement(query)
        if self.io.active:
            params = await self._sealed(query, params)
        try:
            await self.conn.execute(sql, with_array_literals(params), prepare=prepare)
        except psycopg.Error as exc:
            raise translated(exc) from exc

    async def later(self, query: str, /, **params: Any) -> Callable[[], Awaitable[list[Row]]]:
        """Send a statement now and return what fetches its rows (in a pipelined transaction
        the statement is queued, and awaiting the fetch sends it with whatever else is)."""
        sql, prepare = await self._statement(query)
        if self.io.active:
            params = await self._sealed(query, params)
        try:
            cur = await self.conn.execute(sql, with_array_literals(params), prepare=prepare)
        except psycopg.Error as exc:
            raise translated(exc) from exc

        async def rows() -> list[Row]:
            try:
                return await cur.fetchall()
            except psycopg.Error as exc:
                raise translated(exc) from exc

        return rows

    async def stream(self, query: str, /, *, page_rows: int,
                     **params: Any) -> AsyncIterator[list[Row]]:
        """The rows of a query, ``page_rows`` at a time, through a server-side cursor of this
        transaction: a result of any size in bounded memory. A pipelined transaction cannot
        hold a cursor (libpq): there the rows come in one result, handed out page by page."""
        if self.pipeline is not None:
            rows = await self.all(query, **params)
            for first in range(0, len(rows), page_rows):
                yield rows[first : first + page_rows]
            return
        with translate_errors():
            async with self.conn.cursor(name=f"konduit_{query}") as cur:
                if self.io.active:
                    params = await self._sealed(query, params)
                await cur.execute(q(query), with_array_literals(params))
                while rows := await cur.fetchmany(page_rows):
                    yield rows

    async def script(self, sql: str) -> None:
        """Run a whole migration file (several statements, no parameters)."""
        with translate_errors():
            await self.conn.execute(sql.encode())


async def synced(conn: psycopg.AsyncConnection[Any], pipeline: psycopg.AsyncPipeline) -> None:
    """``pipeline.sync()``, once what the statements queued so far left in the driver's output
    buffer is sent. psycopg hands each statement to libpq and writes what the socket takes at
    once; its sync then queues the Sync message, writes once more and waits for the answer. A
    statement of a few megabytes (a big map's items, a step's large output) can still be partly
    in the buffer by then: the server waits for the rest of it (ClientRead), the driver for the
    answer, forever. Sent here first (reading what the server answers meanwhile, so that neither
    side waits on a full socket), the sync's own few bytes go out with its first write."""
    if conn.pgconn.flush():  # 1: some of it is still in the buffer
        async with conn.lock:
            await conn.wait(send_all(conn.pgconn))
    await pipeline.sync()


@asynccontextmanager
async def _pipelined(conn: psycopg.AsyncConnection[Row],
                     queued: psycopg.AsyncPipeline) -> AsyncIterator[None]:
    """BEGIN ... COMMIT on an autocommit connection in pipeline mode, sent as plain statements:
    BEGIN goes out with the first statement and COMMIT with the last ones, in ONE round trip.
    (psycopg's own transaction block, in a pipeline, syncs the statements before it queues the
    COMMIT and syncs again: a round trip more per transaction.) On any error the statements
    queued so far are synced (an aborted pipeline must be before it takes more) and the
    transaction is rolled back; the error is raised as it was."""
    await conn.execute(b"BEGIN")
    try:
        yield
    except BaseException:
        try:
            try:
                await synced(conn, queued)
            except psycopg.Error:
                pass  # the error being raised, or one the failed transaction makes of it
            await conn.execute(b"ROLLBACK")
            await synced(conn, queued)
        except psycopg.Error as exc:
            # A broken connection: the pool discards it (or rolls it back when it comes back).
            log.debug("rolling back a pipelined transaction failed: %s", exc)
        raise
    await conn.execute(b"COMMIT")
    await synced(conn, queued)


class Database:
    """A pool of connections to one PostgreSQL database.

    ``pool_timeout`` is how long a caller waits for a free pooled connection before it is told
    :class:`~konduit.errors.PoolExhausted` (or :class:`~konduit.errors.DatabaseUnavailable` when
    the server does not answer), instead of hanging. ``connect_timeout`` bounds each attempt to
    open a connection; ``configure`` is called with each connection the pool opens, before it is
    used.
    """

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10,
                 name: str = "konduit", pool_timeout: float = 10.0,
                 direct_url: str | None = None, pooled: bool = False,
                 check_idle_after: float = IDLE_CHECK_AFTER, connect_timeout: int = 5,
                 configure: Callable[[psycopg.AsyncConnection[Row]], Awaitable[None]]
                 | None = None, payloads: PayloadIO = PLAIN):
        self.url = url
        self.io = payloads
        """The codec and payload store of every payload written and read here
        (:mod:`konduit.db.sealing`)."""
        self.direct_url = direct_url
        """A URL straight to the PostgreSQL server behind ``url`` (when ``url`` is a pooler):
        LISTEN and the worker heartbeat connect there."""
        self.pooled = pooled
        """``url`` goes through a transaction-pooling PgBouncer: no prepared statements on it."""
        self.name = name
        self.max_size = max_size
        self.pool_timeout = pool_timeout
        self.check_idle_after = check_idle_after
        self.checkouts = 0
        """Connections handed out by the pool (for measurements)."""
        self.checks = 0
        """Of those, how many were checked with a round trip first."""
        self._idle_since: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Row], float] = (
            weakref.WeakKeyDictionary())
        self._probing: asyncio.Future[str | None] | None = None
        self._probed_at = 0.0
        kwargs: dict[str, Any] = {
            "row_factory": dict_row,
            "application_name": name,
            # A single statement runs as its own implicit transaction: one round trip, where
            # BEGIN + statement + COMMIT cost three (an idle worker's claim poll, every one-off
            # read and write). Transactions of several statements say BEGIN themselves
            # (:meth:`transaction`).
            "autocommit": True,
            "connect_timeout": connect_timeout,
            **tcp_options(url),
        }
        if pooled:
            kwargs["prepare_threshold"] = None
        self._sweep: asyncio.Future[None] | None = None
        self.pool: AsyncConnectionPool[psycopg.AsyncConnection[Row]] = _POOL(
            url,
            min_size=min_size,
            max_size=max_size,
            open=False,
            kwargs=kwargs,
            configure=self._configure_with(configure),
            check=self._check,
            timeout=pool_timeout,
            reconnect_timeout=60,
        )

    def _configure_with(
        self, configure: Callable[[psycopg.AsyncConnection[Row]], Awaitable[None]] | None
    ) -> Callable[[psycopg.AsyncConnection[Row]], Awaitable[None]] | None:
        async def configured(conn: psycopg.AsyncConnection[Row]) -> None:
            open_texts(conn, self.io)
            if self.io.active:
                open_payloads(conn, self.io)
            if configure is not None:
                await configure(conn)

        return configured

    async def _check(self, conn: psycopg.AsyncConnection[Row]) -> None:
        """The pool's check at checkout: a round trip only for a connection that sat idle past
        ``check_idle_after`` (or was never handed out, or has input waiting)."""
        since = self._idle_since.pop(conn, None)
        self.checkouts += 1
        if (since is not None and time.monotonic() - since < self.check_idle_after
                and not _has_input(conn)):
            return
        self.checks += 1
        try:
            await AsyncConnectionPool.check_connection(conn)
        except Exception:
            self._lost()  # the others idle beside it likely share its fate: check them all now
            raise

    async def open(self, timeout: float = 10.0) -> None:
        try:
            await self.pool.open(wait=True, timeout=timeout)
        except PoolTimeout as exc:
            why = await self._probe()
            raise DatabaseUnavailable(
                f"cannot connect to the database: {why}" if why else
                f"cannot connect to the database: the pool did not open its first connections "
                f"within {timeout:g} s"
            ) from exc
        except psycopg.Error as exc:
            raise translated(exc) from exc
        except Exception as exc:
            raise DatabaseUnavailable(f"cannot connect to the database: {exc}") from exc

    async def close(self) -> None:
        if self._sweep is not None and not self._sweep.done():
            self._sweep.cancel()
            await asyncio.gather(self._sweep, return_exceptions=True)
        await self.pool.close()

    def _lost(self) -> None:
        """A connection was lost: check the idle ones now, in the background, so that those the
        same outage broke are replaced at once. Left in the pool, each would fail its check at
        checkout, and the pool pauses longer after each failed check (1, 2, 4 s...) before
        handing out the next: after a failover, the first caller would wait out the lot."""
        if self._sweep is None or self._sweep.done():
            self._sweep = asyncio.ensure_future(self._check_idle())

    async def _check_idle(self) -> None:
        try:
            await self.pool.check()
        except Exception as exc:  # the pool closing meanwhile: nothing to keep
            log.debug("checking idle connections failed: %s", exc)

    async def _probe(self) -> str | None:
        """Whether the server answers a fresh connection now: None if so, else why not. Callers
        that time out together share one attempt (and its answer for a second), so a stampede of
        timeouts does not open a connection each."""
        now = time.monotonic()
        if self._probing is None or (self._probing.done() and now - self._probed_at > 1.0):
            self._probed_at = now
            self._probing = asyncio.ensure_future(self._connect_once())
        return await asyncio.shield(self._probing)

    async def _connect_once(self) -> str | None:
        try:
            conn = await asyncio.wait_for(
                psycopg.AsyncConnection.connect(
                    self.url, connect_timeout=max(1, round(PROBE_TIMEOUT)),
                    application_name=f"{self.name}-probe",
                ),
                timeout=PROBE_TIMEOUT + 1.0,
            )
        except psycopg.Error as exc:
            return _text(exc)
        except TimeoutError:
            return f"the server did not answer within {PROBE_TIMEOUT:g} s"
        await conn.close()
        return None

    async def _timed_out(self, exc: PoolTimeout) -> DatabaseError:
        """Why no pooled connection came in time: the server is gone, or the pool is too small."""
        why = await self._probe()
        if why is not None:
            return DatabaseUnavailable(f"database unavailable: {why}")
        stats = self.pool.get_stats()
        if stats.get("pool_size", 0) < self.max_size:
            # The pool had room, so callers did not use it up: it could not open connections
            # (the server was down and is just back; the pool reconnects on its own schedule).
            return DatabaseUnavailable(
                f"database unavailable: no connection could be opened within "
                f"{self.pool_timeout:g} s (the server answers again; the pool is reconnecting)"
            )
        return PoolExhausted(
            f"no free connection in the {self.name!r} pool after {self.pool_timeout:g} s: all "
            f"{self.max_size} connections stayed in use although the server answers; raise the "
            f"pool size (max_size, App(pool_size=...)) or make fewer concurrent calls"
        )

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Row]]:
        """A pooled connection for the block (committed, or rolled back on error, on exit)."""
        task = asyncio.current_task()
        asked = 0 if task is None else task.cancelling()
        try:
            conn = await self.pool.getconn()
        except PoolTimeout as exc:
            raise await self._timed_out(exc) from exc
        except psycopg.Error as exc:
            raise translated(exc) from exc
        if task is not None and task.cancelling() > asked:
            # Cancelled while it waited for a free connection, and handed one at that moment:
            # the pool's wait (asyncio.wait_for, Python 3.11) then returns the connection and
            # the cancellation is lost. The caller would run on as if never cancelled (a
            # worker's loop that never stops); it is cancelled here, as it was asked to be.
            await self.pool.putconn(conn)
            raise asyncio.CancelledError
        try:
            with translate_errors():
                async with conn:  # what the pool's own connection() does: commit or roll back
                    yield conn
        except DatabaseUnavailable:
            self._lost()
            raise
        finally:
            self._idle_since[conn] = time.monotonic()
            await self.pool.putconn(conn)

    @asynccontextmanager
    async def transaction(self, *, pipeline: bool = False) -> AsyncIterator[Tx]:
        """One transaction, not retried: a conflict in it is raised as DatabaseConflict. With
        ``pipeline`` its statements may be queued (:class:`Tx`): BEGIN goes out with the first
        statement, and what nobody waits for goes out with the next one that is waited for."""
        async with self.connection() as conn:
            with translate_errors():
                if pipeline:
                    async with conn.pipeline() as queued, _pipelined(conn, queued):
                        yield Tx(conn, queued, self.io)
                else:
                    async with conn.transaction():
                        yield Tx(conn, io=self.io)

    async def atomic(self, body: Callable[[Tx], Awaitable[T]], *,
                     attempts: int = CONFLICT_ATTEMPTS, pipeline: bool = False) -> T:
        """Run ``body`` in a fresh transaction and return its result; when PostgreSQL aborts it
        for a conflict (deadlock, serialization failure, lock not available), roll back and run
        it again, up to ``attempts`` times in all, then raise the DatabaseConflict.

        The body must be safe to rerun: it does only database work through its ``Tx`` (whatever
        it wrote was rolled back with the conflict), and no side effects outside the database.
        """
        async def run() -> T:
            async with self.transaction(pipeline=pipeline) as tx:
                return await body(tx)

        return await _rerun_on_conflict(run, attempts, "the transaction")

    async def single(self, body: Callable[[Tx], Awaitable[T]], *,
                     attempts: int = CONFLICT_ATTEMPTS) -> T:
        """Run ``body``, which runs ONE statement, in autocommit: the statement is its own
        transaction (as atomic as BEGIN + statement + COMMIT, in one round trip instead of
        three). Rerun on a conflict as :meth:`atomic` does."""
        async def run() -> T:
            async with self.connection() as conn:
                return await body(Tx(conn, io=self.io, atomic=False))

        return await _rerun_on_conflict(run, attempts, "the statement")

    async def one(self, query: str, /, **params: Any) -> Row | None:
        """Run one named query as its own transaction (rerun on a conflict): its first row."""
        return await self.single(lambda tx: tx.one(query, **params))

    async def all(self, query: str, /, **params: Any) -> list[Row]:
        """Run one named query as its own transaction (rerun on a conflict): every row."""
        return await self.single(lambda tx: tx.all(query, **params))

    async def run(self, query: str, /, **params: Any) -> int:
        """Run one named query as its own transaction (rerun on a conflict): rows affected."""
        return await self.single(lambda tx: tx.run(query, **params))

    async def listen_connection(self) -> psycopg.AsyncConnection[Row]:
        """A dedicated autocommit connection outside the pool, for LISTEN and the worker's
        heartbeat: to ``direct_url`` when there is one (a transaction pooler would hand the
        LISTEN's server connection to someone else, and the notifications with it). Without
        one it goes through ``url``; behind a pooler LISTEN then hears nothing and the worker
        falls back to polling, but nothing breaks."""
        direct = self.direct_url is not None
        with translate_errors():
            return await psycopg.AsyncConnection.connect(
                self.direct_url or self.url,
                autocommit=True,
                row_factory=dict_row,
                application_name="konduit-listen",
                connect_timeout=5,
                **tcp_options(self.direct_url or self.url),
                prepare_threshold=None if self.pooled and not direct else 5,
            )
