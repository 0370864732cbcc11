"""Typed waits for people (``wf.wait_for_input``, docs/people-in-the-loop.md): the answer is
checked against the step's model, wakes the step with the value as its output, and who
answered is kept; on real PostgreSQL with real workers."""

from __future__ import annotations

from typing import Literal

import pydantic
import pytest

import konduit
import konduit.testing
from konduit.core.fan_in import Wait, durable_steps, split_wait, upstream_of
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage

FAST = {"poll_interval": 0.1, "maintenance_interval": 0.3}


class Approval(pydantic.BaseModel):
    """What a reviewer answers."""

    decision: Literal["approve", "reject"] = pydantic.Field(description="Approve or reject")
    amount: int = pydantic.Field(default=100, ge=0, description="The amount approved")
    note: str = ""


def approval_workflow(name: str = "expense", deadline: str | None = None,
                      fallback=None) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def submit(ctx):
        return {"claim": ctx.input["claim"]}

    approve = wf.wait_for_input("approve", model=Approval, after=[submit], who="finance team",
                                deadline=deadline, fallback=fallback)

    @wf.step(after=[approve])
    def book(ctx):
        return {"booked": ctx.upstream["approve"], "outcome": ctx.outcomes["approve"]}

    return wf


def waiting_in_inbox(app: konduit.App, execution_id) -> list:
    return [i for i in app.inbox() if i.execution_id == execution_id]


def test_a_good_answer_resumes_the_execution_and_records_who(make_app):
    app = make_app(approval_workflow())
    with running_worker(app, **FAST):
        handle = app.start("expense", input={"claim": 7})
        [row] = until(lambda: waiting_in_inbox(app, handle.id), what="the inbox row")
        assert (row.workflow_name, row.step, row.who) == ("expense", "approve", "finance team")
        assert row.schema["properties"]["decision"]["enum"] == ["approve", "reject"]
        assert row.waiting_since is not None and row.deadline_at is None
        answer = app.answer(handle.id, "approve", {"decision": "approve", "amount": 40},
                            answered_by="ada")
        assert (answer.step, answer.answered_by) == ("approve", "ada")
        assert answer.value == {"decision": "approve", "amount": 40}
        result = handle.wait(timeout=30)
    assert result.output == {"booked": {"decision": "approve", "amount": 40},
                             "outcome": "succeeded"}
    [kept] = app.answers(handle.id)
    assert (kept.step, kept.answered_by, kept.value) == ("approve", "ada",
                                                         {"decision": "approve", "amount": 40})
    assert kept.answered_at is not None
    assert waiting_in_inbox(app, handle.id) == []


def test_a_bad_answer_names_the_field_and_changes_nothing(make_app):
    app = make_app(approval_workflow())
    with running_worker(app, **FAST):
        handle = app.start("expense", input={"claim": 1})
        until(lambda: waiting_in_inbox(app, handle.id), what="the inbox row")
        with pytest.raises(konduit.InputValidationError) as caught:
            app.answer(handle.id, "approve", {"decision": "maybe", "amount": -1})
        assert set(caught.value.errors) == {"decision", "amount"}
        assert "decision" in str(caught.value) and "'approve'" in str(caught.value)
        with pytest.raises(konduit.InputValidationError) as missing:
            app.answer(handle.id, "approve", {})
        assert missing.value.errors == {"decision": "field required"}
        assert waiting_in_inbox(app, handle.id), "a refused answer must leave the step waiting"
        app.answer(handle.id, "approve", Approval(decision="reject"))
        assert handle.wait(timeout=30).output["booked"] == {
            "decision": "reject", "amount": 100, "note": ""}


def test_answers_to_a_step_that_does_not_wait_are_refused(make_app):
    app = make_app(approval_workflow())
    with running_worker(app, **FAST):
        handle = app.start("expense", input={"claim": 2})
        until(lambda: waiting_in_inbox(app, handle.id), what="the inbox row")
        with pytest.raises(konduit.NotAnswerable, match="no wait_for_input step 'submit'"):
            app.answer(handle.id, "submit", {"decision": "approve"})
        with pytest.raises(konduit.NotAnswerable, match="has no step 'nope'"):
            app.answer(handle.id, "nope", {"decision": "approve"})
        app.answer(handle.id, "approve", {"decision": "approve"})
        with pytest.raises(konduit.NotAnswerable, match=r"answered or ended already|is succeeded"):
            app.answer(handle.id, "approve", {"decision": "reject"})
        handle.wait(timeout=30)
        with pytest.raises(konduit.NotAnswerable, match="is succeeded"):
            app.answer(handle.id, "approve", {"decision": "reject"})
    assert [a.value["decision"] for a in app.answers(handle.id)] == ["approve"]


def test_the_internal_event_cannot_be_sent_by_hand(make_app):
    app = make_app(approval_workflow())
    with running_worker(app, **FAST):
        handle = app.start("expense", input={"claim": 3})
        until(lambda: waiting_in_inbox(app, handle.id), what="the inbox row")
        with pytest.raises(konduit.KonduitError, match="kept for wait_for_input"):
            app.send_event("konduit-input:approve", execution_id=handle.id,
                           payload={"value": {"decision": "nonsense"}})
        handle.cancel()


def test_past_its_deadline_the_fallback_answers(make_app):
    # An hour's time limit, on the virtual clock (docs/testing.md): it skips to the deadline
    # once the execution only waits.
    app = make_app(approval_workflow(name="expense-late", deadline="1h",
                                     fallback=lambda ctx: {"decision": "reject", "by": "nobody"}))
    with konduit.testing.virtual_clock(app) as clock, running_worker(app, **FAST):
        handle = app.start("expense-late", input={"claim": 4})
        result = handle.wait(timeout=30)
        assert clock.offset > 3500
    assert result.output["booked"] == {"decision": "reject", "by": "nobody"}
    assert result.output["outcome"] == "degraded"
    with pytest.raises(konduit.NotAnswerable):
        app.answer(handle.id, "approve", {"decision": "approve"})


def test_the_code_less_client_checks_the_stored_schema(make_app, db_url):
    app = make_app(approval_workflow(name="expense-remote"))
    with running_worker(app, **FAST), konduit.Client(database_url=db_url) as client:
        handle = app.start("expense-remote", input={"claim": 5})
        until(lambda: [i for i in client.inbox() if i.execution_id == handle.id],
              what="the inbox row, read without code")
        with pytest.raises(konduit.InputValidationError) as caught:
            client.answer(handle.id, "approve", {"decision": "approve", "amount": "lots"})
        assert list(caught.value.errors) == ["amount"]
        client.answer(handle.id, "approve", {"decision": "approve"}, answered_by="remote")
        assert handle.wait(timeout=30).output["booked"]["decision"] == "approve"
        assert client.answers(handle.id)[0].answered_by == "remote"


def test_definitions_are_checked_and_other_specs_keep_their_hash():
    wf = konduit.Workflow("defs", version=1)
    with pytest.raises(konduit.WorkflowDefinitionError, match="model= must be"):
        wf.wait_for_input("ask", model=int)
    with pytest.raises(konduit.WorkflowDefinitionError, match="kept for wait_for_input"):
        wf.wait_for_event("konduit-input:ask")
    plain = konduit.Workflow("plain", version=1)
    plain.wait_for_event("go", name="go")
    assert "input" not in plain.spec.spec_json["steps"][0]["wait"]


def test_a_wait_for_input_is_a_durable_wait_and_never_a_straggler():
    wf = konduit.Workflow("joined", version=1)

    @wf.step()
    def prepare(ctx):
        return 1

    ask = wf.wait_for_input("ask", model=Approval, who="ops")

    @wf.step(after=[prepare, ask])
    def join(ctx):
        return 2

    spec = wf.spec.spec_json
    assert spec["steps"][1]["wait"]["input"]["who"] == "ops"
    durable = durable_steps(spec)
    assert "ask" in durable and "prepare" not in durable
    # A person answered after an hour, the other branch took a second: the fan-in rule judges
    # the second only, and the person is no straggler of the join (docs/alerts.md).
    judged = split_wait(Wait(3600.0, "ask", False, "e"), upstream_of(spec, "join"),
                        {"prepare": 1.0, "ask": 3600.0}, durable)
    assert (judged.seconds, judged.straggler) == (1.0, "prepare")
    assert (judged.durable, judged.durable_seconds) == ("ask", 3599.0)


def test_the_command_line_lists_the_inbox_and_answers(make_app, db_url):
    import json

    from tests.test_cli import assert_clean_error, konduit_cli

    app = make_app(approval_workflow(name="expense-cli"))
    with running_worker(app, **FAST):
        other = app.start("expense-cli", input={"claim": 5})
        handle = app.start("expense-cli", input={"claim": 6})
        until(lambda: waiting_in_inbox(app, handle.id), what="the inbox row")
        until(lambda: waiting_in_inbox(app, other.id), what="the other's inbox row")
        listed = konduit_cli("inbox", "--database-url", db_url)
        assert listed.returncode == 0, listed.stderr
        assert "expense-cli" in listed.stdout and "finance team" in listed.stdout
        as_json = json.loads(konduit_cli("inbox", "--json", "--database-url", db_url).stdout)
        assert {r["execution_id"] for r in as_json} == {str(handle.id), str(other.id)}
        mine = json.loads(konduit_cli("inbox", "--json", "--execution", str(handle.id)[:13],
                                      "--database-url", db_url).stdout)
        assert [(r["execution_id"], r["step"]) for r in mine] == [(str(handle.id), "approve")]
        assert_clean_error(konduit_cli("answer", str(handle.id), "approve", "--value",
                                       '{"decision": "approve", "amount": "x"}',
                                       "--database-url", db_url), "amount")
        done = konduit_cli("answer", str(handle.id)[-8:], "approve", "--value",
                           '{"decision": "approve"}', "--as", "lin", "--json",
                           "--database-url", db_url)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["answered_by"] == "lin"
        # konduit status waits for it, then shows who answered, as the API's detail does.
        shown = konduit_cli("status", str(handle.id), "--wait", "--timeout", "60",
                            "--database-url", db_url)
        assert shown.returncode == 0, shown.stderr
        assert "answered approve by lin" in " ".join(shown.stdout.split())
        shown = json.loads(konduit_cli("status", str(handle.id), "--json",
                                       "--database-url", db_url).stdout)
        assert shown["status"] == "succeeded"
        assert [(a["step"], a["answered_by"], a["value"]) for a in shown["answers"]] == [
            ("approve", "lin", {"decision": "approve"})]
        assert handle.wait(timeout=30).output["booked"]["decision"] == "approve"
        # --wait on one still waiting: --timeout passes, exit 124, the execution goes on.
        waited = konduit_cli("status", str(other.id), "--wait", "--timeout", "0.5",
                             "--database-url", db_url)
        assert waited.returncode == 124, (waited.stdout, waited.stderr)
        assert waiting_in_inbox(app, other.id)
        app.cancel(other.id)
        failed = konduit_cli("status", str(other.id), "--wait", "--json",
                             "--database-url", db_url)
        assert failed.returncode == 1 and json.loads(failed.stdout)["status"] == "cancelled"
    assert_clean_error(konduit_cli("answer", str(handle.id), "approve", "--value",
                                   '{"decision": "approve"}', "--database-url", db_url),
                       "is succeeded")


def test_of_two_answers_at_once_exactly_one_is_taken(make_app, db_url):
    import asyncio

    app = make_app(approval_workflow(name="expense-race"))

    async def race(execution_id) -> list:
        async with konduit.AsyncClient(db_url) as a, konduit.AsyncClient(db_url) as b:
            return await asyncio.gather(
                a.answer(execution_id, "approve", {"decision": "approve"}, answered_by="a"),
                b.answer(execution_id, "approve", {"decision": "reject"}, answered_by="b"),
                return_exceptions=True)

    with running_worker(app, **FAST):
        handle = app.start("expense-race", input={"claim": 8})
        until(lambda: waiting_in_inbox(app, handle.id), what="the inbox row")
        results = asyncio.run(race(handle.id))
        taken = [r for r in results if isinstance(r, konduit.records.Answer)]
        refused = [r for r in results if isinstance(r, konduit.NotAnswerable)]
        assert (len(taken), len(refused)) == (1, 1), results
        booked = handle.wait(timeout=30).output["booked"]
    [kept] = app.answers(handle.id)
    assert (kept.answered_by, kept.value) == (taken[0].answered_by, booked)
