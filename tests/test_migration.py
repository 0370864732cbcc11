"""Migrating a running execution to another version (issue 18 item 3), on a real database:
what a compatible migration changes, and what a refused one leaves as it was."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import konduit
from konduit.bench.harness import LoopThread, claim
from konduit.engine.completer import Recorded, record
from tests.support.migrating import run_ready, task_rows, versioned

pytestmark = pytest.mark.storage

V1 = {"a": [], "b": ["a"]}


@pytest.fixture
def loop(db_url: str) -> Iterator[LoopThread]:
    thread = LoopThread(db_url)
    yield thread
    thread.close()


def test_a_step_added_downstream_in_v2_runs_after_migration(make_app, loop):
    app = make_app(versioned(1, V1), versioned(2, {"a": [], "b": ["a"], "c": ["b"]}))
    handle = app.start("flow", version=1)
    assert loop.run(run_ready(loop.db, app.registry)) == ["a"]
    moved = app.migrate(handle.id, to_version=2)
    assert moved.migrated and (moved.from_version, moved.to_version) == (1, 2)
    assert moved.added == ("c",) and moved.started == () and moved.dropped == ()
    assert app.status(handle.id).version == 2
    # b's ready task now belongs to version 2: only workers serving it claim it.
    assert [(t["step"], t["workflow"]) for t in loop.run(task_rows(loop.db, handle.id))] \
        == [("a", "flow@1"), ("b", "flow@2")]
    assert loop.run(run_ready(loop.db, app.registry)) == ["b"]
    assert loop.run(run_ready(loop.db, app.registry)) == ["c"]  # the new step ran after b
    result = handle.wait(timeout=10)
    assert result.output == "c" and result.version == 2


def test_unstarted_steps_are_dropped_and_new_ones_wait_for_their_upstreams(make_app, loop):
    app = make_app(versioned(1, {"a": [], "b": ["a"], "d": ["b"]}),
                   versioned(2, {"a": [], "x": ["a"], "y": ["x"]}))
    handle = app.start("flow", version=1)  # a is ready: its task exists, it is past
    moved = app.migrate(handle.id, to_version=2)
    assert moved.dropped == ("b", "d") and moved.added == ("x", "y") and moved.started == ()
    assert sorted(s.step for s in app.steps(handle.id)) == ["a", "x", "y"]
    for step in ("a", "x", "y"):
        assert loop.run(run_ready(loop.db, app.registry)) == [step]
    assert handle.wait(timeout=10).output == "y"
    # Once b's task exists, b is past: missing in version 2, the migration is refused.
    other = app.start("flow", version=1)
    loop.run(run_ready(loop.db, app.registry))
    with pytest.raises(konduit.MigrationRefused, match="step 'b' has started") as info:
        app.migrate(other.id, to_version=2)
    assert info.value.step == "b"


def test_refusals_name_the_step_and_change_nothing(make_app, loop):
    app = make_app(versioned(1, V1), versioned(2, {"a": [], "z": [], "b": ["z"]}),
                   versioned(3, {"b": []}))
    handle = app.start("flow", version=1)
    loop.run(run_ready(loop.db, app.registry))  # a ran; b is ready
    before = loop.run(task_rows(loop.db, handle.id))
    with pytest.raises(konduit.MigrationRefused, match=r"step 'b' has started or ended but its "
                       r"upstreams differ.*\['a'\] in version 1, \['z'\] in version 2") as info:
        app.migrate(handle.id, to_version=2)
    assert info.value.step == "b"
    with pytest.raises(konduit.MigrationRefused, match="step 'a' has started or ended but does "
                       "not exist in version 3") as info:
        app.migrate(handle.id, to_version=3)
    assert info.value.step == "a"
    assert isinstance(info.value, konduit.KonduitError)
    assert app.status(handle.id).version == 1
    assert loop.run(task_rows(loop.db, handle.id)) == before  # the relabel rolled back
    with pytest.raises(konduit.WorkflowNotFound, match="version 9 is not registered"):
        app.migrate(handle.id, to_version=9)
    with pytest.raises(konduit.KonduitError, match="to_version must be"):
        app.migrate(handle.id, to_version=0)
    loop.run(run_ready(loop.db, app.registry))
    assert handle.wait(timeout=10).status == "succeeded"
    with pytest.raises(konduit.MigrationRefused, match="is succeeded: only a running"):
        app.migrate(handle.id, to_version=2)
    with pytest.raises(konduit.ExecutionNotFound):
        app.migrate("00000000-0000-0000-0000-000000000000", to_version=2)


def test_a_new_join_of_ended_branches_fires_at_migration(make_app, loop):
    graph = {"a": [], "b0": ["a"], "b1": ["a"], "j": ["b0", "b1"]}
    app = make_app(versioned(1, graph), versioned(2, {**graph, "f": ["b0", "b1"]}))
    handle = app.start("flow", version=1)
    loop.run(run_ready(loop.db, app.registry))  # a
    assert sorted(loop.run(run_ready(loop.db, app.registry))) == ["b0", "b1"]
    moved = app.migrate(handle.id, to_version=2)
    assert moved.added == ("f",) and moved.started == ("f",)
    assert sorted(loop.run(run_ready(loop.db, app.registry))) == ["f", "j"]
    assert handle.wait(timeout=10).output == {"f": "f", "j": "j"}
    steps = {s.step: s for s in app.steps(handle.id)}
    assert steps["f"].up_ok == 2 and steps["f"].fired_at is not None


def test_without_the_target_code_only_what_needs_no_code_migrates(make_app, loop):
    """Both versions registered in the database; this App has only v1's code. Rebuilding the
    join state needs none; creating a task now does, and is refused naming the step."""
    app = make_app(versioned(1, V1))
    registered = make_app(versioned(2, {"a": [], "b": ["a"], "c": ["b"], "x": ["a"]}))
    registered.start("flow")  # registers version 2 in the database
    waiting = app.start("flow", version=1)  # a is ready; x would wait for it
    moved = app.migrate(waiting.id, to_version=2)
    assert moved.migrated and set(moved.added) == {"c", "x"}
    ran = app.start("flow", version=1)
    assert loop.run(run_ready(loop.db, app.registry)) == ["a"]  # ran's (waiting's is v2's now)
    with pytest.raises(konduit.MigrationRefused, match="step 'x' would start now and this "
                       "process does not have version 2") as info:
        app.migrate(ran.id, to_version=2)
    assert info.value.step == "x"
    assert registered.migrate(ran.id, to_version=2).started == ("x",)  # an App that has it


def test_migrate_all_running_executions_of_a_version(make_app, loop):
    app = make_app(versioned(1, V1), versioned(2, {"a": [], "c": ["a"]}))
    done = app.start("flow", version=1)
    loop.run(run_ready(loop.db, app.registry))
    loop.run(run_ready(loop.db, app.registry))
    assert done.wait(timeout=10).status == "succeeded"
    past_b = app.start("flow", version=1)
    loop.run(run_ready(loop.db, app.registry))  # its b is ready: b is past, missing in v2
    fresh = app.start("flow", version=1)
    records = app.migrate_workflow("flow", 1, 2)
    assert [(r.execution_id, r.migrated, r.step) for r in records] \
        == [(past_b.id, False, "b"), (fresh.id, True, None)]
    assert "does not exist in version 2" in (records[0].reason or "")
    assert app.status(fresh.id).version == 2 and app.status(past_b.id).version == 1


def test_a_map_step_added_in_v2_fans_out_at_migration_and_kinds_must_match(make_app, loop):
    def define(version: int, m: str | None) -> konduit.Workflow:
        wf = konduit.Workflow("mapping", version=version)
        wf.step(name="a")(lambda ctx: "a")
        wf.step(name="b", after=["a"])(lambda ctx: "b")
        if m == "map":
            wf.map(name="m", after=["a"], over=lambda out: [1, 2, 3])(lambda ctx: ctx.item)
        elif m == "plain":
            wf.step(name="m", after=["a"])(lambda ctx: None)
        return wf

    app = make_app(define(1, None), define(2, "map"), define(3, "plain"))
    handle = app.start("mapping", version=1)
    assert loop.run(run_ready(loop.db, app.registry)) == ["a"]  # b is ready now
    moved = app.migrate(handle.id, to_version=2)
    assert moved.started == ("m",) and moved.added == ("m",)
    items = sorted((t.map_index, t.status) for t in app.tasks(handle.id) if t.step == "m")
    assert items == [(0, "ready"), (1, "ready"), (2, "ready")]
    with pytest.raises(konduit.MigrationRefused, match="step 'm' has started or ended as a map "
                       "step but is a plain step in version 3") as info:
        app.migrate(handle.id, to_version=3)
    assert info.value.step == "m"


def test_a_new_step_that_the_routing_already_left_out_ends_skipped(make_app, loop):
    app = make_app(versioned(1, {"a": [], "b": ["a"], "c": ["a"]}),
                   versioned(2, {"a": [], "b": ["a"], "c": ["a"], "d": ["a"], "e": ["b"]}))
    handle = app.start("flow", version=1)

    async def route_a_to_b() -> None:
        (a,) = await claim(loop.db, app.registry, 1)
        outcome, _ = await record(loop.db, app.registry, a.completion(
            "succeeded", payload_json='"a"', payload="a", routes=("b",)))
        assert outcome is Recorded.ENDED

    loop.run(route_a_to_b())  # c is skipped, b ready
    moved = app.migrate(handle.id, to_version=2)
    assert moved.skipped == ("d",) and moved.started == () and set(moved.added) == {"d", "e"}
    steps = {s.step: s for s in app.steps(handle.id)}
    assert steps["d"].status == "skipped" and steps["d"].up_skipped == 1
    assert loop.run(run_ready(loop.db, app.registry)) == ["b"]
    assert loop.run(run_ready(loop.db, app.registry)) == ["e"]
    assert handle.wait(timeout=10).outcomes == {"a": "succeeded", "b": "succeeded",
                                                "c": "skipped", "d": "skipped",
                                                "e": "succeeded"}


def test_a_policy_only_re_registration_by_another_process_does_not_refuse_migration(
        make_app, loop):
    """Another process (another registry) re-registered version 2 with a policy-only change
    after this one registered it: a policy change keeps the version (docs/changing-workflows.md),
    so migrating to it from this process works; this process creates its tasks with its own
    policy, as it does for every task. A shape change is still refused, naming it."""
    graph = {"a": [], "b": ["a"], "c": ["b"]}
    app = make_app(versioned(1, V1), versioned(2, graph))
    handle = app.start("flow", version=1)
    app.start("flow", version=2)  # this process registers version 2 (policy revision 1)
    newer = konduit.Workflow("flow", version=2)
    for step, after in graph.items():
        newer.step(name=step, after=after, retry=konduit.Retry(max_attempts=7))(
            lambda ctx: ctx.step)
    other = make_app(newer)
    other.start("flow", version=2)  # the other process re-registers its policy: revision 2
    [state] = [v for v in app.versions("flow") if v.version == 2]
    assert state.policy_revision == 2

    moved = app.migrate(handle.id, to_version=2)
    assert moved.migrated and moved.added == ("c",) and moved.to_version == 2
    while loop.run(run_ready(loop.db, app.registry)):
        pass
    result = handle.wait(timeout=10)
    assert result.version == 2 and result.output == "c"

    # A shape that differs from the registered one still needs a new version number.
    reshaped = make_app(versioned(1, V1), versioned(2, {"a": [], "b": ["a"], "d": ["b"]}))
    again = app.start("flow", version=1)
    with pytest.raises(konduit.WorkflowVersionConflict, match="step 'd' added"):
        reshaped.migrate(again.id, to_version=2)
    assert app.status(again.id).version == 1
