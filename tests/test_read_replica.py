"""Reads from a real streaming standby (docs/read-replicas.md).

One primary and one hot standby made with ``pg_basebackup -R`` (tests/support/standby.py) serve
the module. Which server answered is proven with the standby's replay paused: what the
primary has and the standby has not replayed is missing from the dashboard's and the API's
lists, while the answers that must be fresh (a start's, an idempotent start's, a wait for a
finish) have it. Past the lag bound, and with the standby stopped, the primary serves, and the
lag is shown in the footer, the response headers and the metrics.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import konduit
from konduit.db.database import Database
from konduit.db.replica import Reads
from konduit.errors import DatabaseUnavailable
from konduit.web import create_app, database_client
from tests.support import blackhole, standby
from tests.support.browser import serving
from tests.support.waiting import until

pytestmark = [pytest.mark.storage, pytest.mark.slow,  # making the two servers takes ~20 s here
              pytest.mark.xdist_group("read_replica")]  # ... once, on one test worker

flow = konduit.Workflow("replica-flow", version=1)


@flow.step()
def only(ctx: konduit.Context) -> str:
    return "done"


@pytest.fixture(scope="module")
def pair() -> Iterator[standby.Pair]:
    why = standby.missing()
    if why is not None:
        pytest.skip(f"no primary and standby to test reads from a replica: {why}")
    with standby.primary_and_standby() as made:
        yield made


def dashboard(pair: standby.Pair, max_lag: float,
              read_url: str | None = None) -> tuple[konduit.App, Any]:
    app = konduit.App([flow], database_url=pair.primary.url,
                      read_database_url=read_url or pair.standby.url, read_max_lag=max_lag)
    web = create_app(database_client(pair.primary.url, app), app)
    return app, web


def listed(http: httpx.Client) -> tuple[set[str], str]:
    """The ids the API's list shows, and which database served it."""
    answer = http.get("/api/v1/executions", params={"workflow": "replica-flow", "limit": 500})
    assert answer.status_code == 200, answer.text
    return {e["id"] for e in answer.json()["items"]}, answer.headers["x-konduit-read-from"]


def footer(http: httpx.Client) -> str:
    page = http.get("/")
    assert page.status_code == 200, page.text
    found = re.search(r'<footer class="reads" id="reads">([^<]*)</footer>', page.text)
    assert found, page.text[-500:]
    return found.group(1)


def metric(http: httpx.Client, name: str) -> float:
    text = http.get("/metrics").text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_lists_and_details_come_from_the_replica_and_fresh_answers_from_the_primary(
        pair: standby.Pair) -> None:
    app, web = dashboard(pair, max_lag=3600)  # paused replay stays within the bound here
    try:
        with serving(web) as base, httpx.Client(base_url=base, timeout=30) as http:
            old = app.start("replica-flow", idempotency_key="old").id
            pair.wait_replayed()
            ids, source = until(lambda: (found := listed(http))[0] >= {str(old)} and found,
                                what="the replayed execution listed")
            assert source == "replica"
            assert footer(http).startswith("reads: replica, ")
            detail = http.get(f"/api/v1/executions/{old}")
            assert detail.status_code == 200 and detail.headers["x-konduit-read-from"] == "replica"
            assert float(detail.headers["x-konduit-replica-lag"]) >= 0

            with pair.replay_paused():
                # Written on the primary, received by the standby, not replayed there.
                started = http.post("/api/v1/executions", json={
                    "workflow": "replica-flow", "idempotency_key": "new"})
                assert started.status_code == 201, started.text
                new = started.json()["id"]
                # The start's answer is the primary's: the status it has there.
                assert started.json()["status"] == app.status(new).status
                again = http.post("/api/v1/executions", json={
                    "workflow": "replica-flow", "idempotency_key": "new"})
                assert again.json()["id"] == new  # the idempotent answer: from the primary
                assert app.start("replica-flow", idempotency_key="new").id.hex == new.replace("-", "")
                assert app.cancel(old)
                # A wait for the finish reads the primary: the cancel is seen at once ...
                with pytest.raises(konduit.ExecutionFailed) as failed:
                    app.wait(old, timeout=10)
                assert failed.value.result.status == "cancelled"
                # ... while the lists read the replica, which has neither the new execution
                # nor the cancel: it answers, and with what it has.
                ids, source = listed(http)
                assert source == "replica" and new not in ids and str(old) in ids
                row = http.get(f"/api/v1/executions/{old}").json()
                assert row["status"] == "running"
                assert {e.id for e in app.list(limit=500)} >= {old}
                assert new not in {str(e.id) for e in app.list(limit=500)}
                with konduit.Client(pair.primary.url, read_database_url=pair.standby.url,
                                    read_max_lag=3600) as client:
                    assert new not in {str(e.id) for e in client.list(limit=500)}
                    assert client.status(new).status == app.status(new).status
                # The detail of an execution the replica does not have yet is the primary's.
                fresh = http.get(f"/api/v1/executions/{new}")
                assert fresh.status_code == 200, fresh.text
                assert fresh.headers["x-konduit-read-from"] == "primary"
            ids, source = until(lambda: (found := listed(http))[0] >= {new} and found,
                                what="the new execution listed once replay resumed")
            assert source == "replica"
            assert http.get(f"/api/v1/executions/{old}").json()["status"] == "cancelled"
    finally:
        app.close()


def test_past_the_lag_bound_the_primary_serves_and_the_lag_is_shown(pair: standby.Pair) -> None:
    app, web = dashboard(pair, max_lag=1.0)
    try:
        with serving(web) as base, httpx.Client(base_url=base, timeout=30) as http:
            until(lambda: listed(http)[1] == "replica", what="reads from the replica")
            assert metric(http, "konduit_read_replica_serving") == 1.0
            fallbacks = metric(http, "konduit_read_fallbacks_total")
            with pair.replay_paused():
                late = str(app.start("replica-flow", idempotency_key="late").id)
                # The replica falls behind by the time since its last replayed transaction:
                # past 1 s the lists are the primary's, fresh.
                ids, _ = until(lambda: (found := listed(http))[1] == "primary" and found,
                                    what="reads falling back to the primary")
                assert late in ids
                line = footer(http)
                # A lag measurement that times out (a loaded machine) reads "unknown": the
                # primary serves then too.
                shown = r"(\d+\.\d s behind|behind by an unknown time)"
                assert re.fullmatch(rf"reads: primary \(replica {shown}, limit 1 s\)", line), line
                assert metric(http, "konduit_read_replica_lag_seconds") > 1.0
                assert metric(http, "konduit_read_replica_serving") == 0.0
                assert metric(http, "konduit_read_fallbacks_total") == fallbacks + 1  # once, not per read
                assert http.get("/").headers["x-konduit-read-from"] == "primary"
            until(lambda: listed(http)[1] == "replica", what="reads back on the replica")
            assert footer(http).startswith("reads: replica, ")
    finally:
        app.close()


def test_with_the_replica_down_the_primary_serves(pair: standby.Pair) -> None:
    app, web = dashboard(pair, max_lag=3600)
    try:
        with serving(web) as base, httpx.Client(base_url=base, timeout=30) as http:
            until(lambda: listed(http)[1] == "replica", what="reads from the replica")
            with pair.standby_stopped():
                gone = str(app.start("replica-flow", idempotency_key="while-down").id)
                ids, source = listed(http)  # the first read after the stop already answers
                assert source == "primary" and gone in ids
                assert "replica unreachable" in footer(http)
                assert metric(http, "konduit_read_replica_serving") == 0.0
                detail = http.get(f"/api/v1/executions/{gone}")
                assert detail.status_code == 200
                assert detail.headers["x-konduit-read-from"] == "primary"
                assert "x-konduit-replica-lag" not in detail.headers
            # Back up: asked again after a few seconds, it serves again.
            until(lambda: listed(http)[1] == "replica", what="reads back on the replica")
    finally:
        app.close()


def test_without_a_replica_every_read_is_the_primarys(pair: standby.Pair) -> None:
    app = konduit.App([flow], database_url=pair.primary.url, read_database_url=None)
    app.read_database_url = None  # whatever KONDUIT_READ_DATABASE_URL says
    web = create_app(database_client(pair.primary.url, app), app)
    try:
        with serving(web) as base, httpx.Client(base_url=base, timeout=30) as http:
            assert listed(http)[1] == "primary"
            assert 'id="reads"' not in http.get("/").text
            assert "konduit_read_replica" not in http.get("/metrics").text
    finally:
        app.close()


def test_the_replica_and_its_bound_come_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KONDUIT_READ_DATABASE_URL", "postgresql://reader@replica/app")
    monkeypatch.setenv("KONDUIT_READ_MAX_LAG", "2.5")
    app = konduit.App([])
    assert (app.read_database_url, app.read_max_lag) == ("postgresql://reader@replica/app", 2.5)
    explicit = konduit.App([], read_database_url="postgresql://other/app", read_max_lag=0)
    assert (explicit.read_database_url, explicit.read_max_lag) == ("postgresql://other/app", 0)
    monkeypatch.setenv("KONDUIT_READ_MAX_LAG", "soon")
    with pytest.raises(konduit.KonduitError, match="KONDUIT_READ_MAX_LAG must be a number"):
        konduit.App([])
    with pytest.raises(konduit.KonduitError, match="read_max_lag must be"):
        konduit.Client(read_max_lag=-1)


BOUND = 2.0
"""Seconds a replica that does not answer may add to a read (docs/read-replicas.md)."""
SLACK = 1.5
"""What a loaded machine may add to it here (the read itself, on the primary, included)."""


def timed_list(http: httpx.Client) -> tuple[float, set[str], str]:
    began = time.monotonic()
    ids, source = listed(http)
    return time.monotonic() - began, ids, source


@pytest.mark.timeout(120)
def test_a_replica_that_hangs_costs_each_read_at_most_the_bound(pair: standby.Pair) -> None:
    """A standby that stops answering without closing anything (stopped with SIGSTOP, or behind
    a black hole; here a relay that holds every byte) costs the first read at most the bound
    and the reads after it nothing: they go to the primary while it is asked again in the
    background. Once it answers again the reads go back to it."""
    with blackhole.relay(pair.standby.port) as relay:
        app, web = dashboard(pair, max_lag=3600, read_url=relay.url(pair.standby.url))
        try:
            with serving(web) as base, httpx.Client(base_url=base, timeout=60) as http:
                until(lambda: listed(http)[1] == "replica", what="reads from the replica")
                with relay.held():
                    gone = str(app.start("replica-flow", idempotency_key="while-hung").id)
                    first, ids, source = timed_list(http)
                    assert source == "primary" and gone in ids
                    assert first < BOUND + SLACK, f"the first read took {first:.1f} s"
                    later = []
                    began = time.monotonic()
                    while time.monotonic() - began < 12:  # past two of the 5 s retries
                        took, ids, source = timed_list(http)
                        assert source == "primary" and gone in ids
                        later.append(took)
                        time.sleep(0.2)
                    assert max(later) < BOUND, (
                        f"a read waited for the replica: {max(later):.1f} s "
                        f"(first {first:.1f} s, {len(later)} reads after it)")
                    assert "replica unreachable" in footer(http)
                # Answering again (SIGCONT): asked again in the background, it serves again.
                until(lambda: listed(http)[1] == "replica", what="reads back on the replica")
                took, ids, _ = timed_list(http)
                assert gone in ids and took < BOUND
        finally:
            app.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("measuring", [False, True], ids=["reading", "measuring"])
def test_a_read_the_hung_replica_holds_goes_to_the_primary_once(
        pair: standby.Pair, measuring: bool) -> None:
    """The replica stops answering in the middle of a read (or of the lag measurement before
    it): within the bound the read is run on the primary, once, and the replica's run of it
    ends (its connection is cut, not left waiting)."""
    async def scenario() -> None:
        primary = Database(pair.primary.url, max_size=2)
        await primary.open()
        with blackhole.relay(pair.standby.port) as relay:
            # Measuring before every read, or once for the whole test.
            reads = Reads(primary, relay.url(pair.standby.url), max_lag=3600,
                          check_every=0.0 if measuring else 3600.0)
            runs: list[str] = []

            async def body(db: Database) -> str:
                where = "replica" if db is not primary else "primary"
                runs.append(where)
                row = await db.one("replica_get_replay_state", primary_lsn="0/0")
                assert row is not None
                return where

            try:
                assert await reads.call(body) == "replica"
                runs.clear()
                with relay.held():
                    began = time.monotonic()
                    # (Bounded here too, so that a read that hangs fails the test.)
                    assert await asyncio.wait_for(reads.call(body), 30) == "primary"
                    took = time.monotonic() - began
                    assert took < BOUND + SLACK, f"the read took {took:.1f} s"
                    assert runs.count("primary") == 1, runs
                    assert reads.state.source == "primary"
                    assert "replica unreachable" in (reads.state.reason or "")
                    began = time.monotonic()
                    assert await reads.call(body) == "primary"
                    assert time.monotonic() - began < 1.0  # down: straight to the primary
            finally:
                await reads.close()
                await primary.close()

    asyncio.run(scenario())


def test_a_read_the_replica_fails_runs_on_the_primary_once(pair: standby.Pair) -> None:
    async def scenario() -> None:
        primary = Database(pair.primary.url, max_size=2)
        await primary.open()
        reads = Reads(primary, pair.standby.url, max_lag=3600)
        runs: list[str] = []

        async def body(db: Database) -> str:
            if db is not primary:
                runs.append("replica")
                raise DatabaseUnavailable("database unavailable: connection lost midway")
            runs.append("primary")
            return "primary"

        try:
            assert await reads.call(body) == "primary"
            assert runs == ["replica", "primary"]
        finally:
            await reads.close()
            await primary.close()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_slow_read_on_a_live_replica_is_not_cut_short(pair: standby.Pair) -> None:
    """A read longer than the bound on a replica that answers its round trips meanwhile runs
    to its end there: the bound is on a replica that does not answer, not on reads."""
    async def scenario() -> None:
        primary = Database(pair.primary.url, max_size=2)
        await primary.open()
        reads = Reads(primary, pair.standby.url, max_lag=3600)

        async def body(db: Database) -> str:
            async with db.connection() as conn:
                await conn.execute(b"SELECT pg_sleep(3)")
            return "primary" if db is primary else "replica"

        try:
            assert await reads.call(body) == "replica"
            assert reads.state.source == "replica" and reads.fallbacks == 0
        finally:
            await reads.close()
            await primary.close()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_replica_hung_from_the_start_costs_the_first_read_at_most_half_the_bound(
        pair: standby.Pair) -> None:
    async def scenario() -> None:
        primary = Database(pair.primary.url, max_size=2)
        await primary.open()
        with blackhole.relay(pair.standby.port) as relay:
            reads = Reads(primary, relay.url(pair.standby.url), max_lag=3600)
            try:
                with relay.held():
                    took = []
                    for _ in range(5):
                        began = time.monotonic()
                        await asyncio.wait_for(reads.one("replica_get_replay_state",
                                                         primary_lsn="0/0"), 30)
                        took.append(time.monotonic() - began)
                    assert took[0] < BOUND / 2 + SLACK, took
                    assert reads.served == {"primary": 5, "replica": 0}
                    await asyncio.sleep(BOUND)  # the first measurement gives up
                    assert "replica unreachable" in (reads.state.reason or "")
                # Answering again: measured again in the background, then it serves.
                deadline = time.monotonic() + 30
                while reads.state.source != "replica":
                    assert time.monotonic() < deadline, reads.state
                    await reads.one("replica_get_replay_state", primary_lsn="0/0")
                    await asyncio.sleep(0.1)
            finally:
                await reads.close()
                await primary.close()

    asyncio.run(scenario())
