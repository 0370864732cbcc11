"""Hostile payloads meet a named limit, never a bare RecursionError, a driver error or an OOM.

Inputs, outputs and map items all go through one encoder (``canonical_json``): too deep, too
large, or holding something PostgreSQL's jsonb refuses is a :class:`konduit.PayloadError` naming
the payload and the limit. A map step fans out to at most ``max_items`` items.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import konduit
from konduit.core.payloads import DEFAULT_MAX_BYTES, MAX_DEPTH, canonical_json, json_depth
from konduit.core.workflow import DEFAULT_MAX_MAP_ITEMS
from tests.support.workers import running_worker

WAIT = 30.0


def nested(levels: int) -> Any:
    """A value ``levels`` arrays deep, built without recursion (as a hostile client would)."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def nested_objects(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


# -- the encoder -------------------------------------------------------------------------------


def test_depth_limit_is_exact_and_names_the_payload() -> None:
    canonical_json(nested(MAX_DEPTH), what="x")
    canonical_json(nested_objects(MAX_DEPTH), what="x")
    for levels in (MAX_DEPTH + 1, 900, 10_000):  # 900: json.dumps copes, the check must not
        for value in (nested(levels), nested_objects(levels)):
            with pytest.raises(konduit.PayloadError) as info:
                canonical_json(value, what="output of step 'x'")
            assert "output of step 'x'" in str(info.value)
            assert f"limit of {MAX_DEPTH} levels" in str(info.value)


def test_brackets_inside_strings_are_not_nesting() -> None:
    text = canonical_json({"a": "[" * 5000, "b": ["]" * 40 + '\\"[{'], "c": "\\"}, what="x")
    assert json_depth(text) == 2


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


_tricky_text = st.text(alphabet='[]{}"\\ab\n\u00e9\u2028', max_size=6)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _tricky_text,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_tricky_text, kids, max_size=4),
    max_leaves=60,
)


@settings(max_examples=400, deadline=None)
@given(_json_values)
def test_depth_of_any_json_text_matches_the_value(value: Any) -> None:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    assert json_depth(text) == _depth(value)


def test_strings_postgres_refuses_are_payload_errors() -> None:
    for bad in ("\ud800", "a\udc00b", "\ud83d\ude00\ud800", "\ud800\ud800", "\x00"):
        with pytest.raises(konduit.PayloadError) as info:
            canonical_json({"k": bad}, what="input of workflow 'w'")
        assert "input of workflow 'w'" in str(info.value)
    # Paired surrogates and escaped backslashes before a 'u' are ordinary text.
    canonical_json(["\U0001f600", "\\ud800", "\\\\u0000"], what="x")


def test_size_limit_is_named() -> None:
    with pytest.raises(konduit.PayloadError) as info:
        canonical_json("x" * 2000, what="input of workflow 'w'", max_bytes=1000)
    assert "over the limit of 1000 bytes" in str(info.value)


# -- the engine --------------------------------------------------------------------------------

storage = pytest.mark.storage


def one_step(name: str, handler: Any, **options: Any) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)
    wf.step(**options)(handler)
    return wf


def echo(ctx: Any) -> Any:
    return ctx.input


@storage
@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 10_000])
def test_deep_input_is_refused_by_start(make_app: Any, levels: int) -> None:
    app = make_app(one_step("deep-in", echo))
    with pytest.raises(konduit.PayloadError) as info:
        app.start("deep-in", input={"doc": nested(levels)})
    assert "input of workflow 'deep-in'" in str(info.value)
    assert f"limit of {MAX_DEPTH} levels" in str(info.value)
    assert app.list() == []  # nothing was stored
    # The deepest allowed input is stored and read back intact.
    ok = nested(MAX_DEPTH - 1)
    with running_worker(app, concurrency=1):
        assert app.start("deep-in", input={"doc": ok}).wait(timeout=WAIT).output == {"doc": ok}


@storage
def test_huge_input_names_the_limit(make_app: Any) -> None:
    app = make_app(one_step("huge-in", echo), max_payload_bytes=10_000)
    with pytest.raises(konduit.PayloadError) as info:
        app.start("huge-in", input={"blob": "x" * 20_000})
    assert "input of workflow 'huge-in'" in str(info.value)
    assert "over the limit of 10000 bytes" in str(info.value)
    assert app.list() == []


@storage
def test_deep_or_huge_output_fails_the_attempt_and_the_worker_goes_on(
    make_app: Any, db_url: str
) -> None:
    calls: list[str] = []
    wf = konduit.Workflow("bad-outputs", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=3))
    def produce(ctx: Any) -> Any:
        calls.append(ctx.input)
        if ctx.input == "deep":
            return nested(10_000)
        if ctx.input == "huge":
            return "x" * 20_000
        return "fine"

    app = make_app(wf, max_payload_bytes=10_000)
    with running_worker(app, concurrency=1):
        deep = app.start("bad-outputs", input="deep")
        with pytest.raises(konduit.ExecutionFailed) as deep_info:
            deep.wait(timeout=WAIT)
        huge = app.start("bad-outputs", input="huge")
        with pytest.raises(konduit.ExecutionFailed) as huge_info:
            huge.wait(timeout=WAIT)
        # The same worker serves the next execution.
        assert app.start("bad-outputs", input="ok").wait(timeout=WAIT).output == "fine"
    assert calls == ["deep", "huge", "ok"]  # each failed at its first attempt: never retried
    for info, limit in ((deep_info, f"limit of {MAX_DEPTH} levels"),
                        (huge_info, "over the limit of 10000 bytes")):
        result = info.value.result
        assert result.outcomes == {"produce": "failed"}
        assert "output of step 'produce'" in (result.error or "")
        assert limit in (result.error or "")
    with psycopg.connect(db_url) as conn:
        attempts = conn.execute(
            "SELECT e.input #>> '{}', a.attempt, a.outcome FROM konduit_attempts a"
            " JOIN konduit_tasks t ON t.id = a.task_id"
            " JOIN konduit_executions e ON e.id = t.execution_id ORDER BY a.id"
        ).fetchall()
    assert attempts == [("deep", 1, "failed"), ("huge", 1, "failed"), ("ok", 1, "succeeded")]


def _map_workflow(name: str, over: Any, **options: Any) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def source(ctx: Any) -> Any:
        return ctx.input

    @wf.map(after=[source], over=over, **options)
    def each(ctx: Any) -> Any:
        return ctx.item

    return wf


@storage
@pytest.mark.parametrize(
    ("over", "expected"),
    [
        (lambda out: [1, nested(10_000)], f"item 1 is nested deeper than the limit of {MAX_DEPTH}"),
        (lambda out: [1, 2, "x" * (DEFAULT_MAX_BYTES + 1)],
         f"item 2 is {DEFAULT_MAX_BYTES + 3} bytes, over the limit of {DEFAULT_MAX_BYTES} bytes"),
        (lambda out: ["ok", "\ud800"], "item 1 contains an unpaired UTF-16 surrogate"),
    ],
    ids=["deep", "huge", "surrogate"],
)
def test_map_item_postgres_cannot_take_fails_the_execution(
    make_app: Any, over: Any, expected: str
) -> None:
    app = make_app(_map_workflow("bad-items", over))
    handle = app.start("bad-items")
    with running_worker(app, concurrency=2), pytest.raises(konduit.ExecutionFailed) as info:
        handle.wait(timeout=WAIT)
    error = info.value.result.error or ""
    assert "map step 'each' cannot fan out" in error
    assert expected in error
    assert not [t for t in app.tasks(handle.id) if t.step == "each"]  # none half-created


@storage
def test_map_items_are_bounded_by_the_apps_payload_limit(make_app: Any) -> None:
    """The App's max_payload_bytes bounds each item a worker fans out, not the default 16 MB:
    a small upstream output that ``over()`` expands into big items fails the fan-out."""
    wf = _map_workflow("app-limit-items", lambda out: ["x" * out, "y" * 10])
    app = make_app(wf, max_payload_bytes=10_000)
    fits = app.start("app-limit-items", input=9_000)
    too_big = app.start("app-limit-items", input=20_000)
    with running_worker(app, concurrency=2):
        assert fits.wait(timeout=WAIT).output == ["x" * 9_000, "y" * 10]
        with pytest.raises(konduit.ExecutionFailed) as info:
            too_big.wait(timeout=WAIT)
    error = info.value.result.error or ""
    assert "map step 'each' cannot fan out" in error
    assert "item 0 is 20,002 bytes" in error or "item 0 is 20002 bytes" in error, error
    assert "10000" in error.replace(",", ""), error


@storage
def test_map_over_its_item_limit_fails_naming_step_and_limit(make_app: Any) -> None:
    capped = _map_workflow("capped", lambda out: range(out), max_items=100)
    endless = konduit.Workflow("endless", version=1)

    @endless.step()
    def start(ctx: Any) -> None:
        return None

    @endless.map(after=[start], over=lambda out: itertools.count(), max_items=1000, name="each")
    def each(ctx: Any) -> Any:
        return ctx.item

    app = make_app(capped, endless)
    at_limit = app.start("capped", input=100)
    over_limit = app.start("capped", input=101)
    forever = app.start("endless")
    with running_worker(app, concurrency=8):
        assert at_limit.wait(timeout=WAIT).output == list(range(100))
        for handle, limit in ((over_limit, 100), (forever, 1000)):
            with pytest.raises(konduit.ExecutionFailed) as info:
                handle.wait(timeout=WAIT)
            error = info.value.result.error or ""
            assert "map step 'each' cannot fan out" in error
            assert f"more than {limit:,} items" in error
            assert "max_items" in error


def test_max_items_is_checked_at_definition() -> None:
    wf = konduit.Workflow("bad-max-items", version=1)

    @wf.step()
    def source(ctx: Any) -> None:
        return None

    for bad in (0, -1, 2.5, True):
        with pytest.raises(konduit.WorkflowDefinitionError, match="max_items"):
            wf.map(after=[source], over=list, max_items=bad, name="m")(echo)
    with pytest.raises(konduit.WorkflowDefinitionError, match="map steps only"):
        wf.sequence(konduit.step(echo, max_items=3), after=[source])
    wf.map(after=[source], over=list, name="default")(echo)
    assert wf.compile()["default"].max_items == DEFAULT_MAX_MAP_ITEMS
