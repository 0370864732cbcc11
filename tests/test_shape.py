"""The shape/policy split of a definition (core/shape.py): which changes need a new version,
and how a shape change is described."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import konduit
from konduit import Join, Retry
from konduit.core import shape


def _diamond(*, retry: Retry | None = None, join: Join | None = None, queue: str = "default",
             deadline: str | None = None, extra: bool = False, map_b: bool = False
             ) -> konduit.Workflow:
    wf = konduit.Workflow("diamond", version=1)

    @wf.step(retry=retry, queue=queue, deadline=deadline)
    def a(ctx): return 1

    if map_b:
        @wf.map(after=[a], over=lambda x: [x])
        def b(ctx): return 2
    else:
        @wf.step(after=[a])
        def b(ctx): return 2

    @wf.step(after=[a])
    def c(ctx): return 3

    @wf.step(after=[b, c], join=join)
    def d(ctx): return 4

    if extra:
        @wf.step(after=[d])
        def e(ctx): return 5
    return wf


def test_a_policy_change_keeps_the_shape_and_changes_the_policy() -> None:
    plain = _diamond().spec
    for changed in (_diamond(retry=Retry(max_attempts=7)).spec, _diamond(queue="gpu").spec,
                    _diamond(deadline="30s").spec):
        assert changed.spec_hash != plain.spec_hash
        assert changed.shape_hash == plain.shape_hash
        assert changed.policy_json != plain.policy_json
        assert shape.shape_diff(shape.shape_of(plain.spec_json),
                                shape.shape_of(changed.spec_json)) == []


def test_shape_changes_are_named() -> None:
    plain = shape.shape_of(_diamond().spec.spec_json)

    def diff(**kw: Any) -> list[str]:
        return shape.shape_diff(plain, shape.shape_of(_diamond(**kw).spec.spec_json))

    assert diff(extra=True) == ["step 'e' added", "edge d->e added"]
    assert shape.shape_diff(shape.shape_of(_diamond(extra=True).spec.spec_json), plain) == [
        "step 'e' removed", "edge d->e removed"]
    assert diff(join=Join.quorum(2)) == [
        "join policy of 'd' changed from all_succeeded to quorum(2)"]
    assert diff(map_b=True) == ["step 'b' changed from a task to a map"]


def test_an_edge_moved_is_named_both_ways() -> None:
    one = konduit.Workflow("moved", version=1)
    one.step(name="a")(lambda ctx: 1)
    one.step(name="b")(lambda ctx: 1)
    one.step(name="c", after=["a"])(lambda ctx: 1)
    two = konduit.Workflow("moved", version=1)
    two.step(name="a")(lambda ctx: 1)
    two.step(name="b")(lambda ctx: 1)
    two.step(name="c", after=["b"])(lambda ctx: 1)
    assert shape.shape_diff(shape.shape_of(one.spec.spec_json),
                            shape.shape_of(two.spec.spec_json)) == [
        "edge b->c added", "edge a->c removed"]


def test_wait_kinds_are_shape_and_their_settings_policy() -> None:
    def make(kind: str, event: str = "approved") -> dict[str, Any]:
        wf = konduit.Workflow("waits", version=1)
        wf.step(name="a")(lambda ctx: 1)
        if kind == "event":
            wf.wait_for_event(event, name="w", after=["a"])
        else:
            wf.sleep(name="w", duration="1h", after=["a"])
        return wf.spec.spec_json

    assert shape.shape_hash(make("event")) == shape.shape_hash(make("event", "other"))
    assert shape.shape_diff(shape.shape_of(make("event")), shape.shape_of(make("timer"))) == [
        "wait kind of 'w' changed from event to timer"]


# -- properties over random shapes ---------------------------------------------------------------

_names = st.sampled_from(["a", "b", "c", "d", "e", "f"])
_joins = st.sampled_from([{"kind": "all_succeeded", "k": None}, {"kind": "all_done", "k": None},
                          {"kind": "required", "k": None}, {"kind": "quorum", "k": 2}])


@st.composite
def shapes(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(_names, min_size=1, max_size=6, unique=True))
    steps = {}
    for i, name in enumerate(names):
        steps[name] = {"after": sorted(draw(st.sets(st.sampled_from(names[:i]))) if i else []),
                       "join": draw(_joins), "required": draw(st.booleans()),
                       "map": draw(st.booleans()),
                       "wait": draw(st.sampled_from([None, "event", "timer", "child"]))}
    return {"steps": steps}


@settings(max_examples=200, deadline=None)
@given(shapes(), shapes())
def test_the_diff_is_empty_exactly_when_the_shapes_are_equal(a: dict[str, Any],
                                                            b: dict[str, Any]) -> None:
    assert (shape.shape_diff(a, b) == []) == (a == b)
    assert shape.shape_diff(a, a) == []


@settings(max_examples=200, deadline=None)
@given(shapes(), shapes())
def test_the_diff_backwards_swaps_added_and_removed(a: dict[str, Any], b: dict[str, Any]) -> None:
    forward, backward = shape.shape_diff(a, b), shape.shape_diff(b, a)
    assert len(forward) == len(backward)
    swap = {"added": "removed", "removed": "added"}
    moved = sorted(" ".join(swap.get(w, w) for w in line.split(" "))
                   for line in forward if line.endswith(("added", "removed")))
    assert moved == sorted(line for line in backward if line.endswith(("added", "removed")))
    # Every step added or removed is named, once.
    for name in set(a["steps"]) ^ set(b["steps"]):
        assert sum(f"step {name!r} " in line for line in forward) >= 1


def test_a_stored_revision_gives_its_backoff_and_keeps_the_workers_code() -> None:
    from konduit.core.outcome import StepPolicy
    from konduit.worker.created_with import created_policy

    own = StepPolicy(Retry(max_attempts=5, base="10ms", non_retryable=(KeyError,)), True, False)
    stored = {"retry": Retry(max_attempts=2, backoff="fixed", base="30s", jitter=False).to_spec(),
              "fallback_on_failure": True}
    made = created_policy(own, stored)
    assert (made.retry.max_attempts, made.retry.backoff, made.retry.base) == (2, "fixed", 30.0)
    assert made.retry.non_retryable == (KeyError,) and made.fallback_on_failure
    # Without a fallback in this worker's code there is nothing to fall back on.
    assert not created_policy(StepPolicy(own.retry), stored).fallback_on_failure
    # A stored retry this version cannot read leaves the worker's own.
    assert created_policy(own, {"retry": {"max_attempts": "x"}}).retry is own.retry
