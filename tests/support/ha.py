"""A pg_auto_failover formation on this machine, for the failover tests: a monitor, a primary and
a synchronous secondary, each a ``pg_autoctl run`` process in a session of its own (so that
:meth:`Formation.kill` can SIGKILL a node's keeper and postmaster together, as a machine that
dies would).

PostgreSQL refuses to run as root: as root the nodes run as the ``postgres`` user (``runuser``),
in a directory under /tmp that user owns. The monitor is tuned to notice a dead primary within
about a second and to promote the secondary two seconds later, instead of the defaults' ~30 s of
detection and 30 s of demote timeout (docs/high-availability.md says what that trades away).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

PGBIN = Path("/usr/lib/postgresql/15/bin")

# Monitor settings (milliseconds): a health check every half second that gives up after half a
# second, one retry; unhealthy after a second without a report; promote two seconds after that
# when the old primary does not answer (it is dead: nothing will).
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": 500,
    "pgautofailover.health_check_timeout": 500,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 200,
    "pgautofailover.node_considered_unhealthy_timeout": 1000,
    "pgautofailover.primary_demote_timeout": 2000,
}
# Each node's keeper demotes its own primary after this many seconds without the monitor and
# without a standby: kept below primary_demote_timeout, so two primaries never both take writes.
NETWORK_PARTITION_TIMEOUT = 1


def pg_autoctl() -> str | None:
    """The pg_autoctl binary, or None when pg_auto_failover is not installed."""
    found = shutil.which("pg_autoctl")
    if found:
        return found
    candidate = PGBIN / "pg_autoctl"
    return str(candidate) if candidate.exists() else None


def free_ports(count: int) -> list[int]:
    """Ports nobody listens on now (bound to 0 and released together, so they differ)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Formation:
    root: Path
    monitor_port: int
    ports: dict[str, int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    database: str = "konduit"
    synchronous: bool = True

    # -- running commands as the postgres user ---------------------------------------------
    def _command(self, *args: str) -> list[str]:
        env = [f"HOME={self.root}", f"XDG_CONFIG_HOME={self.root}/config",
               f"XDG_DATA_HOME={self.root}/data", f"XDG_RUNTIME_DIR={self.root}/run",
               f"PG_CONFIG={PGBIN / 'pg_config'}", f"PATH={PGBIN}:/usr/bin:/bin"]
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        binary = pg_autoctl()
        assert binary is not None
        return [*prefix, "env", *env, binary, *args]

    def _log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def _create(self, name: str, *args: str) -> None:
        with self._log(f"{name}-create").open("ab") as out:
            done = subprocess.run(self._command(*args), stdout=out, stderr=subprocess.STDOUT,
                                  cwd=self.root, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"pg_autoctl create {name} failed:\n{self.tail(f'{name}-create')}")

    def _run(self, name: str) -> None:
        with self._log(name).open("ab") as out:
            # A session of its own: its process group is the node (keeper, postmaster).
            self.procs[name] = subprocess.Popen(
                self._command("run", "--pgdata", str(self.root / name)), stdout=out,
                stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True)

    def tail(self, name: str, lines: int = 30) -> str:
        path = self._log(name)
        if not path.exists():
            return f"(no {path.name})"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- addresses ----------------------------------------------------------------------------
    @property
    def monitor_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.monitor_port}/pg_auto_failover"

    def node_url(self, name: str, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports[name]}/{database}"

    def formation_uri(self) -> str:
        """What ``pg_autoctl show uri --formation default`` says clients should use."""
        out = subprocess.run(
            self._command("show", "uri", "--pgdata", str(self.root / "monitor"),
                          "--formation", "default"),
            capture_output=True, text=True, check=True, cwd=self.root, timeout=30)
        return out.stdout.strip()

    def url(self) -> str:
        """The formation's multi-host URL for Konduit: every node, ``read-write`` sessions
        only, as user postgres on the test database."""
        uri = self.formation_uri()
        assert uri.startswith("postgres://") and "target_session_attrs=read-write" in uri, uri
        rest = uri.removeprefix("postgres://")
        hosts, _, query = rest.partition("/")
        _, _, params = query.partition("?")
        params = "&".join(p for p in params.split("&") if not p.startswith("sslmode="))
        return f"postgresql://postgres@{hosts}/{self.database}?{params}&sslmode=disable"

    # -- the monitor's view ---------------------------------------------------------------------
    def monitor_rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.monitor_url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql.encode(), params).fetchall()

    def states(self) -> dict[str, tuple[str, str]]:
        """node name -> (reported state, assigned state)."""
        rows = self.monitor_rows(
            "SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node")
        return {name: (reported, goal) for name, reported, goal in rows}

    def primary(self) -> str:
        states = self.states()
        found = [n for n, (reported, goal) in states.items() if reported == goal == "primary"]
        assert len(found) == 1, states
        return found[0]

    def last_event(self) -> int:
        return int(self.monitor_rows("SELECT coalesce(max(eventid), 0) FROM pgautofailover.event")
                   [0][0])

    def promotion(self, after_event: int) -> tuple[str, dt.datetime, dt.datetime] | None:
        """The node promoted since event ``after_event``: its name, when the monitor assigned
        it ``wait_primary`` (it may take writes alone) and when it reported that state; None
        before it did."""
        rows = self.monitor_rows(
            "SELECT nodename,"
            "       min(eventtime) FILTER (WHERE goalstate = 'wait_primary'),"
            "       min(eventtime) FILTER (WHERE reportedstate = 'wait_primary')"
            " FROM pgautofailover.event WHERE eventid > %s GROUP BY nodename", after_event)
        for name, assigned, reported in rows:
            if assigned is not None and reported is not None:
                return name, assigned, reported
        return None

    def events(self, after_event: int) -> list[tuple[Any, ...]]:
        return self.monitor_rows(
            "SELECT eventtime, nodename, reportedstate::text, goalstate::text"
            " FROM pgautofailover.event WHERE eventid > %s ORDER BY eventid", after_event)

    def wait_for(self, wanted: dict[str, tuple[str, str]], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, tuple[str, str]] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error):
                states = self.states()
                if all(states.get(n) == s for n, s in wanted.items()):
                    return
            time.sleep(0.2)
        logs = "\n".join(f"--- {n}\n{self.tail(n)}" for n in self.procs)
        raise AssertionError(f"formation never reached {wanted} (last: {states})\n{logs}")

    # -- faults and clean-up ----------------------------------------------------------------
    def kill(self, name: str) -> float:
        """SIGKILL node ``name``'s keeper and postmaster (its whole process group), as a machine
        that dies; returns the wall-clock time of the kill."""
        proc = self.procs[name]
        at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        return at

    def stop(self) -> None:
        """Kill every process of the formation and remove its files; safe to call twice."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        for name in ("monitor", *self.ports):
            _reap_postmaster(self.root / name)
        shutil.rmtree(self.root, ignore_errors=True)


def _reap_postmaster(pgdata: Path) -> None:
    """After its postmaster was killed: wait for the server's processes (they exit on their
    postmaster's death) and drop its System V shared memory segment, which a killed postmaster
    leaves behind."""
    pidfile = pgdata / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
    except OSError:
        return
    pid = int(lines[0]) if lines and lines[0].strip().isdigit() else None
    deadline = time.monotonic() + 10
    while pid is not None and time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    if len(lines) >= 7 and len(lines[6].split()) == 2:
        shmid = lines[6].split()[1]
        subprocess.run(["ipcrm", "-m", shmid], capture_output=True, check=False)


@contextlib.contextmanager
def formation(synchronous: bool = True) -> Iterator[Formation]:
    """Start a monitor, a primary and a synchronous secondary (asynchronous when
    ``synchronous`` is false: out of the write quorum); yield the formation with a ``konduit``
    database created on its primary; kill and remove everything on exit, however the block
    ends."""
    root = Path(tempfile.mkdtemp(prefix="konduit-ha-", dir="/tmp"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    root.chmod(0o700)
    monitor_port, p1, p2 = free_ports(3)
    f = Formation(root, monitor_port, {"node1": p1, "node2": p2}, synchronous=synchronous)
    common = ("--auth", "trust", "--no-ssl", "--ssl-mode", "disable", "--hostname", "127.0.0.1",
              "--pgctl", str(PGBIN / "pg_ctl"))
    try:
        f._create("monitor", "create", "monitor", "--pgdata", str(root / "monitor"),
                  "--pgport", str(monitor_port), *common)
        f._run("monitor")
        monitor = (f"postgres://autoctl_node@127.0.0.1:{monitor_port}/pg_auto_failover"
                   "?sslmode=disable")
        _wait_connectable(f.monitor_url, f)
        with psycopg.connect(f.monitor_url, autocommit=True) as conn:
            for name, setting in MONITOR_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {int(setting)}".encode())
            conn.execute("SELECT pg_reload_conf()")
        for name, port in f.ports.items():
            f._create(name, "create", "postgres", "--pgdata", str(root / name), "--pgport",
                      str(port), "--name", name, "--monitor", monitor, *common)
            f._create(name, "config", "set", "--pgdata", str(root / name),
                      "timeout.network_partition_timeout", str(NETWORK_PARTITION_TIMEOUT))
            f._run(name)
            if name == "node1":
                f.wait_for({"node1": ("single", "single")})
                # The tests kill processes, not the machine: the operating system keeps what
                # was written, so commits need not wait for fsync (the secondary, copied from
                # this node, inherits it). A commit still waits for the secondary to have it.
                _wait_connectable(f.node_url(name), f)
                with psycopg.connect(f.node_url(name), autocommit=True) as conn:
                    conn.execute("ALTER SYSTEM SET fsync = off")
                    conn.execute("SELECT pg_reload_conf()")
        f.wait_for({"node1": ("primary", "primary"), "node2": ("secondary", "secondary")})
        if not synchronous:
            f._create("node2", "set", "node", "replication-quorum", "false",
                      "--pgdata", str(root / "node2"))
        with psycopg.connect(f.node_url("node1"), autocommit=True) as conn:
            def sync_names() -> str:
                row = conn.execute("SHOW synchronous_standby_names").fetchone()
                return str(row[0]) if row else ""
            deadline = time.monotonic() + 30
            while bool(sync_names()) != synchronous and time.monotonic() < deadline:
                time.sleep(0.2)
            assert bool(sync_names()) == synchronous, (
                f"synchronous_standby_names is {sync_names()!r} on the primary")
            conn.execute(f"CREATE DATABASE {f.database}".encode())
        yield f
    finally:
        f.stop()


def _wait_connectable(url: str, f: Formation, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.Error:
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}\n{f.tail(n)}" for n in f.procs)
                raise AssertionError(f"{url} never answered\n{logs}") from None
            time.sleep(0.2)
