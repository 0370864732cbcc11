"""Where the reads that may be a little stale go: a streaming replica, within a lag bound.

A :class:`Reads` holds the primary :class:`~konduit.db.database.Database` and, when a
replica URL is configured (``KONDUIT_READ_DATABASE_URL``, ``App(read_database_url=)``), a
second pool on that replica. :meth:`Reads.call` gives each read the database it should run on:

- the replica while it answers and is at most ``max_lag`` seconds behind the primary;
- else the primary, and the change is logged once (not on every read) and counted.

The lag is measured at most once per ``check_every`` seconds (shared by every read in that
time), on a dedicated connection to the replica: the primary's current WAL position is read
first, then the replica says how many bytes of it it has not replayed yet and how old its
last replayed transaction is. Nothing left to replay is no lag (an idle primary writes nothing,
so the age of the last replayed transaction grows without any lag); otherwise the lag is that
age. A replica that does not answer is asked again only after ``retry_after`` seconds, so a
dead replica costs one connection attempt every few seconds, not one per read.

Which calls may read here is decided in two places: :class:`konduit.reads.ReadModel` reads the
pages' and the API's lists, details and stats on ``reads``, and :class:`konduit.engine.client.Client`
uses ``db`` for every write, every read inside a write's transaction and every read whose answer
a caller acts on (waiting for a finish, the answer of a start, the status a handle reads).

A replica read that fails because the replica went away or because replay kept cancelling it
(a conflict with recovery), or that does not find an execution (one started a moment ago may
not be replayed yet), is run again on the primary.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from konduit.db.database import Database, Row, Tx
from konduit.errors import (
    DatabaseConflict,
    DatabaseError,
    DatabaseUnavailable,
    ExecutionNotFound,
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
MEASURE_TIMEOUT = 2.0
"""Seconds a measurement (connecting included) may take before the replica counts as down."""

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


class Reads:
    """The database each read that may be stale runs on (see the module docstring)."""

    def __init__(self, primary: Database, replica_url: str | None = None, *,
                 max_lag: float = DEFAULT_MAX_LAG, pool_size: int = 4,
                 check_every: float = CHECK_EVERY, retry_after: float = RETRY_AFTER):
        self.primary = primary
        self.replica_url = replica_url
        self.max_lag = max_lag
        self.pool_size = pool_size
        self.check_every = check_every
        self.retry_after = retry_after
        self.fallbacks = 0
        """How many times reads went from the replica (or from the start) to the primary."""
        self.served = {PRIMARY: 0, REPLICA: 0}
        """Reads served by each database."""
        self.state = ReadState(PRIMARY, None, "replica not checked yet",
                               configured=replica_url is not None)
        self._replica: Database | None = None
        self._probe: psycopg.AsyncConnection[Row] | None = None
        self._next_check = 0.0
        self._decided = False
        self._lock = asyncio.Lock()

    @property
    def configured(self) -> bool:
        return self.replica_url is not None

    async def call(self, body: Callable[[Database], Awaitable[T]]) -> T:
        """``body`` on the replica when it may serve (see the module docstring), else, or when
        the replica fails it or does not find the execution, on the primary."""
        seen = _served.get()
        if (seen is None or not seen.pinned) and await self._use_replica():
            assert self._replica is not None
            try:
                result = await body(self._replica)
            except DatabaseUnavailable as exc:
                await self._down(f"replica unreachable: {exc}")
            except DatabaseConflict:
                pass  # cancelled by a replay conflict, again and again: the primary has none
            except ExecutionNotFound:
                # Maybe started a moment ago: the primary has it if anyone has.
                if seen is not None:
                    seen.pinned = True
            else:
                self._count(REPLICA)
                return result
        self._count(PRIMARY)
        return await body(self.primary)

    async def one(self, query: str, /, **params: Any) -> Row | None:
        return await self.call(lambda db: db.one(query, **params))

    async def all(self, query: str, /, **params: Any) -> list[Row]:
        return await self.call(lambda db: db.all(query, **params))

    async def current(self) -> ReadState:
        """Where reads go now (measuring the lag when the last measurement is stale)."""
        await self._use_replica()
        return self.state

    def _count(self, source: str) -> None:
        self.served[source] += 1
        seen = _served.get()
        if seen is not None:
            seen.sources.append(source)

    async def _use_replica(self) -> bool:
        if self.replica_url is None:
            return False
        if time.monotonic() >= self._next_check:
            async with self._lock:
                if time.monotonic() >= self._next_check:
                    await self._check()
        return self.state.source == REPLICA

    async def _check(self) -> None:
        # The primary first: an error there is the read's own (the primary would serve it).
        db = self.primary
        position = await db.one("replica_get_primary_wal_position")
        assert position is not None
        try:
            lag = await asyncio.wait_for(self._measure(str(position["lsn"])), MEASURE_TIMEOUT)
            if lag is not None and lag <= self.max_lag and self._replica is None:
                self._replica = await self._open_pool()
        except (TimeoutError, DatabaseError, psycopg.Error, OSError) as exc:
            why = "no answer" if isinstance(exc, TimeoutError) else str(exc).splitlines()[0]
            await self._down(f"replica unreachable: {why}")
            return
        self._next_check = time.monotonic() + self.check_every
        if lag is None or lag > self.max_lag:
            shown = "behind by an unknown time" if lag is None else f"{lag:.1f} s behind"
            self._decide(ReadState(PRIMARY, lag, f"replica {shown}, limit {self.max_lag:g} s"))
            return
        self._decide(ReadState(REPLICA, lag))

    async def _measure(self, primary_lsn: str) -> float | None:
        """The replica's lag in seconds behind the primary's WAL position ``primary_lsn``
        (None: it has replayed nothing it could date)."""
        if self._probe is None or self._probe.closed:
            assert self.replica_url is not None
            self._probe = await psycopg.AsyncConnection.connect(
                self.replica_url, autocommit=True, row_factory=dict_row,
                connect_timeout=max(1, round(MEASURE_TIMEOUT)),
                application_name="konduit-replica-lag", prepare_threshold=None)
        tx = Tx(self._probe)
        row = await tx.one("replica_get_replay_state", primary_lsn=primary_lsn)
        assert row is not None
        if not row["in_recovery"]:
            return 0.0  # promoted (or the primary itself): nothing to replay
        if (row["behind_bytes"] or 0.0) <= 0:
            return 0.0
        age = row["replay_age"]
        return None if age is None else max(0.0, float(age))

    async def _open_pool(self) -> Database:
        assert self.replica_url is not None
        db = Database(self.replica_url, min_size=0, max_size=self.pool_size,
                      name="konduit-reads", pool_timeout=MEASURE_TIMEOUT)
        try:
            await db.open(timeout=MEASURE_TIMEOUT)
        except BaseException:
            await db.close()
            raise
        return db

    async def _down(self, reason: str) -> None:
        self._next_check = time.monotonic() + self.retry_after
        self._decide(ReadState(PRIMARY, None, reason))
        probe, self._probe = self._probe, None
        if probe is not None:
            with suppress(psycopg.Error, OSError):
                await probe.close()

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
        replica, self._replica = self._replica, None
        probe, self._probe = self._probe, None
        if replica is not None:
            await replica.close()
        if probe is not None:
            await probe.close()
