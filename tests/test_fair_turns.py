"""The arithmetic of fair keys (konduit.core.fair, migration 0027), as properties over any
sequence of starts of any keys at any moving clock: a key's tasks never share a slot, so no
turn holds more than 8 of one key's tasks; a key with nothing ahead of the clock starts at the
clock's turn, however long another key's backlog; a stale row means what no row means. Then
the statement's arithmetic is checked against these functions on the database."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import konduit
from konduit.core.fair import (
    SLOTS_PER_TURN,
    FairKeyError,
    fair_key,
    slot_turn,
    stale,
    take_slots,
)

# A start: (key, executions, clock advance before it). Width 1..4 roots an execution.
starts = st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 40), st.integers(0, 5)),
                  min_size=1, max_size=40)


def replay(sequence: list[tuple[str, int, int]], width: int) -> dict[str, list[tuple[int, int]]]:
    """Each key's tasks as (slot, clock at its start), through take_slots."""
    rows: dict[str, int] = {}
    tasks: dict[str, list[tuple[int, int]]] = {}
    clock = 0
    for key, executions, advance in sequence:
        clock += advance
        firsts, rows[key] = take_slots(rows.get(key), clock, executions, width)
        tasks.setdefault(key, []).extend(
            (first + nth, clock) for first in firsts for nth in range(width))
    return tasks


@given(starts, st.integers(1, 4))
def test_a_key_never_has_more_than_8_tasks_in_a_turn(sequence, width):
    for slots in replay(sequence, width).values():
        assert len({s for s, _ in slots}) == len(slots)  # no slot twice
        turns = [slot_turn(s) for s, _ in slots]
        assert max(turns.count(t) for t in turns) <= SLOTS_PER_TURN
        # ... and never a turn before the clock of its start.
        assert all(slot_turn(s) >= clock for s, clock in slots)


@given(starts, st.integers(0, 10_000), st.integers(1, 4))
def test_a_key_with_nothing_ahead_starts_at_the_clock_whatever_the_others_hold(
        sequence, backlog, width):
    rows: dict[str, int] = {}
    clock = 0
    for key, executions, advance in sequence:
        clock += advance
        _, rows[key] = take_slots(rows.get(key), clock, executions, width)
    _, rows["a"] = take_slots(rows.get("a"), clock, backlog, width)  # a's backlog grows
    (first,), _ = take_slots(None, clock, 1, width)  # a new key, "z"
    assert slot_turn(first) == clock


@given(st.integers(0, 10**6), st.integers(0, 10**5), st.integers(1, 100), st.integers(1, 4))
def test_a_stale_row_means_no_row(next_slot, clock, executions, width):
    if stale(next_slot, clock):
        assert take_slots(next_slot, clock, executions, width) == \
            take_slots(None, clock, executions, width)
    else:
        assert take_slots(next_slot, clock, executions, width)[0][0] == next_slot


small_starts = st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 20), st.integers(0, 3)),
                        min_size=1, max_size=8)


@pytest.mark.storage
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=small_starts)
def test_the_start_statement_takes_the_slots_take_slots_says(make_app, db_url, sequence):
    """The SQL (starts.sql, konduit_slot_turn) against the Python twin, one key row at a time:
    the turns its tasks got and the key rows it left."""
    if db_url not in _APPS:
        wf = konduit.Workflow("keyed", version=1, fair_by=lambda input: input["customer"])
        wf.step(name="work")(lambda ctx: 1)
        _APPS.clear()
        _APPS[db_url] = make_app(wf)
    app = _APPS[db_url]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("TRUNCATE konduit_executions CASCADE")
        conn.execute("DELETE FROM konduit_fair_keys")
        conn.execute("INSERT INTO konduit_queue_clocks VALUES ('default', 0)"
                     " ON CONFLICT (queue) DO UPDATE SET fair_turn = 0")
    clock = 0
    expected: dict[str, list[int]] = {}
    rows: dict[str, int] = {}
    for key, executions, advance in sequence:
        if advance:
            clock += advance
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute("UPDATE konduit_queue_clocks SET fair_turn = %s", (clock,))
        app.start_many([{"workflow": "keyed", "input": {"customer": key}}] * executions)
        firsts, rows[key] = take_slots(rows.get(key), clock, executions, 1)
        expected.setdefault(key, []).extend(slot_turn(f) for f in firsts)
    with psycopg.connect(db_url) as conn:
        got = conn.execute(
            "SELECT e.fair_key, t.fair_turn FROM konduit_tasks t"
            " JOIN konduit_executions e ON e.id = t.execution_id ORDER BY e.id").fetchall()
        left = dict(conn.execute("SELECT fair_key, next_slot FROM konduit_fair_keys").fetchall())
    turns: dict[str, list[int]] = {}
    for key, turn in got:
        turns.setdefault(key, []).append(int(turn))
    assert turns == expected
    assert left == rows


_APPS: dict[str, konduit.App] = {}


def test_fair_key_names_the_workflow():
    assert fair_key(lambda value: value["c"], {"c": "acme"}, workflow="w") == "acme"
    with pytest.raises(FairKeyError, match="fair_by of workflow 'w' raised ZeroDivisionError"):
        fair_key(lambda value: 1 / 0, {}, workflow="w")
    with pytest.raises(FairKeyError, match="returned NoneType"):
        fair_key(lambda value: None, {}, workflow="w")
    with pytest.raises(FairKeyError, match="1 to 200"):
        fair_key(lambda value: "x" * 201, {}, workflow="w")
