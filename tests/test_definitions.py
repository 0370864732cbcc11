"""Definition-time checks of workflows, the sequence/parallel builder, the spec hash, retry
backoff and duration parsing."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from konduit.core.durations import parse_duration
from konduit.core.policies import Deadline, Join, Retry
from konduit.core.workflow import Workflow, WorkflowSpec, parallel, step
from konduit.errors import KonduitError, WorkflowDefinitionError


def _h(name: str) -> Any:
    def handler(ctx: Any) -> None:
        return None

    handler.__name__ = handler.__qualname__ = name
    return handler


@contextmanager
def _raises_naming(step_name: str | None, *fragments: str) -> Iterator[None]:
    """Expect a WorkflowDefinitionError whose message names ``step_name`` and has ``fragments``."""
    with pytest.raises(WorkflowDefinitionError) as info:
        yield
    message = str(info.value)
    if step_name is not None:
        assert f"step {step_name!r}" in message, message
        assert info.value.step == step_name
    for fragment in fragments:
        assert fragment in message, message


# -- definition errors ------------------------------------------------------------------------


def test_cycle_through_forward_references_fails_at_compile() -> None:
    wf = Workflow("cyclic")
    wf.step(after=["b"])(_h("a"))
    wf.step(after=["a"])(_h("b"))
    with _raises_naming("a", "cycle", "a -> b -> a"):
        wf.compile()


def test_three_step_cycle() -> None:
    wf = Workflow("cyclic3")
    wf.step()(_h("root"))
    wf.step(after=["root", "c"])(_h("a"))
    wf.step(after=["a"])(_h("b"))
    wf.step(after=["b"])(_h("c"))
    with _raises_naming("a", "cycle"):
        wf.compile()


def test_cycle_error_names_a_step_on_the_cycle() -> None:
    wf = Workflow("cyclic-tail")
    wf.step(after=["x"])(_h("a"))  # downstream of the cycle, not on it
    wf.step(after=["y"])(_h("x"))
    wf.step(after=["x"])(_h("y"))
    with pytest.raises(WorkflowDefinitionError) as info:
        wf.compile()
    assert info.value.step in {"x", "y"}, str(info.value)


def test_self_reference_is_a_cycle() -> None:
    wf = Workflow("selfish")
    with _raises_naming("a", "cycle"):
        wf.step(after=["a"])(_h("a"))


def test_unknown_upstream_name_fails_at_compile() -> None:
    wf = Workflow("unknown")
    wf.step()(_h("a"))
    wf.step(after=["a", "ghost"])(_h("b"))  # a forward reference is allowed until compile
    with _raises_naming("b", "'ghost'"):
        wf.compile()


def test_upstream_function_that_is_not_a_step_fails_at_decoration() -> None:
    wf = Workflow("not-a-step")

    def stranger(ctx: Any) -> None: ...

    with _raises_naming("b", "'stranger'", "not a step"):

        @wf.step(after=[stranger])
        def b(ctx: Any) -> None: ...


def test_step_of_another_workflow_is_not_a_step_of_this_one() -> None:
    other = Workflow("other")

    @other.step()
    def a(ctx: Any) -> None: ...

    wf = Workflow("this")
    with _raises_naming("b", "'a'"):
        wf.step(after=[a])(_h("b"))


def test_duplicate_step_name() -> None:
    wf = Workflow("dupes")
    wf.step()(_h("a"))
    with _raises_naming("a", "duplicate"):
        wf.step()(_h("a"))
    with _raises_naming("a", "duplicate"):
        wf.step(name="a")(_h("other"))


def test_upstream_listed_twice() -> None:
    wf = Workflow("twice")
    wf.step()(_h("a"))
    with _raises_naming("b", "twice"):
        wf.step(after=["a", "a"])(_h("b"))


@pytest.mark.parametrize("join", [Join.all_succeeded(), Join.all_done(), Join.required(), Join.quorum(1)])
def test_join_policy_on_a_step_with_one_upstream(join: Join) -> None:
    wf = Workflow("lonely-join")
    wf.step()(_h("a"))
    with _raises_naming("b", "two upstream"):
        wf.step(after=["a"], join=join)(_h("b"))


def test_join_policy_on_a_root_step() -> None:
    wf = Workflow("root-join")
    with _raises_naming("a", "two upstream"):
        wf.step(join=Join.all_done())(_h("a"))


def test_quorum_larger_than_upstream_count() -> None:
    wf = Workflow("quorum")
    for name in ("a", "b", "c"):
        wf.step()(_h(name))
    with _raises_naming("j", "quorum(4)", "3 upstream"):
        wf.step(after=["a", "b", "c"], join=Join.quorum(4))(_h("j"))
    wf.step(after=["a", "b", "c"], join=Join.quorum(3))(_h("j"))  # k == n is fine
    assert wf.compile()["j"].join == Join.quorum(3)


@pytest.mark.parametrize("k", [0, -1, 1.5, "2"])
def test_quorum_needs_a_positive_integer(k: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="quorum"):
        Join.quorum(k)


def test_join_must_be_a_join() -> None:
    wf = Workflow("bad-join")
    wf.step()(_h("a"))
    wf.step()(_h("b"))
    with _raises_naming("c", "konduit.Join"):
        wf.step(after=["a", "b"], join="all_done")(_h("c"))  # type: ignore[arg-type]


def test_handler_without_parameters() -> None:
    wf = Workflow("sig0")
    with _raises_naming("nothing", "one positional argument"):

        @wf.step()
        def nothing() -> None: ...


def test_handler_with_two_required_parameters() -> None:
    wf = Workflow("sig2")
    with _raises_naming("greedy", "one positional argument"):

        @wf.step()
        def greedy(ctx: Any, other: Any) -> None: ...


def test_handler_with_a_required_keyword_only_parameter() -> None:
    wf = Workflow("sigkw")
    with _raises_naming("kw", "one positional argument"):

        @wf.step()
        def kw(ctx: Any, *, flag: bool) -> None: ...


def test_handler_signatures_that_are_accepted() -> None:
    wf = Workflow("sig-ok")

    @wf.step()
    def plain(ctx: Any) -> None: ...

    @wf.step(after=[plain])
    def with_default(ctx: Any, extra: int = 1) -> None: ...

    @wf.step(after=[plain])
    def star(*args: Any) -> None: ...

    @wf.step(after=[plain])
    async def coroutine(ctx: Any) -> None: ...

    spec = wf.compile()
    assert spec["coroutine"].is_async and not spec["plain"].is_async


def test_fallback_with_the_wrong_signature() -> None:
    wf = Workflow("bad-fallback")
    with _raises_naming("a", "one positional argument"):
        wf.step(fallback=lambda: None)(_h("a"))


def test_map_step_without_upstream() -> None:
    wf = Workflow("map-root")
    with _raises_naming("m", "map"):
        wf.map(after=[], over=lambda out: out)(_h("m"))


def test_map_over_must_be_callable() -> None:
    wf = Workflow("map-over")
    wf.step()(_h("a"))
    with pytest.raises(WorkflowDefinitionError, match="callable"):
        wf.map(after=["a"], over=[1, 2, 3])  # type: ignore[arg-type]


def test_after_must_be_a_list() -> None:
    wf = Workflow("after-str")
    wf.step()(_h("a"))
    with _raises_naming("b", "list"):
        wf.step(after="a")(_h("b"))  # type: ignore[arg-type]


def test_invalid_step_name() -> None:
    wf = Workflow("bad-step-name")
    with pytest.raises(WorkflowDefinitionError, match="invalid step name 'has space'"):
        wf.step(name="has space")(_h("ok"))


@pytest.mark.parametrize("name", ["", "has space", "-leading-dash", "x" * 101, "ünïcode?", 42])
def test_invalid_workflow_name(name: Any) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        Workflow(name)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("version", [0, -1, 1.0, "1", True, None])
def test_invalid_workflow_version(version: Any) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        Workflow("versioned", version=version)
    message = str(info.value)
    assert "'versioned'" in message and "version" in message and repr(version) in message


def test_valid_workflow_names() -> None:
    for name in ("a", "publish-content", "etl.v2", "_private", "x" * 100):
        assert Workflow(name, version=3).name == name


def test_empty_workflow_does_not_compile() -> None:
    with pytest.raises(WorkflowDefinitionError, match="at least one step"):
        Workflow("empty").compile()


def test_definition_errors_are_konduit_errors() -> None:
    assert issubclass(WorkflowDefinitionError, KonduitError)


def test_bad_deadline_is_a_definition_error() -> None:
    wf = Workflow("bad-deadline")
    with pytest.raises(WorkflowDefinitionError):
        wf.step(deadline="5 parsecs")(_h("a"))


# -- the sequence / parallel builder ----------------------------------------------------------


def test_sequence_and_parallel_compile_to_the_expected_dag() -> None:
    wf = Workflow("built")
    fetch, clean, left, right1, right2, merge, publish = (
        _h(n) for n in ("fetch", "clean", "left", "right1", "right2", "merge", "publish")
    )
    tails = wf.sequence(
        fetch,
        clean,
        parallel(left, [right1, right2]),
        step(merge, join=Join.all_done(), required=False),
        publish,
    )
    assert tails == ["publish"]
    spec = wf.compile()
    assert spec["fetch"].after == ()
    assert spec["clean"].after == ("fetch",)
    assert spec["left"].after == ("clean",)
    assert spec["right1"].after == ("clean",)
    assert spec["right2"].after == ("right1",)
    assert spec["merge"].after == ("left", "right2")
    assert spec["merge"].join == Join.all_done() and spec["merge"].required is False
    assert spec["publish"].after == ("merge",)
    assert spec.roots == ("fetch",)
    assert spec.sinks == ("publish",)
    assert spec.downstream["clean"] == ("left", "right1")
    assert spec.downstream["right1"] == ("right2",)
    assert spec.downstream["publish"] == ()
    assert set(spec.order) == set(spec.steps)
    position = {n: i for i, n in enumerate(spec.order)}
    for s in spec.steps.values():
        assert all(position[u] < position[s.name] for u in s.after)


def test_sequence_equals_the_decorator_dag() -> None:
    built = Workflow("same", version=2)
    built.sequence(_h("a"), parallel(_h("b"), _h("c")), step(_h("d"), join=Join.quorum(1)))

    decorated = Workflow("same", version=2)
    decorated.step()(_h("a"))
    decorated.step(after=["a"])(_h("b"))
    decorated.step(after=["a"])(_h("c"))
    decorated.step(after=["b", "c"], join=Join.quorum(1))(_h("d"))

    assert built.compile().spec_json == decorated.compile().spec_json
    assert built.compile().spec_hash == decorated.compile().spec_hash


def test_sequence_after_existing_steps_and_open_ends() -> None:
    wf = Workflow("tails")
    wf.step()(_h("start"))
    tails = wf.sequence(parallel(_h("x"), _h("y")), after=["start"])
    assert tails == ["x", "y"]
    spec = wf.compile()
    assert spec["x"].after == ("start",) and spec["y"].after == ("start",)
    assert spec.sinks == ("x", "y")


def test_sequence_with_a_map_step() -> None:
    wf = Workflow("seq-map")
    wf.sequence(_h("list_items"), step(_h("each"), over=lambda out: out), _h("collect"))
    spec = wf.compile()
    assert spec["each"].is_map and spec["each"].after == ("list_items",)
    assert spec["collect"].after == ("each",)


def test_builder_errors_name_the_step() -> None:
    with pytest.raises(WorkflowDefinitionError):
        parallel()
    wf = Workflow("builder-errors")
    with _raises_naming("j", "two upstream"):
        wf.sequence(_h("a"), step(_h("j"), join=Join.all_done()))


# -- spec hash --------------------------------------------------------------------------------


def _diamond(
    join: Join | None = None, retry: Retry | None = None, required: bool = True, version: int = 1
) -> WorkflowSpec:
    wf = Workflow("diamond", version=version)
    wf.step()(_h("a"))
    wf.step(after=["a"], retry=retry, required=required)(_h("b"))
    wf.step(after=["a"])(_h("c"))
    wf.step(after=["b", "c"], join=join)(_h("d"))
    return wf.compile()


def test_spec_hash_is_stable_for_equal_definitions() -> None:
    first, second = _diamond(), _diamond()
    assert first.spec_hash == second.spec_hash
    assert len(first.spec_hash) == 64
    assert first.spec_hash == first.spec_hash  # cached, and deterministic
    # explicit defaults are the same definition as implicit ones
    assert _diamond(retry=Retry()).spec_hash == first.spec_hash


@pytest.mark.parametrize(
    "changed",
    [
        {"join": Join.all_done()},
        {"join": Join.required()},
        {"join": Join.quorum(1)},
        {"retry": Retry(max_attempts=5)},
        {"retry": Retry(backoff="linear")},
        {"retry": Retry(jitter=False)},
        {"retry": Retry(non_retryable=(ValueError,))},
        {"required": False},
        {"version": 2},
    ],
)
def test_spec_hash_changes_with_policy(changed: dict[str, Any]) -> None:
    assert _diamond(**changed).spec_hash != _diamond().spec_hash


def test_spec_hash_distinguishes_quorum_sizes_and_deadlines() -> None:
    assert _diamond(Join.quorum(1)).spec_hash != _diamond(Join.quorum(2)).spec_hash

    def one(deadline: Any) -> str:
        wf = Workflow("dl")
        wf.step(deadline=deadline)(_h("a"))
        return wf.compile().spec_hash

    assert one("30s") == one(30) == one(Deadline.static("30s"))
    assert one("30s") != one("31s")
    assert one("30s") != one(Deadline.adaptive(ceiling="30s"))
    assert one(None) != one("30s")


# -- retry backoff ----------------------------------------------------------------------------


def test_retry_fixed_backoff() -> None:
    r = Retry(backoff="fixed", base="2s", cap="30s", jitter=False)
    assert [r.delay(n) for n in range(1, 6)] == [2.0] * 5


def test_retry_linear_backoff_with_cap() -> None:
    r = Retry(backoff="linear", base="250ms", cap="1s", jitter=False)
    assert [r.delay(n) for n in range(1, 7)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_retry_exponential_backoff_with_cap() -> None:
    r = Retry(backoff="exponential", base="1s", cap="30s", jitter=False)
    assert [r.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_retry_defaults() -> None:
    r = Retry()
    assert (r.max_attempts, r.backoff, r.base, r.cap, r.jitter) == (3, "exponential", 1.0, 30.0, True)


@pytest.mark.parametrize("backoff", ["fixed", "linear", "exponential"])
def test_retry_full_jitter_stays_within_zero_and_raw(backoff: str) -> None:
    jittered = Retry(backoff=backoff, base="500ms", cap="10s", jitter=True)  # type: ignore[arg-type]
    raw = Retry(backoff=backoff, base="500ms", cap="10s", jitter=False)  # type: ignore[arg-type]
    rng = random.Random(1234)
    for attempt in range(1, 12):
        bound = raw.delay(attempt)
        samples = [jittered.delay(attempt, rng=rng) for _ in range(200)]
        assert all(0.0 <= s <= bound for s in samples), (attempt, bound)
        assert len(set(samples)) > 1  # it really is spread
        assert max(samples) > bound / 2


def test_retry_jitter_is_reproducible_with_a_seeded_rng() -> None:
    r = Retry()
    assert r.delay(3, rng=random.Random(7)) == r.delay(3, rng=random.Random(7))


def test_retry_exponential_delay_for_a_large_attempt_is_the_cap() -> None:
    r = Retry(max_attempts=5000, base="1s", cap="30s", jitter=False)
    assert r.delay(1100) == 30.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -3},
        {"backoff": "random"},
        {"non_retryable": (ValueError, "nope")},
    ],
)
def test_retry_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(WorkflowDefinitionError):
        Retry(**kwargs)


def test_retry_with_a_bad_duration_raises_a_konduit_error_naming_the_field() -> None:
    with pytest.raises(KonduitError, match=r"Retry\.base.*'soon'"):
        Retry(base="soon")


# -- durations --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("1m30s", 90.0),
        ("7d", 7 * 86400.0),
        ("1s", 1.0),
        ("2h", 7200.0),
        ("1.5s", 1.5),
        ("1h2m3s4ms", 3723.004),
        (" 30S ", 30.0),
        ("0s", 0.0),
        (5, 5.0),
        (0.5, 0.5),
    ],
)
def test_parse_duration(text: Any, seconds: float) -> None:
    assert math.isclose(parse_duration(text), seconds)


@pytest.mark.parametrize(
    "garbage",
    ["", "   ", "soon", "10", "5x", "s", "ms", "1 s", "-1s", "1s-", "1.2.3s", "1m 30s", "30s!"],
)
def test_parse_duration_rejects_garbage(garbage: str) -> None:
    with pytest.raises(KonduitError) as info:
        parse_duration(garbage, what="Retry.base")
    message = str(info.value)
    assert message.startswith("Retry.base:")
    assert repr(garbage) in message
    assert "duration" in message


@pytest.mark.parametrize("bad", [-1, -0.5, True, False])
def test_parse_duration_rejects_negative_numbers_and_bools(bad: Any) -> None:
    with pytest.raises(KonduitError, match="deadline"):
        parse_duration(bad, what="deadline")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_parse_duration_rejects_nan_and_infinity(bad: float) -> None:
    with pytest.raises(KonduitError):
        parse_duration(bad)
