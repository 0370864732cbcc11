"""A worker asked to stop that has not stopped well after its grace says where it is
(konduit.worker.stopping): every thread's stack and every asyncio task's, once; a worker that
stops in time says nothing."""

from __future__ import annotations

import asyncio
import io
import signal
import threading
import time

import pytest

import konduit
from konduit.worker.stopping import StopWatch


def _loop_in_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


def test_a_stop_that_does_not_end_dumps_the_threads_and_the_tasks_once() -> None:
    loop, thread = _loop_in_thread()
    held = asyncio.run_coroutine_threadsafe(asyncio.sleep(3600), loop)  # what holds the stop

    async def holding_the_shutdown() -> None:
        await asyncio.sleep(3600)

    asyncio.run_coroutine_threadsafe(holding_the_shutdown(), loop)
    out = io.StringIO()
    watch = StopWatch(loop, grace=0.0, after=0.2, out=out)
    watch.arm()
    watch.arm()  # a second stop request arms nothing more
    deadline = time.monotonic() + 30
    while "asyncio task(s) still running" not in out.getvalue():
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.05)
    time.sleep(0.5)
    text = out.getvalue()
    assert text.count("still stopping") == 1
    assert "holding_the_shutdown" in text  # the task that holds it, by its coroutine
    assert "Thread" in text  # and where each thread is
    held.cancel()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_a_worker_that_stops_in_time_says_nothing() -> None:
    loop, thread = _loop_in_thread()
    out = io.StringIO()
    watch = StopWatch(loop, grace=0.0, after=0.2, out=out)
    watch.arm()
    watch.done()
    time.sleep(0.6)
    assert out.getvalue() == ""
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.storage
def test_a_worker_process_whose_loop_user_code_blocks_still_ends_on_sigterm(db_url: str) -> None:
    """An ``async`` handler that sleeps on the event loop: SIGTERM's stop cannot run on the
    blocked loop, but Python's own handler arms the watch, which says where the loop is (the
    handler's frame) and ends the process, exit status 70, instead of waiting for a SIGKILL."""
    import subprocess

    from konduit.worker.stopping import EXIT_CODE
    from tests.apps import loop_hog_app
    from tests.support.db import rows
    from tests.support.waiting import until
    from tests.support.workers import spawn_worker

    app = konduit.App([loop_hog_app.wf], database_url=db_url)
    try:
        app.start("loop-hog")
        worker = spawn_worker("tests.apps.loop_hog_app:app", db_url, "--shutdown-grace", "1",
                              env={"KONDUIT_STOP_STUCK_AFTER": "1"},
                              stderr=subprocess.PIPE)
        try:
            until(lambda: rows(db_url, "SELECT count(*) FROM konduit_tasks"
                               " WHERE status = 'running'") == [(1,)],
                  timeout=60, what="the hog running")
            time.sleep(0.5)  # into its sleep
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        text = err.decode(errors="replace")
        assert worker.returncode == EXIT_CODE, text
        assert "still stopping" in text and "ending the process" in text, text
        assert "loop_hog_app.py" in text and "hog" in text, text  # where the loop was
    finally:
        app.close()
