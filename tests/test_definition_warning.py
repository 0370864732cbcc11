"""The definition-time warning for an optional branch with no deadline under ``Join.required()``
(it can hold the join forever), and the demo's deadlines following seed 004's 10-45 s clamp."""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

import konduit
from konduit.core.definition_warnings import unbounded_optional_branches


def _noop(ctx: konduit.Context) -> None:
    return None


def _caught() -> warnings.catch_warnings[list[warnings.WarningMessage]]:
    return warnings.catch_warnings(record=True)


def test_an_optional_branch_without_deadline_under_required_warns_at_the_users_line() -> None:
    with _caught() as caught:
        warnings.simplefilter("always")
        wf = konduit.Workflow("warned", version=1)

        @wf.step()
        def root(ctx: konduit.Context) -> int:
            return 1

        @wf.step(after=[root], required=False, fallback=lambda ctx: "fallback")
        def cover(ctx: konduit.Context) -> str:
            return "image"

        @wf.step(after=[root])
        def captions(ctx: konduit.Context) -> str:
            return "captions"

        @wf.step(after=[cover, captions], join=konduit.Join.required())
        def publish(ctx: konduit.Context) -> None:
            return None

    [warning] = caught
    assert warning.category is konduit.DefinitionWarning
    assert warning.filename == __file__  # the user's decorator, not konduit's internals
    text = str(warning.message)
    assert "workflow 'warned'" in text and "'publish'" in text and "optional branch 'cover'" in text
    assert "no deadline" in text and "forever" in text
    assert "konduit.Deadline.adaptive()" in text and "[10 s, 45 s]" in text


def test_the_warning_comes_whichever_step_is_defined_last_and_from_the_sequence_builder() -> None:
    with _caught() as caught:
        warnings.simplefilter("always")
        wf = konduit.Workflow("forward", version=1)
        wf.step(name="join", after=["a", "b"], join=konduit.Join.required())(_noop)
        wf.step(name="a")(_noop)
        wf.step(name="b", required=False)(_noop)  # completes the pair: warns here
        seq = konduit.Workflow("built", version=1)
        seq.sequence(konduit.step(_noop, name="start"),
                     konduit.parallel(konduit.step(_noop, name="x", required=False),
                                      konduit.step(_noop, name="y")),
                     konduit.step(_noop, name="end", join=konduit.Join.required()))
    assert [str(w.message).split(":")[0] for w in caught] == ["workflow 'forward'",
                                                              "workflow 'built'"]
    assert all(w.filename == __file__ for w in caught)
    wf.compile()  # a warning, not an error: the definition stands


@pytest.mark.parametrize("case", ["deadline", "required", "all_done", "all_succeeded", "quorum"])
def test_no_warning_for_bounded_or_required_branches_or_other_joins(case: str) -> None:
    join = {"all_done": konduit.Join.all_done(), "all_succeeded": konduit.Join.all_succeeded(),
            "quorum": konduit.Join.quorum(1)}.get(case, konduit.Join.required())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        wf = konduit.Workflow(f"fine-{case}", version=1)
        wf.step(name="root")(_noop)
        wf.step(name="cover", after=["root"], required=case == "required",
                deadline="30s" if case == "deadline" else None)(_noop)
        wf.map(name="items", after=["root"], over=lambda out: [1, 2], required=False,
               deadline=konduit.Deadline.adaptive(floor="10s", ceiling="45s"))(_noop)
        wf.step(name="publish", after=["cover", "items"], join=join)(_noop)
        wf.compile()


def test_the_warning_can_be_made_an_error_and_is_a_konduit_error() -> None:
    assert issubclass(konduit.DefinitionWarning, konduit.KonduitError)
    assert issubclass(konduit.DefinitionWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", konduit.DefinitionWarning)
        wf = konduit.Workflow("strict", version=1)
        wf.step(name="a")(_noop)
        wf.step(name="b", required=False)(_noop)
        with pytest.raises(konduit.DefinitionWarning, match="optional branch 'b'"):
            wf.step(name="j", after=["a", "b"], join=konduit.Join.required())(_noop)


@dataclass(frozen=True)
class FakeStep:
    name: str
    after: tuple[str, ...]
    required: bool = True
    deadline: object | None = None
    join: object = field(default_factory=konduit.Join.all_succeeded)


@given(st.data())
def test_each_bad_pair_is_found_exactly_once_in_any_definition_order(data: st.DataObject) -> None:
    n = data.draw(st.integers(2, 7))
    names = [f"s{i}" for i in range(n)]
    steps = {}
    for i, name in enumerate(names):
        after = tuple(data.draw(st.lists(st.sampled_from(names[:i]), unique=True, max_size=i))
                      if i else ())
        kind = data.draw(st.sampled_from(["required", "all_done", "all_succeeded"]))
        steps[name] = FakeStep(
            name, after, required=data.draw(st.booleans()),
            deadline=data.draw(st.sampled_from([None, "30s"])),
            join=konduit.Join(kind) if len(after) > 1 else konduit.Join.all_succeeded())
    expected = {(j.name, b) for j in steps.values() if j.join.kind == "required" and len(j.after) > 1
                for b in j.after if not steps[b].required and steps[b].deadline is None}
    order = data.draw(st.permutations(names))
    found: list[tuple[str, str]] = []
    defined: dict[str, FakeStep] = {}
    for name in order:
        defined[name] = steps[name]
        found += unbounded_optional_branches(defined, name)
    assert sorted(found) == sorted(expected)


def test_the_demo_follows_the_seeds_clamp_and_defines_without_warnings() -> None:
    import konduit.demo

    with warnings.catch_warnings():
        warnings.simplefilter("error", konduit.DefinitionWarning)
        demo = importlib.reload(konduit.demo)
    d = demo.COVER_DEADLINE
    assert d.floor is not None and d.ceiling is not None and d.default is not None
    # Seed 004, rule 1: 1.5x the p99 of 7 days, clamped between 10 s and 45 s (at the demo's pace).
    assert (d.factor, d.quantile, d.window) == (1.5, 0.99, 7 * 86400)
    assert (round(d.floor / demo.SEED_SCALE, 6), round(d.ceiling / demo.SEED_SCALE, 6)) == (10, 45)
    assert d.floor < d.default < d.ceiling
    assert max(demo.RESIZE_SECONDS) * 1.5 <= d.floor  # normal resizes budget at the floor
    assert d.ceiling < demo.INCIDENT_RESIZE_SECONDS  # the incident always hits the deadline
