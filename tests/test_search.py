"""Find any execution (issue 18, item 6): tags stored at start and checked, and the search by id
start or end, idempotency key, tag, input field, status, workflow@version and time range, on the
real database through the App."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import konduit
from konduit.core.search import id_bounds, parse_input, parse_tags, parse_workflow
from tests.support.payloads import codec_on

pytestmark = [pytest.mark.storage]


def one_step(name: str = "searched", version: int = 1) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=version)

    @wf.step()
    def only(ctx: Any) -> int:
        return 1

    return wf


def ids(found: list[Any]) -> set[str]:
    return {str(f.id) for f in found}


def test_each_part_of_a_filter_finds_its_executions(make_app: Callable[..., konduit.App]) -> None:
    app = make_app(one_step(), one_step("other"))
    acme = app.start("searched", {"episode": 42, "show": {"name": "x"}}, tags={"customer": "acme"},
                     idempotency_key="nightly-1")
    beta = app.start("searched", {"episode": 7}, tags={"customer": "beta", "tier": "gold"})
    other = app.start("other", {"episode": 42})

    assert ids(app.search(tags={"customer": "acme"})) == {str(acme.id)}
    assert ids(app.search(tags={"customer": "beta", "tier": "gold"})) == {str(beta.id)}
    assert ids(app.search(tags={"customer": "beta", "tier": "silver"})) == set()
    assert ids(app.search(idempotency_key="nightly-1")) == {str(acme.id)}
    if codec_on():  # PostgreSQL cannot look inside a sealed input: refused, naming the codec
        with pytest.raises(konduit.SearchError, match=r"input: .*codec"):
            app.search(input={"episode": 42})
    else:
        assert ids(app.search(input={"episode": 42})) == {str(acme.id), str(other.id)}
        assert ids(app.search(input={"show": {"name": "x"}})) == {str(acme.id)}
        assert ids(app.search(input={"episode": 42}, workflow="other")) == {str(other.id)}
    assert ids(app.search(workflow="searched", version=1)) == {str(acme.id), str(beta.id)}
    assert ids(app.search(workflow="searched", version=2)) == set()
    assert ids(app.search(status="running")) == {str(acme.id), str(beta.id), str(other.id)}
    assert ids(app.search(status="succeeded")) == set()

    # The start of an id, with or without its dashes; and its random tail.
    text = str(beta.id)
    assert ids(app.search(id_prefix=text)) == {text}
    assert str(beta.id) in ids(app.search(id_prefix=text[:13]))
    assert ids(app.search(id_prefix=text[-12:])) == {text}
    assert ids(app.search(id_prefix=text[-17:].replace("-", ""))) == {text}
    assert ids(app.search(id_prefix=text[-17:].upper())) == {text}

    now = datetime.now(UTC)
    assert len(app.search(since=now - timedelta(minutes=5))) == 3
    assert app.search(until=now - timedelta(minutes=5)) == []

    found = app.search(tags={"customer": "acme"})[0]
    assert found.tags == {"customer": "acme"}
    assert found.workflow_name == "searched" and found.priority == 0 and found.run_at is None
    # Newest first, and a filter object is the same search.
    newest = app.search(konduit.ExecutionFilter(since=now - timedelta(minutes=5)))
    assert [str(f.id) for f in newest] == [str(other.id), str(beta.id), str(acme.id)]
    if not codec_on():
        newest = app.search(konduit.ExecutionFilter(input={"episode": 42}))
        assert [str(f.id) for f in newest] == [str(other.id), str(acme.id)]


@pytest.mark.parametrize("tags, fault", [
    ({"customer": 1}, "its value is text"),
    ({1: "x"}, "tag key 1"),
    ({"": "x"}, "non-empty"),
    ({"k" * 65: "x"}, "longer than 64"),
    ({"customer": "x" * 257}, "longer than 256"),
    ({f"k{i}": "v" for i in range(33)}, "at most 32"),
    (["customer=acme"], "dict of text to text"),
])
def test_bad_tags_are_refused_naming_the_tag_and_nothing_is_written(
        make_app: Callable[..., konduit.App], tags: Any, fault: str) -> None:
    app = make_app(one_step())
    with pytest.raises(konduit.KonduitError, match=fault):
        app.start("searched", {}, tags=tags)
    with pytest.raises(konduit.KonduitError, match=fault):
        app.start_many([{"workflow": "searched", "tags": tags}])
    assert app.search() == []


def test_start_many_carries_tags(make_app: Callable[..., konduit.App]) -> None:
    app = make_app(one_step())
    handles = app.start_many([{"workflow": "searched", "tags": {"batch": "b1", "n": str(i)}}
                              for i in range(5)] + [{"workflow": "searched"}])
    assert ids(app.search(tags={"batch": "b1"})) == {str(h.id) for h in handles[:5]}
    assert ids(app.search(tags={"n": "3"})) == {str(handles[3].id)}


@pytest.mark.parametrize("parts, fault", [
    ({"id_prefix": "abc"}, "at least 4"),
    ({"id_prefix": "xyz-12345"}, "hex digits"),
    ({"id_prefix": "0" * 33}, "hex digits"),
    ({"status": "runing"}, "status 'runing'"),
    ({"version": 2}, "with its workflow"),
    ({"workflow": "w", "version": 0}, "from 1"),
    ({"since": datetime(2026, 1, 1)}, "time zone"),
    ({"since": datetime(2026, 1, 2, tzinfo=UTC), "until": datetime(2026, 1, 1, tzinfo=UTC)},
     "not before"),
    ({"tags": {"k": 1}}, "value is text"),
])
def test_a_bad_filter_names_its_part(make_app: Callable[..., konduit.App],
                                     parts: dict[str, Any], fault: str) -> None:
    app = make_app(one_step())
    with pytest.raises(konduit.KonduitError, match=fault):
        app.search(**parts)
    with pytest.raises(TypeError, match="colour"):  # the parts are the signature's
        app.search(colour="red")  # type: ignore[call-arg]


def test_the_text_forms_of_a_filter() -> None:
    assert parse_tags(["customer=acme", "a=b=c"]) == {"customer": "acme", "a": "b=c"}
    assert parse_input(["input.episode=42", "show.name=x", 'code="42"', "ok=true"]) == {
        "episode": 42, "show": {"name": "x"}, "code": "42", "ok": True}
    assert parse_workflow("w@3") == ("w", 3) and parse_workflow("w") == ("w", None)
    for bad, parse in (("customer", parse_tags), ("=x", parse_tags), ("a..b=1", parse_input)):
        with pytest.raises(konduit.SearchError):
            parse([bad])  # type: ignore[operator]
    with pytest.raises(konduit.SearchError, match="whole number"):
        parse_workflow("w@x")
    low, high, _tail = id_bounds("0190ABCD-1234")
    assert low == "0190abcd1234" + "0" * 20 and high == "0190abcd1234" + "f" * 20
    # The end of an id laid out with the dashes where they fall, reversed for the index.
    assert id_bounds("9abc0123456789ab")[2] == "ba9876543210-cba9%"


def test_a_schedule_tags_its_executions_with_its_name(make_app: Callable[..., konduit.App],
                                                      db_url: str) -> None:
    from konduit.engine.schedules import Schedules
    from tests.test_schedules import T0, run, scheduled

    async def two_rounds(s: Schedules) -> int:
        await s.sync(now=T0)
        started, _ = await s.run_due(now=T0 + timedelta(minutes=1))
        return len(started)

    assert run(db_url, [scheduled(missed="all")], two_rounds) > 0
    app = make_app(scheduled(missed="all"))
    found = app.search(tags={"schedule": "nightly"})
    assert found and all(f.tags == {"schedule": "nightly"} for f in found)


def test_list_takes_the_parts_of_a_search(make_app: Callable[..., konduit.App]) -> None:
    app = make_app(one_step())
    tagged = app.start("searched", {"episode": 3}, tags={"customer": "acme"})
    app.start("searched", {"episode": 4})
    assert len(app.list()) == 2
    [found] = app.list(tags={"customer": "acme"})
    assert found.id == tagged.id and found.workflow == "searched" and found.status == "running"
    if codec_on():
        with pytest.raises(konduit.SearchError, match=r"input: .*codec"):
            app.list(input={"episode": 3}, workflow="searched")
    else:
        assert [r.id for r in app.list(input={"episode": 3}, workflow="searched")] == [tagged.id]
    with pytest.raises(TypeError, match="colour"):
        app.list(colour="red")  # type: ignore[call-arg]


@pytest.mark.parametrize("parts", [
    {"input": {"a": "x\x00"}}, {"input": {"a": "\ud800"}}, {"input": {"a": float("inf")}},
    {"input": {"a": object()}}, {"idempotency_key": "\ud800"}, {"idempotency_key": "k\x00"},
    {"tags": {"a": "\ud800"}}, {"workflow": "w\x00"}, {"id_prefix": 1234},
])
def test_hostile_filters_are_refused_before_the_database(
        make_app: Callable[..., konduit.App], parts: dict[str, Any]) -> None:
    app = make_app(one_step())
    with pytest.raises(konduit.SearchError):
        app.search(**parts)
    with pytest.raises(konduit.SearchError):
        app.start("searched", {}, tags={"k": "\ud800"})
