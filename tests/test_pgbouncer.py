"""Workers behind PgBouncer in transaction pooling mode: how production fleets connect.

Each test starts Debian's ``pgbouncer`` (``pool_mode = transaction``, fewer server connections
than the worker has clients) on a free local port in front of this test's PostgreSQL, runs real
work through it and stops it. In transaction mode consecutive transactions of one client
connection run on whichever server connection is free, so anything that outlives a transaction
breaks: psycopg's automatic prepared statements ("prepared statement _pg3_0 already exists" on
PgBouncer < 1.21, which Debian 12 ships), session settings, session advisory locks, and LISTEN
(its notifications go to whichever client holds that server connection next: nobody).

Skipped, saying so, when ``pgbouncer`` is not installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import konduit
from konduit.db.connect import open_database
from konduit.db.migrate import latest_version
from konduit.errors import DatabaseError
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]

EXECUTIONS = 150
ITEMS = 4  # map fan-out per execution, beside two static branches: 7 branch tasks + root + join
SERVER_CONNECTIONS = 4

_BINARY = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")
_script = shutil.which("konduit", path=str(Path(sys.executable).parent)) or shutil.which("konduit")
KONDUIT = [_script] if _script else [sys.executable, "-m", "konduit.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """A pgbouncer process in transaction pooling mode in front of one PostgreSQL server."""

    def __init__(self, server_url: str, workdir: Path):
        target = conninfo_to_dict(server_url)
        self.host = str(target.get("host") or "127.0.0.1")
        self.server = {k: v for k, v in target.items()
                       if k in ("host", "port", "user", "password") and v}
        self.workdir = workdir
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str) -> str:
        """A URL for ``dbname`` through the pooler."""
        return make_conninfo(host="127.0.0.1", port=self.port, dbname=dbname,
                             user=str(self.server.get("user") or "postgres"))

    def admin(self, command: str) -> list[dict[str, Any]]:
        """A ``SHOW`` command on pgbouncer's admin console (simple query protocol only)."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True,
                             cursor_factory=psycopg.ClientCursor) as conn:
            cur = conn.execute(command)
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def start(self) -> None:
        server = " ".join(f"{k}={v}" for k, v in self.server.items())
        for _ in range(3):  # the free port may be taken between choosing and binding it
            self.port = _free_port()
            ini = self.workdir / "pgbouncer.ini"
            ini.write_text(f"""
[databases]
* = {server}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = any
admin_users = {self.server.get('user') or 'postgres'}
pool_mode = transaction
default_pool_size = {SERVER_CONNECTIONS}
max_client_conn = 200
logfile = {self.workdir / 'pgbouncer.log'}
pidfile = {self.workdir / 'pgbouncer.pid'}
""")
            command = [str(_BINARY), str(ini)]
            if os.geteuid() == 0:
                # pgbouncer refuses to run as root: run it as whoever owns the server's socket
                # directory (the embedded server's data directory is private to its owner).
                owner = (Path(self.host).stat().st_uid if self.host.startswith("/")
                         else pwd.getpwnam("nobody").pw_uid)
                user = pwd.getpwuid(owner).pw_name
                for path in (self.workdir, *self.workdir.iterdir()):
                    os.chown(path, owner, -1)
                command[1:1] = ["-u", user]
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and self.process.poll() is None:
                try:
                    self.admin("SHOW VERSION")
                    return
                except psycopg.OperationalError:
                    time.sleep(0.05)
            self.stop()
        log = (self.workdir / "pgbouncer.log")
        raise RuntimeError("pgbouncer did not start: "
                           + (log.read_text()[-2000:] if log.exists() else "no log"))

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


@pytest.fixture
def pgbouncer(admin_url: str) -> Iterator[PgBouncer]:
    if _BINARY is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)")
    with tempfile.TemporaryDirectory(prefix="konduit-pgbouncer-") as tmp:
        bouncer = PgBouncer(admin_url, Path(tmp))
        bouncer.start()
        try:
            yield bouncer
        finally:
            bouncer.stop()


def _dbname(url: str) -> str:
    return str(conninfo_to_dict(url)["dbname"])


def fan_workflow(joins: collections.Counter[str], lock: threading.Lock) -> konduit.Workflow:
    wf = konduit.Workflow("bounced", version=1)

    @wf.step()
    def root(ctx: konduit.Context) -> list[int]:
        return list(range(ITEMS))

    @wf.map(after=[root], over=lambda items: items)
    async def square(ctx: konduit.Context) -> int:
        return int(ctx.item) ** 2

    @wf.step(after=[root])
    def left(ctx: konduit.Context) -> str:
        return "l"

    @wf.step(after=[root])
    async def right(ctx: konduit.Context) -> str:
        return "r"

    @wf.step(after=[square, left, right])
    def join(ctx: konduit.Context) -> int:
        with lock:
            joins[str(ctx.execution_id)] += 1
        return sum(ctx.upstream["square"]) + len(ctx.upstream["left"] + ctx.upstream["right"])

    return wf


def _run_through(pgbouncer: PgBouncer, db_url: str, executions: int,
                 caplog: pytest.LogCaptureFixture) -> tuple[list[str], list[dict[str, Any]]]:
    """Start ``executions`` fan-out/fan-in executions through the pooler, run them on a worker
    connected through it, and return their ids and pgbouncer's clients seen at the end."""
    joins: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    app = konduit.App([fan_workflow(joins, lock)], database_url=pgbouncer.url(_dbname(db_url)))
    caplog.set_level(logging.WARNING)
    try:
        # Heartbeats every 0.2 s: many more than psycopg's prepare threshold (5) in the run.
        with running_worker(app, concurrency=8, heartbeat_interval=0.2, lease_seconds=5.0):
            ids = [str(app.start("bounced", input={"n": i}).id) for i in range(executions)]
            deadline = time.monotonic() + 90.0
            with psycopg.connect(db_url, autocommit=True) as conn:
                while time.monotonic() < deadline:
                    row = conn.execute("SELECT count(*) FROM konduit_executions "
                                       "WHERE status IN ('pending', 'running')").fetchone()
                    if row and row[0] == 0:
                        break
                    time.sleep(0.1)
            clients = pgbouncer.admin("SHOW CLIENTS")
            servers = pgbouncer.admin("SHOW SERVERS")
    finally:
        app.close()
    with psycopg.connect(db_url) as conn:
        statuses = dict(conn.execute(
            "SELECT status, count(*) FROM konduit_executions GROUP BY status").fetchall())
        join_attempts = dict(conn.execute(
            "SELECT t.execution_id::text, count(a.id) FROM konduit_tasks t "
            "LEFT JOIN konduit_attempts a ON a.task_id = t.id WHERE t.step = 'join' "
            "GROUP BY t.execution_id").fetchall())
        outputs = {r[0] for r in conn.execute(
            "SELECT output FROM konduit_executions").fetchall()}
    assert statuses == {"succeeded": executions}, statuses
    assert set(joins) == set(ids) and set(joins.values()) == {1}, (
        f"join handler runs per execution: {collections.Counter(joins.values())}")
    assert set(join_attempts) == set(ids) and set(join_attempts.values()) == {1}
    assert outputs == {sum(i * i for i in range(ITEMS)) + 2}
    assert len(servers) <= SERVER_CONNECTIONS, servers
    troubles = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("konduit")]
    assert not troubles, troubles[:5]
    return ids, clients


def test_a_worker_behind_pgbouncer_with_a_direct_url_for_listen(
        pgbouncer: PgBouncer, db_url: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The production shape: pooled URL for transactions, direct URL for LISTEN and heartbeats.
    Every execution succeeds with its join fired once; the LISTEN connections never pass
    through the pooler, the worker's pool does."""
    monkeypatch.setenv("KONDUIT_DIRECT_DATABASE_URL", db_url)
    monkeypatch.delenv("KONDUIT_DATABASE_POOLED", raising=False)
    started = time.monotonic()
    _, clients = _run_through(pgbouncer, db_url, EXECUTIONS, caplog)
    names = collections.Counter(str(c["application_name"]) for c in clients)
    print(f"{EXECUTIONS} executions x {ITEMS + 4} tasks through pgbouncer in "
          f"{time.monotonic() - started:.1f} s; pgbouncer clients {dict(names)}")
    assert names["konduit-worker"] >= 1, f"the worker's pool was expected at the pooler: {names}"
    assert names["konduit-listen"] == 0, "LISTEN went through the pooler despite a direct URL"


def test_a_worker_behind_pgbouncer_without_a_direct_url_polls(
        pgbouncer: PgBouncer, db_url: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """No direct URL, only ``KONDUIT_DATABASE_POOLED=1``: LISTEN and the heartbeat go through
    the pooler too. Notifications are lost there, so the worker finds work by polling; the
    heartbeat's repeated statements must not be auto-prepared."""
    monkeypatch.delenv("KONDUIT_DIRECT_DATABASE_URL", raising=False)
    monkeypatch.setenv("KONDUIT_DATABASE_POOLED", "1")
    _, clients = _run_through(pgbouncer, db_url, 40, caplog)
    names = collections.Counter(str(c["application_name"]) for c in clients)
    assert names["konduit-listen"] >= 1, f"the listener was expected at the pooler: {names}"


def test_a_direct_url_to_another_database_is_refused(
        pgbouncer: PgBouncer, db_url: str, empty_db_url: str) -> None:
    """A heartbeat sent to another database would let every lease lapse: refused at open."""
    async def go() -> None:
        db = await open_database(pgbouncer.url(_dbname(db_url)), direct_url=empty_db_url)
        await db.close()

    with pytest.raises(DatabaseError, match="direct URL"):
        asyncio.run(go())


def test_konduit_db_migrate_through_pgbouncer(pgbouncer: PgBouncer, empty_db_url: str) -> None:
    """Two ``konduit db migrate`` processes at once through the pooler: the migration lock is a
    transaction-level advisory lock, so it holds in transaction mode, and each migration is
    applied once."""
    pooled = pgbouncer.url(_dbname(empty_db_url))
    env = {**os.environ, "KONDUIT_DATABASE_POOLED": "1"}
    env.pop("KONDUIT_DATABASE_URL", None)
    env.pop("KONDUIT_DIRECT_DATABASE_URL", None)
    runs = [subprocess.Popen([*KONDUIT, "db", "migrate", "--database-url", pooled], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=60)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    with psycopg.connect(empty_db_url) as conn:
        versions = [r[0] for r in conn.execute(
            "SELECT version FROM konduit_schema_version ORDER BY version").fetchall()]
    assert versions == list(range(1, latest_version() + 1))
