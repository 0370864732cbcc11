"""Services signal "pass done" (issue 17): a waiter wakes at the pass it waits for, on another
thread, and a service that never passes, or a name that is no service, fails saying so."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import konduit
from konduit.worker.passes import SERVICES, Passes
from tests.support.waiting import wait_for_passes
from tests.support.workers import running_worker


def test_a_waiter_on_another_thread_wakes_at_the_nth_pass_not_before() -> None:
    passes = Passes()
    passes.done("stalls")
    reached: list[bool] = []
    waiting = threading.Barrier(2)

    def wait() -> None:
        waiting.wait()
        reached.append(passes.reach("stalls", 4, timeout=30))

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiting.wait()
    passes.done("stalls")
    passes.done("stalls")
    passes.done("repair")  # another service's pass is not one of these
    waiter.join(0.2)
    assert waiter.is_alive() and reached == []
    passes.done("stalls")
    waiter.join(10)
    assert reached == [True] and passes.count("stalls") == 4


def test_passes_done_before_the_call_do_not_count() -> None:
    passes = Passes()
    for _ in range(3):
        passes.done("deadlines")
    with pytest.raises(TimeoutError, match="'deadlines' service completed 0 of 1 passes"):
        passes.wait("deadlines", n=1, timeout=0.05)
    assert passes.reach("deadlines", 3, timeout=0)  # they were counted, just not waited for
def test_no_pass_and_no_such_service_fail_naming_it() -> None:
    passes = Passes()
    with pytest.raises(TimeoutError, match="'alerts' service completed 0 of 1 passes"):
        passes.wait("alerts", n=1, timeout=0.05)
    with pytest.raises(ValueError, match="no service named 'stall'"):
        passes.wait("stall")
    with pytest.raises(ValueError, match="no service named 'sweep'"):
        passes.done("sweep")
    with pytest.raises(ValueError, match="n must be at least 1"):
        passes.wait("stalls", n=0)
    assert "maintenance" in SERVICES and "hedging" in SERVICES


@pytest.mark.storage
def test_a_running_worker_counts_its_maintenance_passes(
        make_app: Callable[..., konduit.App]) -> None:
    app = make_app()
    with running_worker(app, maintenance_interval=0.1) as worker:
        first = wait_for_passes(worker, "maintenance", n=1)
        assert wait_for_passes(worker, "maintenance", n=2) >= first + 2
        # Each sweep of a full pass counted too (this worker may rescue: it is connected).
        assert wait_for_passes(worker, "stalls", n=2) >= 2
        assert worker.worker().passes.count("timeouts") >= 2
