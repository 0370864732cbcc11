"""Pure decisions of durable waits: event matching (property-tested against the SQL that says
the same), and the definitions of wait steps."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import konduit
from konduit.core.waits import Armed, WaitSpec, event_matches
from konduit.db.queries import all_queries

names = st.sampled_from(["approved", "rejected"])
keys = st.one_of(st.none(), st.sampled_from(["k1", "k2"]))
executions = st.sampled_from([uuid.UUID(int=1), uuid.UUID(int=2)])


@given(names, keys, st.one_of(st.none(), executions), names, keys, executions)
def test_matching_rules(e_name, e_key, e_exec, t_name, t_key, t_exec):
    matched = event_matches(e_name, e_key, e_exec, t_name, t_key, t_exec)
    if matched:
        assert e_name == t_name
        assert e_key is not None or e_exec is not None  # an event always names its target
        assert e_key is None or e_key == t_key
        assert e_exec is None or e_exec == t_exec
    elif e_name == t_name and (e_key is not None or e_exec is not None):
        assert (e_key is not None and e_key != t_key) or (e_exec is not None and e_exec != t_exec)


def test_an_event_with_neither_key_nor_execution_matches_nothing():
    assert not event_matches("a", None, None, "a", None, uuid.UUID(int=1))


@pytest.mark.storage
@settings(max_examples=60, deadline=None)
@given(e_name=names, e_key=keys, e_exec=st.one_of(st.none(), executions), t_name=names,
       t_key=keys, t_exec=executions)
def test_sql_says_the_same(admin_url, e_name, e_key, e_exec, t_name, t_key, t_exec):
    """event_find_pending_for_task's predicate, evaluated by PostgreSQL, agrees with the rule."""
    if e_key is None and e_exec is None:
        return  # refused before any SQL (send_event needs one)
    sql = all_queries()["event_find_pending_for_task"].sql
    # The server's own clock: the admin database has no konduit functions (and the event is
    # not expiring: the rule is the match).
    where = sql.split("WHERE", 1)[1].split("ORDER BY", 1)[0].replace(
        "konduit_clock_timestamp()", "clock_timestamp()").replace("konduit_now()", "now()")
    check = (f"SELECT EXISTS (SELECT 1 FROM (SELECT %(e_name)s::text AS name, %(e_key)s::text "
             f"AS key, %(e_exec)s::uuid AS execution_id, NULL::timestamptz AS consumed_at, "
             f"NULL::timestamptz AS expires_at) ev "  # not expiring: the rule is the match
             f"WHERE {where})")
    params = {"e_name": e_name, "e_key": e_key, "e_exec": e_exec, "name": t_name,
              "key": t_key, "execution_id": t_exec}
    with psycopg.connect(admin_url) as conn:  # no table needed: the event is a literal row
        row = conn.execute(check, params).fetchone()
    assert row is not None
    assert row[0] == event_matches(e_name, e_key, e_exec, t_name, t_key, t_exec)


def test_wait_steps_are_part_of_the_spec_hash():
    a, b = konduit.Workflow("w", version=1), konduit.Workflow("w", version=1)
    a.wait_for_event("approved", name="review")
    b.wait_for_event("rejected", name="review")
    assert a.spec.spec_hash != b.spec.spec_hash
    assert a.spec["review"].to_spec()["wait"] == {"kind": "event", "event": "approved",
                                                  "keyed": False}


def test_bad_wait_definitions_name_the_step():
    wf = konduit.Workflow("bad", version=1)
    with pytest.raises(konduit.WorkflowDefinitionError, match="exactly one of"):
        wf.sleep(name="pause")
    with pytest.raises(konduit.WorkflowDefinitionError, match="exactly one of"):
        wf.sleep(name="pause", duration="1s", until=lambda ctx: datetime.now(UTC))
    with pytest.raises(konduit.WorkflowDefinitionError, match="duration"):
        wf.sleep(name="pause", duration="soon")
    with pytest.raises(konduit.WorkflowDefinitionError, match="invalid event name"):
        wf.wait_for_event("", name="x")
    with pytest.raises(konduit.WorkflowDefinitionError, match="workflow="):
        wf.subworkflow(name="c", workflow="")


def test_arming_handlers_check_what_user_lambdas_return():
    wf = konduit.Workflow("arming", version=1)
    wf.sleep(name="naive", until=lambda ctx: datetime(2030, 1, 1))
    wf.sleep(name="aware", until=lambda ctx: datetime(2030, 1, 1, tzinfo=UTC) + timedelta(hours=1))
    wf.wait_for_event("approved", name="keyed", key=lambda ctx: {"not": "a string"})
    wf.wait_for_event("approved", name="int_key", key=lambda ctx: 42)
    spec = wf.spec
    with pytest.raises(konduit.NonRetryableError, match="naive"):
        spec["naive"].handler(None)
    assert spec["aware"].handler(None) == Armed("timer", until=datetime(2030, 1, 1, 1, tzinfo=UTC))
    with pytest.raises(konduit.NonRetryableError, match="string"):
        spec["keyed"].handler(None)
    assert spec["int_key"].handler(None).key == "42"
    assert isinstance(spec["keyed"].wait, WaitSpec)
