"""Fan-in wait alerts leave durable waits out: a join behind an approval (an event wait) is not
held by a straggler, one behind a slow branch is; thresholds per workflow and per join."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

import konduit
from konduit.db.database import Database
from konduit.observe.stats import Stats, load_stats
from tests.support.waiting import until
from tests.support.workers import running_worker
from tests.test_alerts import evaluate

pytestmark = [pytest.mark.storage]

WAIT = 3.0  # seconds the approval and the straggler take, past the 1 s thresholds below
RULE = {"fan_in_wait": 20.0, "consecutive": 1}  # the worker's default threshold is not reached


def load(db_url: str) -> Stats:
    async def go() -> Stats:
        db = Database(db_url, min_size=1, max_size=2)
        await db.open()
        try:
            return await load_stats(db, consecutive=1)
        finally:
            await db.close()

    return asyncio.run(go())


def approval_workflow() -> konduit.Workflow:
    wf = konduit.Workflow("fan-in-approval", version=1, alert_fan_in_wait="1s")

    @wf.step()
    def draft(ctx: konduit.Context) -> str:
        return "draft"

    approved = wf.wait_for_event("approved", after=[draft])

    @wf.step(after=[approved])
    def stamp(ctx: konduit.Context) -> str:  # behind the wait: no straggler either
        return "stamped"

    @wf.step(after=[draft])
    def check(ctx: konduit.Context) -> str:
        return "checked"

    @wf.step(after=[stamp, check])
    def publish(ctx: konduit.Context) -> str:
        return "published"

    return wf


def straggler_workflow() -> konduit.Workflow:
    wf = konduit.Workflow("fan-in-straggler", version=1)

    @wf.step()
    def draft(ctx: konduit.Context) -> str:
        return "draft"

    @wf.step(after=[draft])
    def slow(ctx: konduit.Context) -> str:
        time.sleep(WAIT)
        return "slow"

    @wf.step(after=[draft])
    def check(ctx: konduit.Context) -> str:
        return "checked"

    @wf.step(after=[slow, check], join=konduit.Join.all_succeeded(alert_fan_in_wait="1s"))
    def publish(ctx: konduit.Context) -> str:
        return "published"

    return wf


def test_a_join_behind_an_approval_raises_no_fan_in_alert_and_a_straggler_does(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    approval, straggler = approval_workflow(), straggler_workflow()
    app = make_app(approval, straggler)
    with running_worker(app, alert_interval=0):
        waiting = app.start(approval.name)
        until(lambda: app.status(waiting.id).outcomes.get("check") == "succeeded", 30,
              "the branch beside the approval")
        time.sleep(WAIT)  # a person takes a while to approve: the join waits past its 1 s
        # Still waiting for the approval, past the workflow's threshold: no page.
        assert evaluate(db_url, app.registry, **RULE).findings == []
        assert app.send_event("approved", execution_id=waiting.id) in ("woke", "stored")
        assert waiting.wait(timeout=30).status == "succeeded"
        assert evaluate(db_url, app.registry, **RULE).findings == []
        # Its own kind of wait, shown by the stats (never counted by the rule).
        stats = load(db_url)
        [durable] = stats.durable_waits
        assert (durable.workflow, durable.join, durable.durable) == (
            approval.name, "publish", "stamp")
        assert durable.seconds > 1.0 and durable.execution_id == str(waiting.id)
        assert stats.alerts == []

        assert app.start(straggler.name).wait(timeout=30).status == "succeeded"
        [raised] = evaluate(db_url, app.registry, **RULE).raised
    assert (raised.kind, raised.subject) == ("fan_in_wait", "fan-in-straggler/publish")
    assert raised.details["straggler"] == "slow"
    assert raised.details["threshold_seconds"] == 1.0 and raised.details["waits"][0] > 1.0
    assert raised.details["durable_waits"] == [0.0]
    assert not app.alerts(kind="fan_in_wait", workflow=approval.name, include_resolved=True)


# -- the pure parts --------------------------------------------------------------------------------


def test_split_wait_takes_out_what_durable_branches_held_alone() -> None:
    from konduit.core.fan_in import Wait, durable_steps, split_wait

    spec = approval_workflow().spec.spec_json
    durable = durable_steps(spec)
    assert durable == {"approved", "stamp", "publish"}  # publish too: it runs behind the wait
    # The approval came 3 s after `check` ended: all of it a durable wait.
    fired = split_wait(Wait(3.0, "stamp", False, "e1"), ("stamp", "check"),
                       {"check": 0.0, "stamp": 3.0, "draft": -0.1}, durable)
    assert (fired.seconds, fired.durable_seconds, fired.durable, fired.straggler) == (
        0.0, 3.0, "stamp", None)
    # `check` straggled 2 s past a quick approval: a straggler, nothing durable.
    slow = split_wait(Wait(2.0, "check", False), ("stamp", "check"),
                      {"stamp": 0.0, "check": 2.0}, durable)
    assert (slow.seconds, slow.durable_seconds, slow.straggler) == (2.0, 0.0, "check")
    # Still waiting on both: the branch still running counts up to now.
    both = split_wait(Wait(5.0, None, True), ("stamp", "check"), {"stamp": None, "check": None},
                      durable)
    assert (both.seconds, both.straggler) == (5.0, "check")
    # A join without a durable branch keeps its wait.
    plain = Wait(4.0, "slow", False)
    assert split_wait(plain, ("slow", "check"), {}, durable_steps(
        straggler_workflow().spec.spec_json)) is plain


def test_fan_in_thresholds_are_policy_checked_when_defined() -> None:
    from konduit.core import shape
    from konduit.core.fan_in import fan_in_threshold
    from konduit.engine.stored import spec_from_rows

    approval, straggler = approval_workflow().spec, straggler_workflow().spec
    assert fan_in_threshold(approval.spec_json, "publish", 20.0) == 1.0  # the workflow's
    assert fan_in_threshold(straggler.spec_json, "publish", 20.0) == 1.0  # the join's
    assert fan_in_threshold(straggler.spec_json, "slow", 20.0) == 20.0  # the worker's
    # Policy, not shape: the same shape as without them, and in the stored policy.
    bare = konduit.Workflow("fan-in-straggler", version=1)
    for name, after in (("draft", []), ("slow", ["draft"]), ("check", ["draft"]),
                        ("publish", ["slow", "check"])):
        bare.step(name=name, after=after)(lambda ctx: None)
    assert bare.spec.shape_hash == straggler.shape_hash
    assert bare.spec.spec_hash != straggler.spec_hash
    assert shape.policy_of(straggler.spec_json)["steps"]["publish"]["alert_fan_in_wait"] == 1.0
    assert shape.policy_of(approval.spec_json)["alert_fan_in_wait"] == 1.0
    # A reader without the code knows them (the stored definition).
    row = {"name": straggler.name, "version": 1, "spec": straggler.spec_json,
           "spec_hash": straggler.spec_hash, "input_schema": None, "start_keys": None}
    stored = spec_from_rows(row, [])
    assert stored["publish"].join.alert_fan_in_wait == 1.0
    row = {**row, "name": approval.name, "spec": approval.spec_json}
    assert spec_from_rows(row, []).alert_fan_in_wait == 1.0


def test_a_bad_fan_in_threshold_fails_the_definition_naming_the_workflow_and_step() -> None:
    with pytest.raises(konduit.WorkflowDefinitionError, match="fan-in-bad") as failed:
        konduit.Workflow("fan-in-bad", alert_fan_in_wait="soon")
    assert "alert_fan_in_wait" in str(failed.value)
    with pytest.raises(konduit.WorkflowDefinitionError, match="positive"):
        konduit.Workflow("fan-in-bad", alert_fan_in_wait=0)
    wf = konduit.Workflow("fan-in-bad")
    wf.step(name="a")(lambda ctx: None)
    wf.step(name="b")(lambda ctx: None)
    with pytest.raises(konduit.WorkflowDefinitionError, match="'join'") as failed:
        wf.step(name="join", after=["a", "b"],
                join=konduit.Join.quorum(1, alert_fan_in_wait="-3s"))(lambda ctx: None)
    assert "fan-in-bad" in str(failed.value)
