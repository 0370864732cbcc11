"""The 24-hour repair contract (seed 004): ``Workflow(..., repair_within=...)``.

Pure: the contract's validation and the status line. Real PostgreSQL: a degraded execution is
repaired automatically once and only once — with eight repairers forced to race for each
execution, and with three real ``konduit worker`` processes — its output replaced by the new
version; never past ``repair_within``, never before ``repair_delay``; visible in ``konduit
status`` and on the dashboard.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import konduit
from konduit.core.durations import format_duration
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.core.repair_contract import (
    AutoRepairState,
    RepairContract,
    describe,
)
from konduit.db.connect import open_database
from konduit.engine.auto_repair import AutoRepairer
from konduit.engine.registry import Registry
from konduit.web import create_app, database_client
from tests.support.browser import serving
from tests.support.waiting import holds, until
from tests.support.workers import running_worker, spawn_worker, stop_workers
from tests.test_cli import konduit_cli

HEALED = threading.Event()  # the resize service answers once set


def contract_workflow(name: str = "contract", *, within: str = "1h",
                      delay: str | None = "0s") -> konduit.Workflow:
    """transcribe -> (cover_image: degrades at 300 ms while the service is down; captions) ->
    publish, with a repair contract."""
    wf = konduit.Workflow(name, version=1, repair_within=within, repair_delay=delay)

    @wf.step()
    def transcribe(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[transcribe], deadline="300ms", retry=konduit.Retry(max_attempts=1),
             required=False, fallback=lambda ctx: "fallback.png")
    async def cover_image(ctx: konduit.Context) -> str:
        while not HEALED.is_set():
            await asyncio.sleep(0.02)
        return "real.png"

    @wf.step(after=[transcribe])
    def captions(ctx: konduit.Context) -> str:
        return "captions"

    @wf.step(after=[cover_image, captions], join=konduit.Join.required())
    def publish(ctx: konduit.Context) -> str:
        return str(ctx.upstream["cover_image"])

    return wf


@pytest.fixture(autouse=True)
def _service_down() -> Iterator[None]:
    HEALED.clear()
    yield
    HEALED.set()


# -- pure ---------------------------------------------------------------------------------------


def test_the_contract_is_checked_at_definition_time() -> None:
    assert RepairContract.of(None, None) is None
    assert RepairContract.of("24h", None) == RepairContract(86400, 300)  # default: 5 minutes
    assert RepairContract.of("2m", None) == RepairContract(120, 60)  # ... or half a short window
    assert RepairContract.of("1h", "0s") == RepairContract(3600, 0)
    for within, delay, message in [
        ("1h", "1h", r"repair_delay \(1h\) must be shorter than repair_within \(1h\)"),
        ("10m", "20m", "must be shorter"),
        (None, "5m", "repair_delay= needs repair_within="),
        ("0s", None, "repair_within must be longer than zero"),
        ("tomorrow", None, "repair_within: cannot read 'tomorrow'"),
        ("1h", -5, "repair_delay: duration must not be negative"),
    ]:
        with pytest.raises(konduit.WorkflowDefinitionError, match=message) as caught:
            konduit.Workflow("bad-contract", version=1, repair_within=within, repair_delay=delay)
        assert "workflow 'bad-contract'" in str(caught.value)


def test_the_contract_is_part_of_the_spec_only_when_set() -> None:
    plain, bound = konduit.Workflow("p", version=1), konduit.Workflow("p", version=1,
                                                                      repair_within="24h")
    for wf in (plain, bound):
        wf.step(name="only")(lambda ctx: 1)
    assert "repair" not in plain.spec.spec_json  # every existing workflow keeps its hash
    assert bound.spec.spec_json["repair"] == {"within": 86400.0, "delay": 300.0}
    assert plain.spec.spec_hash != bound.spec.spec_hash
    assert RepairContract.from_spec(bound.spec.spec_json) == bound.spec.repair
    assert RepairContract.from_spec(plain.spec.spec_json) is None


def test_durations_are_shown_as_written() -> None:
    assert [format_duration(s) for s in (86400, 172800, 3600, 300, 90, 1.5, 0)] == \
        ["24h", "2d", "1h", "5m", "90s", "1.5s", "0s"]


FINISHED = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def state(**changes: Any) -> AutoRepairState:
    fields: dict[str, Any] = dict(
        status="succeeded", finished_at=FINISHED, auto_repair_at=None, auto_repair_error=None,
        degraded=("cover_image",), contract=RepairContract(86400, 300))
    fields.update(changes)
    return AutoRepairState(**fields)


@given(within=st.integers(1, 10**6), delay_share=st.floats(0, 0.999),
       offset=st.integers(-10, 2 * 10**6))
def test_the_status_line_says_pending_due_or_ran_out(within: int, delay_share: float,
                                                     offset: int) -> None:
    delay = int(within * delay_share)
    line = describe(state(contract=RepairContract(within, delay)),
                    FINISHED + timedelta(seconds=offset))
    assert line is not None
    if offset >= within:
        assert line.startswith("not auto-repaired: repair_within=")
    elif offset < delay:
        assert line.startswith("auto-repair pending: due at ")
    else:
        assert line.startswith("auto-repair pending: due now")
    assert f"repair_within={format_duration(within)}" in line


def test_the_status_line_after_the_repair_and_when_there_is_nothing_to_say() -> None:
    now = FINISHED + timedelta(hours=1)
    taken = FINISHED + timedelta(minutes=5)
    assert describe(state(auto_repair_at=taken), now) == \
        f"auto-repaired at {taken.astimezone():%Y-%m-%d %H:%M:%S} (repair_within=24h)"
    assert describe(state(auto_repair_at=taken, status="running"), now).startswith(  # type: ignore[union-attr]
        "auto-repair running since")
    assert "not possible" in (describe(state(auto_repair_at=taken, auto_repair_error="no"), now) or "")
    assert describe(state(contract=None), now) is None
    assert describe(state(degraded=()), now) is None
    assert describe(state(status="failed"), now) is None
    assert describe(state(status="running", finished_at=None), now) is None


# -- real PostgreSQL ----------------------------------------------------------------------------


def finish_degraded(app: konduit.App, wf: konduit.Workflow, count: int) -> list[UUID]:
    handles = [app.start(wf.name, i) for i in range(count)]
    for handle in handles:
        result = handle.wait(timeout=30)
        assert result.output == "fallback.png" and result.outcomes["cover_image"] == "degraded"
    return [h.id for h in handles]


def generations(db_url: str, ids: list[UUID]) -> dict[UUID, tuple[int, bool]]:
    with psycopg.connect(db_url) as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT id, generation, auto_repair_at IS NOT NULL FROM konduit_executions"
            " WHERE id = ANY(%s)", (ids,))}


async def _racing_repairers(db_url: str, wf: konduit.Workflow, ids: list[UUID],
                            racers: int) -> tuple[list[list[bool]], list[list[UUID]]]:
    """``racers`` repairers on their own pools: first all take each execution of ``ids[:half]``
    at the same moment, then all look for due repairs at once (the rest)."""
    dbs = [await open_database(db_url, max_size=2, name=f"racer-{i}") for i in range(racers)]
    try:
        repairers = [AutoRepairer(db, Registry([wf]), max_payload_bytes=DEFAULT_MAX_BYTES)
                     for db in dbs]
        half = len(ids) // 2
        takes = [list(await asyncio.gather(*(r.repair_one(eid, wf.spec) for r in repairers)))
                 for eid in ids[:half]]
        looks = list(await asyncio.gather(*(r.repair_due() for r in repairers)))
        return takes, looks
    finally:
        for db in dbs:
            await db.close()


@pytest.mark.storage
def test_racing_repairers_take_each_repair_once_and_the_new_output_replaces_the_degraded(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = contract_workflow()
    app = make_app(wf)
    # The worker runs the executions and the repairs; it never takes due repairs itself
    # (auto_repair=False): the racers below do.
    with running_worker(app, poll_interval=0.05, auto_repair=False):
        ids = finish_degraded(app, wf, 10)
        assert all(app.auto_repair_status(eid).startswith("auto-repair pending: due now")  # type: ignore[union-attr]
                   for eid in ids)
        takes, looks = asyncio.run(_racing_repairers(db_url, wf, ids, racers=8))
        assert [sum(t) for t in takes] == [1] * 5, takes  # exactly one of 8 took each
        looked = [eid for found in looks for eid in found]
        assert sorted(looked) == sorted(ids[5:]), looks  # each of the rest taken by one racer
        # The service is still down: the repairs degrade again, and stay repaired once.
        for eid in ids:
            assert app.wait(eid, timeout=30).output == "fallback.png"
        assert asyncio.run(_racing_repairers(db_url, wf, ids, racers=4))[1] == [[]] * 4
        assert generations(db_url, ids) == {eid: (2, True) for eid in ids}
        for eid in ids:
            versions = app.outputs(eid)
            assert [v.degraded for v in versions] == [["cover_image"], ["cover_image"]]
            assert (app.auto_repair_status(eid) or "").startswith("auto-repaired at ")

        # With the service back, a fresh degraded execution is repaired to the real output.
        [healthy] = finish_degraded(app, wf, 1)
        HEALED.set()
        looks = asyncio.run(_racing_repairers(db_url, wf, [healthy], racers=3))[1]
        assert sorted(looks, key=len) == [[], [], [healthy]]
        result = app.wait(healthy, timeout=30)
    assert result.output == "real.png" and result.outcomes["cover_image"] == "succeeded"
    versions = app.outputs(healthy)
    assert [(v.output, v.degraded) for v in versions] == \
        [("fallback.png", ["cover_image"]), ("real.png", [])]
    assert generations(db_url, [healthy]) == {healthy: (2, True)}
    line = app.auto_repair_status(healthy) or ""
    assert line.startswith("auto-repaired at ") and line.endswith("(repair_within=1h)")


@pytest.mark.storage
def test_no_repair_past_repair_within_before_repair_delay_or_of_a_clean_execution(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    late_wf, early_wf = contract_workflow("late"), contract_workflow("early", delay="10m")
    app = make_app(late_wf, early_wf)
    with running_worker(app, poll_interval=0.05, auto_repair=False):
        [late] = finish_degraded(app, late_wf, 1)
        [early] = finish_degraded(app, early_wf, 1)
        HEALED.set()
        clean = app.start(late_wf.name, 0)
        assert clean.wait(timeout=30).output == "real.png"
    with psycopg.connect(db_url) as conn:  # it finished degraded 2 hours ago: past its 1 h
        conn.execute("UPDATE konduit_executions SET finished_at = finished_at - interval '2h',"
                     " created_at = created_at - interval '2h' WHERE id = %s", (late,))

    async def look() -> tuple[list[UUID], bool, bool]:
        db = await open_database(db_url, max_size=2)
        try:
            repairer = AutoRepairer(db, app.registry, max_payload_bytes=DEFAULT_MAX_BYTES)
            due = await repairer.repair_due()
            # Taking it directly is refused too: the claim re-checks the window itself.
            return (due, await repairer.repair_one(late, late_wf.spec),
                    await repairer.repair_one(early, early_wf.spec))
        finally:
            await db.close()

    assert asyncio.run(look()) == ([], False, False)
    assert generations(db_url, [late, early, clean.id]) == \
        {late: (1, False), early: (1, False), clean.id: (1, False)}
    assert (app.auto_repair_status(late) or "").startswith(
        "not auto-repaired: repair_within=1h ran out at ")
    assert (app.auto_repair_status(early) or "").startswith("auto-repair pending: due at ")
    assert app.auto_repair_status(clean.id) is None


@pytest.mark.storage
def test_a_repair_that_cannot_start_is_recorded_once(make_app: Callable[..., konduit.App],
                                                     db_url: str) -> None:
    wf = contract_workflow()
    app = make_app(wf)
    with running_worker(app, poll_interval=0.05, auto_repair=False):
        [eid] = finish_degraded(app, wf, 1)
    with psycopg.connect(db_url) as conn:  # the steps no longer say what the output says
        conn.execute("UPDATE konduit_steps SET status = 'succeeded' WHERE execution_id = %s", (eid,))

    async def look() -> list[list[UUID]]:
        dbs = [await open_database(db_url, max_size=2) for _ in range(3)]
        try:
            repairers = [AutoRepairer(db, app.registry, max_payload_bytes=DEFAULT_MAX_BYTES)
                         for db in dbs]
            first = list(await asyncio.gather(*(r.repair_due() for r in repairers)))
            return [*first, await repairers[0].repair_due()]
        finally:
            for db in dbs:
                await db.close()

    assert asyncio.run(look()) == [[], [], [], []]
    line = app.auto_repair_status(eid) or ""
    assert line.startswith("auto-repair not possible") and "nothing to repair" in line
    assert generations(db_url, [eid]) == {eid: (1, True)}


@pytest.mark.storage
@pytest.mark.slow
def test_three_worker_processes_auto_repair_each_execution_exactly_once(
        db_url: str, tmp_path: Path) -> None:
    from tests.apps import auto_repair_app

    healed = tmp_path / "healed"
    app = konduit.App([auto_repair_app.wf], database_url=db_url)
    workers = [spawn_worker("tests.apps.auto_repair_app:app", db_url, "--maintenance-interval",
                            "0.5", concurrency=8, poll_interval=0.1,
                            env={"KONDUIT_TEST_HEALED": str(healed)})
               for _ in range(3)]
    try:
        until(lambda: len(app.workers()) == 3, 30, "the three workers to come up")
        handles = [app.start("auto-repair", i) for i in range(12)]
        first = [h.wait(timeout=30) for h in handles]
        # Degraded (the service is down) and not repaired yet: repair_delay is 4 s.
        assert {r.output["image"] for r in first} == {"fallback.png"}
        assert {g for g, _ in generations(db_url, [h.id for h in handles]).values()} == {1}
        healed.write_text("the resize service is back")

        def repaired() -> int:
            return sum(len(app.outputs(h.id)) == 2 for h in handles)

        until(lambda: repaired() == len(handles), 40, "every execution to be repaired")
        # More maintenance passes of all three workers (every 0.5 s): nothing more happens.
        ids = [h.id for h in handles]
        holds(lambda: generations(db_url, ids) == {eid: (2, True) for eid in ids}, 2.0,
              "one repair per execution")
        with psycopg.connect(db_url) as conn:
            tasks = dict(conn.execute(
                "SELECT step, count(*) FROM konduit_tasks GROUP BY step").fetchall())
            takers = conn.execute(
                "SELECT count(DISTINCT a.worker_id) FROM konduit_attempts a"
                " JOIN konduit_tasks t ON t.id = a.task_id WHERE t.generation = 2").fetchone()
        assert tasks == {"transcribe": 12, "captions": 12, "cover_image": 24, "publish": 24}
        assert takers is not None and takers[0] >= 1
        for eid in ids:
            result = app.status(eid)
            assert result.status == "succeeded" and result.output["image"] == "real.png"
            assert [v.degraded for v in app.outputs(eid)] == [["cover_image"], []]

        status = konduit_cli("status", str(ids[0]), "--database-url", db_url)
        assert status.returncode == 0, status.stderr
        assert "auto-repaired at" in status.stdout and "(repair_within=1h)" in status.stdout
        with serving(create_app(database_client(db_url))) as base, \
                httpx.Client(base_url=base) as http:
            page = http.get(f"/executions/{ids[0]}").text
            assert 'id="auto-repair"' in page and "auto-repaired at" in page
            assert (app.auto_repair_status(ids[0]) or "").startswith("auto-repaired at")
    finally:
        stop_workers(workers)
        app.close()
    assert all(w.returncode == 0 for w in workers)
