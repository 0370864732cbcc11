"""Workers for tests: on a thread of the test process (:func:`running_worker`), or as real
``konduit worker`` processes (:func:`spawn_worker`, stopped by :func:`stop_workers`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import konduit
import konduit.testing
from konduit.worker.stopping import EXIT_CODE as STUCK_EXIT_CODE

# The checkout: worker processes run from here, so ``tests.apps.*`` and this tree's ``src``
# are what they import, whatever is installed.
ROOT = Path(__file__).resolve().parent.parent.parent


@contextmanager
def running_worker(app: konduit.App, concurrency: int = 8,
                   **options: Any) -> Iterator[konduit.testing.WorkerThread]:
    """Run a worker of ``app`` on a thread for the duration of the block (which gets its
    :class:`konduit.testing.WorkerThread`, to wait for passes); an error it died of is raised
    as it is at the end (tests expect e.g. ``WorkerUnhealthy`` itself, not the
    :class:`konduit.testing.TestWorkerError` that wraps it)."""
    options.setdefault("poll_interval", 0.2)
    try:
        with konduit.testing.worker_thread(app, concurrency=concurrency, **options) as worker:
            yield worker
    except konduit.testing.TestWorkerError as died:
        if died.__cause__ is None:  # it did not stop: nothing more precise to raise
            raise
        raise died.__cause__ from None


def worker_environment(**extra: str) -> dict[str, str]:
    """The environment of a worker process: this checkout's sources first on the path (the
    workers must run the code under test), then whatever the test process had."""
    path = [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    # faulthandler on: a worker that ignores SIGTERM is sent SIGABRT before it is killed
    # (stop_workers), and writes where every thread is, its event loop's included.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONFAULTHANDLER": "1",
            **extra}


def spawn_worker(
    app: str,
    db_url: str,
    *options: str,
    concurrency: int | None = 4,
    poll_interval: float = 0.2,
    log_level: str = "WARNING",
    log: Path | None = None,
    env: dict[str, str] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``konduit worker <app>`` (``app`` a ``module:attribute`` spec, e.g.
    ``tests.apps.proc_app:app``) on ``db_url``; ``options`` are more command-line flags,
    ``concurrency=None`` leaves the command's default. ``log``: both output streams are
    appended to that file (several workers may share one); ``env``: added to
    :func:`worker_environment`."""
    command = [sys.executable, "-m", "konduit.cli", "worker", app, "--database-url", db_url,
               "--poll-interval", str(poll_interval), "--log-level", log_level, *options]
    if concurrency is not None:
        command += ["--concurrency", str(concurrency)]
    environment = worker_environment(**(env or {}))
    if log is None:
        return subprocess.Popen(command, cwd=ROOT, env=environment, stdout=stdout, stderr=stderr)
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=ROOT, env=environment, stdout=out,
                                stderr=subprocess.STDOUT)


def stop_workers(workers: Iterable[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    """SIGTERM every worker still running, then wait for each; one that does not stop within
    ``timeout`` is killed (so a test never leaves a process behind) and the wait fails."""
    workers = list(workers)
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    stuck = []
    for w in workers:
        try:
            w.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            w.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.wait(timeout=5)
            w.kill()
            w.wait()
            stuck.append(w.pid)
    assert not stuck, f"worker processes {stuck} ignored SIGTERM for {timeout} s and were killed"
    # A worker whose stop hung ends itself after saying where (konduit.worker.stopping): a bug
    # all the same, and its stderr has the stacks.
    ended = [w.pid for w in workers if w.returncode == STUCK_EXIT_CODE]
    assert not ended, f"worker processes {ended} did not stop and ended themselves"


@contextmanager
def reaped(procs: list[subprocess.Popen[bytes]]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Whatever happens in the block, no worker process in ``procs`` (to which the block may
    add) outlives it: those still running at the end are killed."""
    try:
        yield procs
    finally:
        kill_workers(procs)


def kill_workers(workers: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every worker still running (a crash, as the tests of recovery need) and reap it."""
    workers = list(workers)
    for w in workers:
        if w.poll() is None:
            w.kill()
    for w in workers:
        w.wait(timeout=30)
