"""A real PostgreSQL primary and a streaming standby of it, for the read-replica tests.

The primary is made with ``initdb`` (``wal_level=replica``; initdb's own pg_hba.conf lets
replication in from the local addresses), migrated, and copied with ``pg_basebackup -R``: the
copy starts as a hot standby that streams the primary's WAL. Both run under ``pg_ctl`` on free
ports, from the PostgreSQL 15 binaries of the system (``KONDUIT_PG_BINDIR`` to use others).
PostgreSQL refuses to run as root: as root both servers run as the ``postgres`` system user, in
a temporary directory it owns.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from konduit.db.database import Database
from konduit.db.migrate import migrate

BINDIR = Path(os.environ.get("KONDUIT_PG_BINDIR", "/usr/lib/postgresql/15/bin"))
TOOLS = ("initdb", "pg_ctl", "pg_basebackup", "postgres")


def missing() -> str | None:
    """Why a primary and a standby cannot be made here, or None."""
    absent = [t for t in TOOLS if not (BINDIR / t).exists()]
    if absent:
        return f"no PostgreSQL binaries in {BINDIR} ({', '.join(absent)} missing; set KONDUIT_PG_BINDIR)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no postgres system user to run PostgreSQL as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    datadir: Path
    port: int
    run_as: str | None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str) -> None:
        _run([str(BINDIR / "pg_ctl"), "-D", str(self.datadir), "-l",
              str(self.datadir.parent / f"{self.datadir.name}.log"), "-w", "-t", "60", *args],
             self.run_as)

    def start(self) -> None:
        self.ctl("start")

    def stop(self) -> None:
        self.ctl("stop", "-m", "fast")

    def sql(self, statement: str) -> object:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(statement.encode())
            row = cursor.fetchone() if cursor.description is not None else None
            return None if row is None else row[0]


@dataclass
class Pair:
    primary: Server
    standby: Server

    def replayed(self) -> bool:
        """Whether the standby has replayed everything the primary wrote so far."""
        lsn = self.primary.sql("SELECT pg_current_wal_lsn()::text")
        return bool(self.standby.sql(
            f"SELECT pg_wal_lsn_diff('{lsn}'::pg_lsn, pg_last_wal_replay_lsn()) <= 0"))

    def wait_replayed(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.replayed():
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.05)

    @contextmanager
    def replay_paused(self) -> Iterator[None]:
        """The standby keeps receiving WAL but replays none of it in the block."""
        self.standby.sql("SELECT pg_wal_replay_pause()")
        try:
            yield
        finally:
            self.standby.sql("SELECT pg_wal_replay_resume()")

    @contextmanager
    def standby_stopped(self) -> Iterator[None]:
        self.standby.stop()
        try:
            yield
        finally:
            self.standby.start()
            self.wait_replayed()


def _run(cmd: list[str], run_as: str | None) -> None:
    done = subprocess.run(cmd, user=run_as, capture_output=True, text=True, timeout=120,
                          cwd="/")
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): "
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}")


async def _migrate(url: str) -> None:
    db = Database(url, max_size=1)
    await db.open()
    try:
        await migrate(db)
    finally:
        await db.close()


SETTINGS = """
listen_addresses = '127.0.0.1'
unix_socket_directories = '{sockets}'
wal_level = replica
max_wal_senders = 4
hot_standby = on
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 16MB
max_connections = 60
"""


@contextmanager
def primary_and_standby() -> Iterator[Pair]:
    """A migrated primary and a streaming hot standby of it, stopped and removed afterwards."""
    run_as = "postgres" if os.geteuid() == 0 else None
    # As root, under /tmp: a TMPDIR inside root's home would be closed to the postgres user.
    root = Path(tempfile.mkdtemp(prefix="konduit-replica-", dir="/tmp" if run_as else None))
    if run_as is not None:
        entry = pwd.getpwnam(run_as)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    primary = Server(root / "primary", _free_port(), run_as)
    standby = Server(root / "standby", _free_port(), run_as)
    started: list[Server] = []
    try:
        _run([str(BINDIR / "initdb"), "-D", str(primary.datadir), "-U", "postgres",
              "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"], run_as)
        with (primary.datadir / "postgresql.conf").open("a") as conf:
            conf.write(SETTINGS.format(sockets=root) + f"port = {primary.port}\n")
        primary.start()
        started.append(primary)
        asyncio.run(_migrate(primary.url))
        _run([str(BINDIR / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
              "-U", "postgres", "-D", str(standby.datadir), "-R", "-X", "stream",
              "--no-sync"], run_as)
        with (standby.datadir / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {standby.port}\n")
        standby.start()
        started.append(standby)
        pair = Pair(primary, standby)
        assert standby.sql("SELECT pg_is_in_recovery()") is True
        pair.wait_replayed()
        yield pair
    finally:
        for server in reversed(started):
            try:
                server.ctl("stop", "-m", "immediate")
            except RuntimeError:
                pass  # stopped already
        shutil.rmtree(root, ignore_errors=True)
