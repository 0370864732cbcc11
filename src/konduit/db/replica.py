"""Where the reads that may be a little stale go: a streaming replica, within a lag bound.

A :class:`Reads` holds the primary :class:`~konduit.db.database.Database` and, when a
replica URL is configured (``KONDUIT_READ_DATABASE_URL``, ``App(read_database_url=)``), a
second pool on that replica. :meth:`Reads.call` gives each read the database it should run on:

- the replica while it answers and is at most ``max_lag`` seconds behind the primary;
- else the primary, and the change is logged once (not on every read) and counted.

The lag is measured at most once per ``check_every`` seconds, in the background (a read
waits for a measurement only while nothing is known yet, the first reads, and then for at most
half of ``timeout``), on a dedicated connection to the replica: the primary's current WAL
position is read first, then the replica says how many bytes of it it has not replayed yet and
how old its last replayed transaction is. Nothing left to replay is no lag (an idle primary
writes nothing, so the age of the last replayed transaction grows without any lag); otherwise
the lag is that age. A replica that does not answer is asked again only after ``retry_after``
seconds, in the background too: meanwhile every read goes straight to the primary.

A replica that stops answering without closing anything (stopped with SIGSTOP, a network that
drops its packets) costs a read at most ``timeout`` seconds (:data:`TIMEOUT`, 2 s), the first
one included. No TCP setting notices such a server while its kernel still acknowledges, and a
``statement_timeout`` cannot fire on a server that does not run, so the bound is kept on the
client: a measurement gets ``timeout`` seconds, connecting included; a read that has run for
half of it without an answer makes the replica answer a round trip (one for all the reads
waiting then) within the other half, and runs on if it does (a slow read on a live replica is
not cut short); if it does not, the replica is down, the sockets of its connections are shut
down (cancelling the wait instead would make the driver wait up to 10 s more for the server to
confirm the cancel) and the read runs on the primary.

Which calls may read here is decided in two places: :class:`konduit.reads.ReadModel` reads the
pages' and the API's lists, details and stats on ``reads``, and :class:`konduit.engine.client.Client`
uses ``db`` for every write, every read inside a write's transaction and every read whose answer
a caller acts on (waiting for a finish, the answer of a start, the status a handle reads).

A replica read that fails because the replica went away, did not answer, or had no free
connection, or because replay kept cancelling it (a conflict with recovery), or that does not
find an execution (one started a moment ago may not be replayed yet), is run again on the
primary: once, after the replica's run of it has ended or been cancelled (a read is a read, so
nothing is done twice; a write on a standby fails as read-only, and is raised).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from konduit.db.database import Database, Row, Tx, tcp_options
from konduit.db.sealing import PayloadIO
from konduit.errors import (
    DatabaseConflict,
    DatabaseError,
    DatabaseUnavailable,
    ExecutionNotFound,
    PoolExhausted,
)
from konduit.settings import default, settings, variable

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_MAX_LAG: float = default("read_max_lag")
"""Seconds a replica may trail the primary and still serve reads (``KONDUIT_READ_MAX_LAG``)."""
CHECK_EVERY = 1.0
"""Seconds a lag measurement is reused for."""
RETRY_AFTER = 5.0
"""Seconds before a replica that did not answer is tried again."""
TIMEOUT = 2.0
"""Seconds a replica that does not answer may cost a read: what a lag measurement may take
(connecting included) before the replica counts as down, and how long a read on it may go
without a sign of life (see :meth:`Reads._on_replica`)."""
CONNECT_TIMEOUT = 2
"""Seconds (whole, at least 2: libpq's floor) each attempt to connect to the replica may take."""
CUT_GRACE = 0.1
"""Seconds a replica's run of a read (or a probe) is given to end after its connection was cut,
before it is cancelled and left to end on its own."""

PRIMARY, REPLICA = "primary", "replica"


@dataclass
class Served:
    """The reads of one HTTP request (see :func:`recording`)."""

    sources: list[str] = field(default_factory=list)
    """Which database served each read."""
    pinned: bool = False
    """Set once the replica did not have an execution the primary had: the rest of the
    request reads the primary, so one page or answer is not half of each."""


_served: ContextVar[Served | None] = ContextVar("konduit_reads_served", default=None)


@contextmanager
def recording() -> Iterator[Served]:
    """Collect, for the block (one HTTP request), which database served each read."""
    seen = Served()
    token = _served.set(seen)
    try:
        yield seen
    finally:
        _served.reset(token)


def read_settings(url: str | None = None, max_lag: float | None = None
                  ) -> tuple[str | None, float]:
    """The replica URL and lag bound: the arguments, else ``KONDUIT_READ_DATABASE_URL`` and
    ``KONDUIT_READ_MAX_LAG`` (seconds), else no replica and :data:`DEFAULT_MAX_LAG`."""
    if max_lag is not None:
        _check_lag(max_lag, "read_max_lag")  # the argument's own error, whatever the variables say
    if url and max_lag is not None:
        return url, max_lag
    configured = settings()
    if max_lag is None:
        max_lag = _check_lag(configured.read_max_lag, variable("read_max_lag"))
    return url or configured.read_database_url or None, max_lag


def _check_lag(max_lag: float, what: str) -> float:
    if not (max_lag >= 0 and math.isfinite(max_lag)):
        raise DatabaseError(f"{what} must be a number of seconds >= 0, not {max_lag!r}")
    return max_lag


@dataclass(frozen=True)
class ReadState:
    """Where reads go now and why (what the dashboard, the API and the metrics show)."""

    source: str
    """``"replica"`` or ``"primary"``."""
    lag: float | None
    """The replica's last measured lag in seconds; None when unknown (not reachable)."""
    reason: str | None = None
    """Why the primary serves although a replica is configured."""
    configured: bool = True
    """Whether a replica is configured at all."""

    def describe(self) -> str:
        """One line: ``reads: replica, 0.2 s behind`` or ``reads: primary (replica 42 s
        behind, limit 10 s)``."""
        if not self.configured:
            return "reads: primary"
        if self.source == REPLICA:
            return f"reads: replica, {self.lag or 0.0:.1f} s behind"
        return f"reads: primary ({self.reason})"


class _NoAnswer(Exception):
    """The replica did not answer within its time."""


def _cut(conn: psycopg.AsyncConnection[Row]) -> None:
    """Shut down the socket under ``conn``, whose server does not answer: whatever waits on it
    fails at once, as on a lost connection. Cancelling the wait would not end it: the driver
    then asks the server to cancel the statement and waits for its answer (up to 10 s), which a
    server that answers nothing never gives."""
    try:
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, ValueError, psycopg.Error):
        pass  # closed already, or no socket to shut down here: a cancellation ends it then


def _drop(task: asyncio.Future[Any]) -> None:
    """Take the outcome of a task nobody waits for any more, so it is not reported as lost."""
    if not task.cancelled():
        task.exception()


async def _end(task: asyncio.Future[Any], grace: float) -> None:
    """Give ``task``, whose connections were just cut, ``grace`` seconds to end on its own, then
    cancel it; its outcome is dropped either way and nothing waits for it longer."""
    if not task.done():
        await asyncio.wait({task}, timeout=grace)
    if not task.done():
        task.cancel()
    task.add_done_callback(_drop)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


class Reads:
    """The database each read that may be stale runs on (see the module docstring)."""

    def __init__(self, primary: Database, replica_url: str | None = None, *,
                 max_lag: float = DEFAULT_MAX_LAG, pool_size: int = 4,
                 check_every: float = CHECK_EVERY, retry_after: float = RETRY_AFTER,
                 timeout: float = TIMEOUT):
        self.primary = primary
        self.replica_url = replica_url
        self.max_lag = max_lag
        self.pool_size = pool_size
        self.check_every = check_every
        self.retry_after = retry_after
        self.timeout = timeout
        """Seconds a replica that does not answer may cost a read (see :data:`TIMEOUT`)."""
        self.fallbacks = 0
        """How many times reads went from the replica (or from the start) to the primary."""
        self.served = {PRIMARY: 0, REPLICA: 0}
        """Reads served by each database."""
        self.state = ReadState(PRIMARY, None, "replica not checked yet",
                               configured=replica_url is not None)
        self._replica: Database | None = None
        self._connections: weakref.WeakSet[psycopg.AsyncConnection[Row]] = weakref.WeakSet()
        """Every connection the replica's pool opened (cut when the replica stops answering)."""
        self._probe: psycopg.AsyncConnection[Row] | None = None
        self._probe_lock = asyncio.Lock()
        self._probe_user: asyncio.Task[Any] | None = None
        self._down_at = -math.inf
        self._next_check = 0.0
        self._decided = False
        self._measuring: asyncio.Task[None] | None = None
        self._pinging: asyncio.Task[bool] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def configured(self) -> bool:
        return self.replica_url is not None

    async def call(self, body: Callable[[Database], Awaitable[T]]) -> T:
        """``body`` on the replica when it may serve (see the module docstring), else, or when
        the replica fails it, does not answer it in time or does not find the execution, on the
        primary: once, after the replica's run of it has ended. ``body`` only reads."""
        began = time.monotonic()
        seen = _served.get()
        if (seen is None or not seen.pinned) and await self._use_replica(began):
            replica = self._replica
            assert replica is not None
            try:
                result = await self._on_replica(body, replica, began)
            except _NoAnswer:
                pass  # the replica is down now (see _on_replica)
            except DatabaseUnavailable as exc:
                if replica is self._replica:  # not a pool already given up on meanwhile
                    self._down(f"replica unreachable: {_first_line(exc)}")
            except (DatabaseConflict, PoolExhausted):
                pass  # cancelled by replay conflicts, or its few connections busy: the primary's
            except ExecutionNotFound:
                # Maybe started a moment ago: the primary has it if anyone has.
                if seen is not None:
                    seen.pinned = True
            except DatabaseError:
                if replica is self._replica:
                    raise
                # Its pool was closed under it: the replica stopped answering meanwhile.
            else:
                self._count(REPLICA)
                return result
        self._count(PRIMARY)
        return await body(self.primary)

    @property
    def io(self) -> PayloadIO:
        """The codec and payload store of the reads (the primary's)."""
        return self.primary.io

    async def one(self, query: str, /, **params: Any) -> Row | None:
        return await self.call(lambda db: db.one(query, **params))

    async def all(self, query: str, /, **params: Any) -> list[Row]:
        return await self.call(lambda db: db.all(query, **params))

    async def current(self) -> ReadState:
        """Where reads go now, after a lag measurement when the last one is stale (waited for
        at most :attr:`timeout` seconds)."""
        if self.replica_url is not None:
            measuring = self._measure_if_due()
            if measuring is not None and not measuring.done():
                await asyncio.wait({measuring}, timeout=self.timeout)
        return self.state

    def _count(self, source: str) -> None:
        self.served[source] += 1
        seen = _served.get()
        if seen is not None:
            seen.sources.append(source)

    def _spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_drop)
        return task

    def _measure_if_due(self) -> asyncio.Task[None] | None:
        """The lag measurement under way, started now if the last one is stale."""
        if (time.monotonic() >= self._next_check
                and (self._measuring is None or self._measuring.done())):
            self._measuring = self._spawn(self._check())
        return self._measuring

    async def _use_replica(self, began: float) -> bool:
        """Whether the replica serves the read that began at ``began``. The lag is measured in
        the background: a read waits only when nothing is known yet (the first reads), and then
        for at most half the bound."""
        if self.replica_url is None:
            return False
        measuring = self._measure_if_due()
        if not self._decided and measuring is not None and not measuring.done():
            await asyncio.wait({measuring},
                               timeout=max(0.0, began + self.timeout / 2 - time.monotonic()))
        return self.state.source == REPLICA and self._replica is not None

    async def _on_replica(self, body: Callable[[Database], Awaitable[T]], replica: Database,
                          began: float) -> T:
        """``body`` on the replica, watched: once it has run for half the bound without an
        answer, the replica is asked for a round trip (one for every read waiting then); if
        that comes back within the other half the read is slow, not stuck, and runs on (watched
        again); if not, the replica is down, its connections are cut and :class:`_NoAnswer`
        is raised."""
        task = asyncio.ensure_future(body(replica))
        try:
            watch_until = began + self.timeout / 2
            while True:
                await asyncio.wait({task}, timeout=max(0.0, watch_until - time.monotonic()))
                if task.done():
                    return task.result()
                if not await self._answers():
                    break
                watch_until = time.monotonic() + self.timeout / 2
            if task.done() and not task.cancelled() and task.exception() is None:
                return task.result()  # it answered while the replica was being asked
            await _end(task, CUT_GRACE)  # its connection was cut: it fails now
            raise _NoAnswer
        finally:
            if not task.done():  # the caller was cancelled
                task.cancel()
                task.add_done_callback(_drop)

    async def _answers(self) -> bool:
        """Whether the replica answers a round trip within half the bound; callers asking
        meanwhile share one. No answer marks it down."""
        if self._pinging is None or self._pinging.done():
            self._pinging = self._spawn(self._ping())
        return await asyncio.shield(self._pinging)

    async def _ping(self) -> bool:
        try:
            await self._ask(self.timeout / 2 - CUT_GRACE, lambda tx: tx.one("replica_ping"))
        except _NoAnswer:
            self._down(f"replica unreachable: no answer within {self.timeout:g} s")
            return False
        except (DatabaseError, psycopg.Error, OSError) as exc:
            self._down(f"replica unreachable: {_first_line(exc)}")
            return False
        return True

    async def _check(self) -> None:
        """Measure the lag and decide where reads go (on a task of its own: never raises)."""
        began = time.monotonic()
        try:
            position = await self.primary.one("replica_get_primary_wal_position")
        except DatabaseError as exc:  # the reads meet it on the primary themselves
            log.debug("reading the primary's WAL position failed: %s", exc)
            self._next_check = time.monotonic() + self.check_every
            return
        assert position is not None
        try:
            lsn = str(position["lsn"])
            row = await self._ask(self.timeout, lambda tx: tx.one("replica_get_replay_state",
                                                                  primary_lsn=lsn))
            lag = _lag(row)
            if lag is not None and lag <= self.max_lag and self._replica is None:
                self._replica = await self._open_pool()
        except _NoAnswer:
            self._down(f"replica unreachable: no answer within {self.timeout:g} s")
            return
        except (DatabaseError, psycopg.Error, OSError) as exc:
            if self._down_at < began:  # else its connection was cut as the replica went down
                self._down(f"replica unreachable: {_first_line(exc)}")
            return
        self._next_check = time.monotonic() + self.check_every
        if lag is None or lag > self.max_lag:
            shown = "behind by an unknown time" if lag is None else f"{lag:.1f} s behind"
            self._decide(ReadState(PRIMARY, lag, f"replica {shown}, limit {self.max_lag:g} s"))
            return
        self._decide(ReadState(REPLICA, lag))

    async def _ask(self, within: float, question: Callable[[Tx], Awaitable[Row | None]]
                   ) -> Row | None:
        """``question`` on the replica's probe connection (opened first when there is none),
        answered within ``within`` seconds; else the connection is cut and :class:`_NoAnswer`
        raised."""
        task = asyncio.ensure_future(self._on_probe(question))
        try:
            await asyncio.wait({task}, timeout=within)
        except BaseException:  # cancelled (closing)
            task.cancel()
            task.add_done_callback(_drop)
            raise
        if task.done():
            return task.result()
        probe, self._probe = self._probe, None
        if probe is not None:
            _cut(probe)
            self._spawn(self._close_probe(probe, task))
        if self._probe_user is task:  # connecting or asking: ends once cut (or cancelled)
            await _end(task, CUT_GRACE)
        else:  # still waiting for the probe connection, which another ask holds (cut now)
            task.cancel()
            task.add_done_callback(_drop)
        raise _NoAnswer

    async def _on_probe(self, question: Callable[[Tx], Awaitable[Row | None]]) -> Row | None:
        async with self._probe_lock:
            self._probe_user = asyncio.current_task()
            try:
                if self._probe is None or self._probe.closed:
                    assert self.replica_url is not None
                    self._probe = await psycopg.AsyncConnection.connect(
                        self.replica_url, autocommit=True, row_factory=dict_row,
                        connect_timeout=CONNECT_TIMEOUT, **tcp_options(self.replica_url),
                        application_name="konduit-replica-lag", prepare_threshold=None)
                return await question(Tx(self._probe))
            finally:
                self._probe_user = None

    @staticmethod
    async def _close_probe(probe: psycopg.AsyncConnection[Row],
                           user: asyncio.Future[Any] | None = None) -> None:
        if user is not None and not user.done():
            await asyncio.wait({user})
        with suppress(psycopg.Error, OSError):
            await probe.close()

    async def _track(self, conn: psycopg.AsyncConnection[Row]) -> None:
        self._connections.add(conn)

    async def _open_pool(self) -> Database:
        assert self.replica_url is not None
        db = Database(self.replica_url, min_size=0, max_size=self.pool_size,
                      name="konduit-reads", pool_timeout=self.timeout,
                      connect_timeout=CONNECT_TIMEOUT, configure=self._track,
                      payloads=self.primary.io)
        try:
            await db.open(timeout=self.timeout)
        except BaseException:
            await db.close()
            raise
        return db

    def _down(self, reason: str) -> None:
        """The replica failed or did not answer: reads go to the primary at once, and it is
        measured again after :attr:`retry_after` seconds, in the background. Its connections
        are cut (whatever waits on them fails now) and its pool closed."""
        self._down_at = time.monotonic()
        self._next_check = self._down_at + self.retry_after
        self._decide(ReadState(PRIMARY, None, reason))
        replica, self._replica = self._replica, None
        connections, self._connections = list(self._connections), weakref.WeakSet()
        probe, self._probe = self._probe, None
        for conn in connections:
            _cut(conn)
        if probe is not None:
            _cut(probe)
            self._spawn(self._close_probe(probe))
        if replica is not None:
            self._spawn(replica.close())

    def _decide(self, state: ReadState) -> None:
        """Take ``state``; a change of database is logged and counted once, not per read."""
        before, self.state = self.state, state
        first, self._decided = not self._decided, True
        if not first and before.source == state.source:
            return
        if state.source == PRIMARY:
            self.fallbacks += 1
            log.warning("reads fall back to the primary: %s", state.reason)
        elif not first:
            log.info("reads go to the replica again (%.1f s behind)", state.lag or 0.0)

    async def close(self) -> None:
        running = [t for t in (self._measuring, self._pinging) if t is not None and not t.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=CUT_GRACE)
        replica, self._replica = self._replica, None
        probe, self._probe = self._probe, None
        if any(not t.done() for t in running):  # stuck on a replica that does not answer
            for conn in list(self._connections):
                _cut(conn)
            if probe is not None:
                _cut(probe)
        if self._background:
            await asyncio.wait(set(self._background), timeout=10.0)
        if replica is not None:
            await replica.close()
        if probe is not None:
            await self._close_probe(probe)


def _lag(row: Row | None) -> float | None:
    """The lag in seconds a replay state row says (None: it has replayed nothing it could
    date)."""
    assert row is not None
    if not row["in_recovery"]:
        return 0.0  # promoted (or the primary itself): nothing to replay
    if (row["behind_bytes"] or 0.0) <= 0:
        return 0.0
    age = row["replay_age"]
    return None if age is None else max(0.0, float(age))
