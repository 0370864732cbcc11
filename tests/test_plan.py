"""Plans (``konduit plan``): the critical path from history, predicted finishes, the verdict.

The pure part (:func:`konduit.observe.plan.critical_path`, :func:`build_plan`, the window parsers) is
tested on its own, with properties checked against a brute-force enumeration of every path; then a
plan is built from the real history of executions run by real workers, and the CLI prints it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import math
import textwrap
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import konduit
from konduit.core.durations import format_elapsed
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database
from konduit.observe.plan import (
    PLAN_AT_RISK_EXIT_CODE,
    QUANTILES,
    Plan,
    PlanError,
    Quantile,
    StepQuantiles,
    build_plan,
    critical_path,
    judge,
    load_plan,
    parse_moment,
    window_from,
)
from tests.support.workers import running_worker
from tests.test_cli import assert_clean_error, konduit_cli

START = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def _handler(name: str) -> Callable[[Any], None]:
    def handler(ctx: Any) -> None:
        return None

    handler.__name__ = handler.__qualname__ = name
    return handler


def _over(out: Any) -> list[Any]:
    return list(out or [])


def dag(edges: Mapping[str, list[str]], *, maps: frozenset[str] = frozenset()) -> WorkflowSpec:
    """A workflow from ``{step: [upstream, ...]}`` (in definition order)."""
    wf = konduit.Workflow("plan-test", version=1)
    for name, after in edges.items():
        if name in maps:
            wf.map(after=after, over=_over, name=name)(_handler(name))
        else:
            wf.step(after=after, name=name)(_handler(name))
    return wf.compile()


def flat(**seconds: float) -> dict[str, StepQuantiles]:
    """The same duration at every quantile."""
    return {name: StepQuantiles(s, s, s, samples=10) for name, s in seconds.items()}


# -- critical_path: examples --------------------------------------------------------------------


def test_a_chain_is_its_own_critical_path() -> None:
    spec = dag({"a": [], "b": ["a"], "c": ["b"]})
    path, total = critical_path(spec, flat(a=1, b=2, c=3), "p50")
    assert path == ["a", "b", "c"]
    assert total == pytest.approx(6)


def test_a_diamond_goes_through_its_slower_branch() -> None:
    spec = dag({"fetch": [], "fast": ["fetch"], "slow": ["fetch"], "join": ["fast", "slow"]})
    path, total = critical_path(spec, flat(fetch=1, fast=0.5, slow=4, join=1), "p99")
    assert path == ["fetch", "slow", "join"]
    assert total == pytest.approx(6)
    path, _ = critical_path(spec, flat(fetch=1, fast=5, slow=4, join=1), "p99")
    assert path == ["fetch", "fast", "join"]


def test_parallel_branches_the_critical_path_depends_on_the_quantile() -> None:
    """A steady branch dominates the median, a spiky one the tail (seed 004's cover image)."""
    spec = dag({
        "transcribe": [],
        "translate": ["transcribe"],
        "cover_image": ["transcribe"],
        "captions": ["transcribe"],
        "publish": ["translate", "cover_image", "captions"],
    })
    durations = {
        "transcribe": StepQuantiles(1, 1.2, 1.5, samples=30),
        "translate": StepQuantiles(3, 3.5, 4, samples=30),  # steady
        "cover_image": StepQuantiles(2, 9, 30, samples=30),  # usually fast, sometimes awful
        "captions": StepQuantiles(0.5, 0.6, 0.7, samples=30),
        "publish": StepQuantiles(0.2, 0.3, 0.4, samples=30),
    }
    expected: list[tuple[Quantile | float, list[str], float]] = [
        ("p50", ["transcribe", "translate", "publish"], 4.2),
        ("p95", ["transcribe", "cover_image", "publish"], 10.5),
        (0.99, ["transcribe", "cover_image", "publish"], 31.9),
    ]
    for q, path, total in expected:
        found, seconds = critical_path(spec, durations, q)
        assert found == path
        assert seconds == pytest.approx(total)


def test_a_map_step_weighs_its_whole_span() -> None:
    """A map step's span covers all of its tasks: it is one node of the path like any other."""
    spec = dag({"list": [], "resize": ["list"], "caption": ["list"],
                "collect": ["resize", "caption"]}, maps=frozenset({"resize"}))
    assert spec["resize"].is_map
    path, total = critical_path(spec, flat(list=0.1, resize=2.5, caption=1, collect=0.1), "p50")
    assert path == ["list", "resize", "collect"]
    assert total == pytest.approx(2.7)


def test_steps_without_history_weigh_nothing_and_are_flagged() -> None:
    spec = dag({"fetch": [], "known": ["fetch"], "new": ["fetch"], "join": ["known", "new"]})
    durations = flat(fetch=1, known=2, join=1)  # "new" was added since the history was made
    path, total = critical_path(spec, durations, "p50")
    assert path == ["fetch", "known", "join"]
    assert total == pytest.approx(4)
    plan = build_plan(spec, durations, start=START, window=START + timedelta(seconds=10))
    assert plan.no_history == ["new"]
    assert plan.to_json()["no_history"] == ["new"]
    assert plan.verdict == "safe"  # judged on what is known; the CLI warns it may be optimistic

    # No history at all: still a path from a root to a final step, 0 s, and no verdict.
    path, total = critical_path(spec, {}, "p99")
    assert path[0] in spec.roots and path[-1] in spec.sinks
    assert total == 0
    empty = build_plan(spec, {}, start=START, window=START + timedelta(seconds=10))
    assert empty.verdict is None
    assert empty.no_history == list(spec.order)


def test_the_longest_final_step_wins_with_several_roots_and_sinks() -> None:
    spec = dag({"a": [], "b": [], "x": ["a"], "y": ["a", "b"], "z": ["b"]})
    path, total = critical_path(spec, flat(a=1, b=3, x=1, y=1, z=0.5), "p50")
    assert path == ["b", "y"]
    assert total == pytest.approx(4)


def test_history_of_steps_the_spec_does_not_have_is_ignored() -> None:
    spec = dag({"a": [], "b": ["a"]})
    plan = build_plan(spec, flat(a=1, b=1, removed=100), start=START)
    assert plan.estimates["p99"].total_seconds == pytest.approx(2)
    assert "removed" not in plan.durations


def test_unknown_quantiles_are_refused() -> None:
    spec = dag({"a": []})
    for bad in ("p90", 0.9, "median", True):
        with pytest.raises(PlanError, match="p50, p95 and p99"):
            critical_path(spec, {}, bad)  # type: ignore[arg-type]


# -- critical_path: properties ------------------------------------------------------------------


@st.composite
def weighted_dags(draw: st.DrawFn) -> tuple[WorkflowSpec, dict[str, StepQuantiles]]:
    n = draw(st.integers(min_value=1, max_value=9))
    edges: dict[str, list[str]] = {}
    for i in range(n):
        if i == 0 or draw(st.integers(0, 3)) == 0:
            ups: list[int] = []
        else:
            ups = draw(st.lists(st.integers(0, i - 1), unique=True, min_size=1,
                                max_size=min(i, 3)))
        edges[f"s{i}"] = [f"s{u}" for u in sorted(ups)]
    maps = frozenset(s for s, ups in edges.items() if ups and draw(st.integers(0, 4)) == 0)
    spec = dag(edges, maps=maps)
    seconds = st.floats(min_value=0, max_value=1000, allow_nan=False, allow_infinity=False)
    durations: dict[str, StepQuantiles] = {}
    for name in edges:
        if draw(st.integers(0, 5)) == 0:
            continue  # no history
        p50, p95, p99 = sorted(draw(st.tuples(seconds, seconds, seconds)))
        durations[name] = StepQuantiles(p50, p95, p99, samples=draw(st.integers(1, 100)))
    return spec, durations


def every_path(spec: WorkflowSpec) -> list[list[str]]:
    """Every root-to-final-step path, by brute force."""
    paths: list[list[str]] = []

    def walk(path: list[str]) -> None:
        down = spec.downstream[path[-1]]
        if not down:
            paths.append(path)
        for d in down:
            walk([*path, d])

    for root in spec.roots:
        walk([root])
    return paths


def weight(durations: Mapping[str, StepQuantiles], step: str, q: str) -> float:
    return durations[step].at(q) if step in durations else 0.0  # type: ignore[arg-type]


PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTIES
@given(weighted_dags(), st.sampled_from(QUANTILES))
def test_the_critical_path_is_the_longest_path(case: tuple[WorkflowSpec, dict[str, StepQuantiles]],
                                               q: str) -> None:
    spec, durations = case
    path, total = critical_path(spec, durations, q)  # type: ignore[arg-type]
    # A real path: from a root to a final step along the DAG's edges...
    assert path[0] in spec.roots and path[-1] in spec.sinks
    for up, down in itertools.pairwise(path):
        assert up in spec[down].after
    # ... whose total is the sum of its weights ...
    assert math.isclose(total, sum(weight(durations, s, q) for s in path), rel_tol=1e-9,
                        abs_tol=1e-9)
    # ... and no path is longer.
    longest = max(sum(weight(durations, s, q) for s in p) for p in every_path(spec))
    assert math.isclose(total, longest, rel_tol=1e-9, abs_tol=1e-9)


@PROPERTIES
@given(weighted_dags())
def test_totals_grow_with_the_quantile_and_the_verdict_follows(
        case: tuple[WorkflowSpec, dict[str, StepQuantiles]]) -> None:
    spec, durations = case
    totals = [critical_path(spec, durations, q)[1] for q in QUANTILES]
    assert totals[0] <= totals[1] + 1e-9 and totals[1] <= totals[2] + 1e-9
    if not durations:
        return
    p50, p99 = totals[0], totals[2]
    for window, expected in ((p99 + 1, "safe"), (p50 - 1, "will miss")):
        if window < 0:
            continue
        plan = build_plan(spec, durations, start=START, window=START + timedelta(seconds=window))
        assert plan.verdict == expected
    if p99 - p50 > 1e-3:
        middle = START + timedelta(seconds=(p50 + p99) / 2)
        assert build_plan(spec, durations, start=START, window=middle).verdict == "at risk"


@PROPERTIES
@given(weighted_dags(), st.floats(min_value=0.01, max_value=100))
def test_scaling_every_step_scales_the_total(case: tuple[WorkflowSpec, dict[str, StepQuantiles]],
                                             factor: float) -> None:
    spec, durations = case
    scaled = {n: StepQuantiles(d.p50 * factor, d.p95 * factor, d.p99 * factor, d.samples)
              for n, d in durations.items()}
    _, total = critical_path(spec, durations, "p95")
    _, total_scaled = critical_path(spec, scaled, "p95")
    assert math.isclose(total_scaled, total * factor, rel_tol=1e-6, abs_tol=1e-6)


# -- the plan and its window --------------------------------------------------------------------


def test_judge_boundaries() -> None:
    w = START + timedelta(hours=1)
    assert judge(w, w, w) == "safe"  # finishing exactly at the window is inside it
    assert judge(w, w, w + timedelta(microseconds=1)) == "at risk"
    assert judge(w, w + timedelta(microseconds=1), w + timedelta(seconds=1)) == "will miss"


def test_plan_predicts_finish_times_and_judges_the_window() -> None:
    spec = dag({"fetch": [], "fast": ["fetch"], "slow": ["fetch"], "join": ["fast", "slow"]})
    durations = {
        "fetch": StepQuantiles(60, 90, 120, samples=14),
        "fast": StepQuantiles(30, 40, 50, samples=14),
        "slow": StepQuantiles(600, 1800, 2400, samples=14, degraded=1),
        "join": StepQuantiles(60, 60, 60, samples=14),
    }
    # p50 720 s, p95 1950 s, p99 2580 s

    def plan_for(window: datetime | None) -> Plan:
        return build_plan(spec, durations, start=START, window=window, history_seconds=7 * 86400)

    none = plan_for(None)
    assert none.verdict is None
    assert none.estimates["p50"].finish_at == START + timedelta(seconds=720)
    assert none.estimates["p99"].finish_at == START + timedelta(seconds=2580)
    assert none.estimates["p99"].path == ["fetch", "slow", "join"]
    assert none.estimates["p99"].slack_seconds is None
    assert none.on_path("slow") == ["p50", "p95", "p99"] and none.on_path("fast") == []
    assert none.samples == 14

    assert plan_for(START + timedelta(hours=1)).verdict == "safe"
    at_risk = plan_for(START + timedelta(minutes=30))
    assert at_risk.verdict == "at risk"
    assert at_risk.estimates["p50"].slack_seconds == pytest.approx(1800 - 720)
    assert at_risk.estimates["p99"].slack_seconds == pytest.approx(1800 - 2580)
    assert plan_for(START + timedelta(minutes=10)).verdict == "will miss"

    data = json.loads(json.dumps(at_risk.to_json()))
    assert data["verdict"] == "at risk"
    assert data["window_seconds"] == 1800
    assert data["critical_path"]["p99"]["path"] == ["fetch", "slow", "join"]
    assert data["critical_path"]["p99"]["total_seconds"] == pytest.approx(2580)
    slow = next(s for s in data["steps"] if s["step"] == "slow")
    assert slow["degraded"] == 1 and slow["critical"] == ["p50", "p95", "p99"]
    assert "approximation" in data["note"]


def test_windows_from_a_time_of_day_a_date_time_or_a_duration() -> None:
    local = datetime(2026, 11, 30, 5, 0).astimezone()
    assert parse_moment("06:00", after=local) == local.replace(hour=6)
    assert parse_moment("6:30:15", after=local) == local.replace(hour=6, minute=30, second=15)
    # A time of day already past means tomorrow's.
    assert parse_moment("04:00", after=local) == local.replace(hour=4) + timedelta(days=1)
    assert parse_moment("05:00", after=local) == local + timedelta(days=1)
    assert parse_moment("2026-11-30T06:00:00+00:00") == datetime(2026, 11, 30, 6, tzinfo=UTC)
    assert parse_moment("2026-11-30T06:00").tzinfo is not None  # naive means local
    for bad in ("24:00", "6:60", "soon", ""):
        with pytest.raises(PlanError):
            parse_moment(bad)

    assert window_from(START, within="45m") == START + timedelta(minutes=45)
    assert window_from(START, within=90) == START + timedelta(seconds=90)
    assert window_from(START, window="2026-11-30T06:00:00+01:00") == \
        datetime(2026, 11, 30, 6, tzinfo=timezone(timedelta(hours=1)))
    assert window_from(START) is None
    with pytest.raises(PlanError, match="not both"):
        window_from(START, window="06:00", within="1h")
    with pytest.raises(PlanError, match="--within"):
        window_from(START, within="a while")


def test_format_elapsed() -> None:
    assert format_elapsed(0.4123) == "0.412s"
    assert format_elapsed(12.34) == "12.3s"
    assert format_elapsed(245) == "4m05s"
    assert format_elapsed(7620) == "2h07m"
    assert format_elapsed(7 * 86400) == "7d"
    assert format_elapsed(2 * 86400 + 3 * 3600) == "2d3h"
    assert format_elapsed(None) == "—"


# -- from real history --------------------------------------------------------------------------

SLOW_SECONDS = 0.4


def slow_branch_workflow(name: str = "plan-diamond", version: int = 1,
                         extra_step: bool = False) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=version)

    @wf.step()
    def fetch(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[fetch])
    def fast(ctx: konduit.Context) -> str:
        time.sleep(0.02)
        return "fast"

    @wf.step(after=[fetch])
    async def slow(ctx: konduit.Context) -> str:
        await asyncio.sleep(SLOW_SECONDS)
        return "slow"

    @wf.step(after=[fast, slow])
    def join(ctx: konduit.Context) -> list[str]:
        return sorted(ctx.upstream.values())

    if extra_step:
        @wf.step(after=[join])
        def announce(ctx: konduit.Context) -> str:
            return "done"

    return wf


def plan_from(db_url: str, spec: WorkflowSpec, *, window_seconds: float | None,
              history: str = "7d") -> Plan:
    async def go() -> Plan:
        db = Database(db_url, min_size=1, max_size=1)
        await db.open()
        try:
            start = datetime.now(UTC)
            window = None if window_seconds is None else start + timedelta(seconds=window_seconds)
            return await load_plan(db, spec, history=history, start=start, window=window)
        finally:
            await db.close()

    return asyncio.run(go())


@pytest.mark.storage
def test_a_plan_from_real_history_finds_the_slow_branch(make_app: Callable[..., konduit.App],
                                                        db_url: str) -> None:
    wf = slow_branch_workflow()
    app = make_app(wf)
    runs = 4
    with running_worker(app, concurrency=8):
        ids = [app.start(wf.name, {"n": i}).id for i in range(runs)]
        for eid in ids:
            app.wait(eid, timeout=30)
    unfinished = app.start(wf.name, {"n": "no worker"}).id  # running: not history yet

    plan = plan_from(db_url, wf.spec, window_seconds=None)
    assert set(plan.durations) == {"fetch", "fast", "slow", "join"}
    assert all(d.samples == runs and d.degraded == 0 for d in plan.durations.values())
    slow = plan.durations["slow"]
    assert SLOW_SECONDS <= slow.p50 <= slow.p95 <= slow.p99 < SLOW_SECONDS + 5
    assert plan.durations["fast"].p99 < slow.p50
    for q in QUANTILES:
        assert plan.estimates[q].path == ["fetch", "slow", "join"]
    assert plan.on_path("fast") == []
    assert plan.verdict is None

    p50 = plan.estimates["p50"].total_seconds
    p99 = plan.estimates["p99"].total_seconds
    assert p50 >= SLOW_SECONDS
    # The verdict flips as the window shrinks.
    assert plan_from(db_url, wf.spec, window_seconds=p99 + 30).verdict == "safe"
    if p99 - p50 > 0.01:
        assert plan_from(db_url, wf.spec, window_seconds=(p50 + p99) / 2).verdict == "at risk"
    assert plan_from(db_url, wf.spec, window_seconds=p50 / 4).verdict == "will miss"

    # History counts every version of the workflow, by name: a new version's new step has none.
    v2 = slow_branch_workflow(version=2, extra_step=True).spec
    plan = plan_from(db_url, v2, window_seconds=60)
    assert plan.no_history == ["announce"]
    assert plan.estimates["p99"].path == ["fetch", "slow", "join", "announce"]
    assert plan.durations["slow"].samples == runs

    # Only executions created within the history window count.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE konduit_executions SET created_at = created_at - interval '8 days' "
                     "WHERE id = %s", (ids[0],))
    assert plan_from(db_url, wf.spec, window_seconds=None).durations["slow"].samples == runs - 1
    assert plan_from(db_url, wf.spec, window_seconds=None,
                     history="30d").durations["slow"].samples == runs
    assert app.status(unfinished).status == "running"


@pytest.mark.storage
def test_failed_and_skipped_steps_are_not_history(make_app: Callable[..., konduit.App],
                                                  db_url: str) -> None:
    wf = konduit.Workflow("plan-partial", version=1)

    @wf.step()
    def first(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[first], retry=konduit.Retry(max_attempts=1))
    def flaky(ctx: konduit.Context) -> int:
        if ctx.input["fail"]:
            raise konduit.NonRetryableError("no")
        return 2

    app = make_app(wf)
    with running_worker(app, concurrency=4):
        app.wait(app.start(wf.name, {"fail": False}).id, timeout=30)
        with pytest.raises(konduit.ExecutionFailed):
            app.wait(app.start(wf.name, {"fail": True}).id, timeout=30)
    plan = plan_from(db_url, wf.spec, window_seconds=None)
    assert plan.durations["first"].samples == 2  # the failed execution finished too
    assert plan.durations["flaky"].samples == 1  # its failed step is not a duration


# -- the command line ---------------------------------------------------------------------------

PLAN_APP = '''
import asyncio
import time

import konduit

wf = konduit.Workflow("plan-cli", version=1)


@wf.step()
def fetch(ctx):
    return 1


@wf.step(after=[fetch])
def quick(ctx):
    return 2


@wf.step(after=[fetch])
async def sluggish(ctx):
    await asyncio.sleep(0.3)
    return 3


@wf.step(after=[quick, sluggish])
def join(ctx):
    return 4


app = konduit.App([wf], database_url="postgresql://nobody@127.0.0.1:1/not_this_one")
'''


def _load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("plan_app_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.storage
def test_konduit_plan_command(tmp_path: Path, make_app: Callable[..., konduit.App],
                              db_url: str) -> None:
    (tmp_path / "plan_app.py").write_text(textwrap.dedent(PLAN_APP))
    common = ("--app", "plan_app:app", "--database-url", db_url)

    # No history yet: every step flagged, no verdict.
    proc = konduit_cli("plan", "plan-cli", "--within", "30s", "--json", *common, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["verdict"] is None
    assert data["no_history"] == ["fetch", "quick", "sluggish", "join"]

    wf = _load_module(tmp_path / "plan_app.py").wf
    app = make_app(wf)
    with running_worker(app, concurrency=8):
        for eid in [app.start("plan-cli", {"n": i}).id for i in range(3)]:
            app.wait(eid, timeout=30)

    proc = konduit_cli("plan", "plan-cli", "--within", "30s", "--json", *common, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["workflow"] == "plan-cli" and data["version"] == 1
    assert data["verdict"] == "safe"
    assert data["window_seconds"] == pytest.approx(30)
    assert data["no_history"] == []
    steps = {s["step"]: s for s in data["steps"]}
    assert steps["sluggish"]["samples"] == 3
    assert steps["sluggish"]["p50"] >= 0.3
    assert steps["sluggish"]["critical"] == ["p50", "p95", "p99"]
    assert steps["quick"]["critical"] == []
    for q in ("p50", "p95", "p99"):
        assert data["critical_path"][q]["path"] == ["fetch", "sluggish", "join"]
        assert data["critical_path"][q]["slack_seconds"] > 0
    p50 = data["critical_path"]["p50"]["total_seconds"]

    # A window at risk (or missed) is an exit code a nightly check can page on, JSON or not.
    proc = konduit_cli("plan", "plan-cli", "--within", f"{p50 * 1000 / 3:.0f}ms", "--json", *common,
                       cwd=tmp_path)
    assert proc.returncode == PLAN_AT_RISK_EXIT_CODE == 3, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "will miss"
    p99 = data["critical_path"]["p99"]["total_seconds"]
    if p99 - p50 > 0.01:
        proc = konduit_cli("plan", "plan-cli", "--within", f"{(p50 + p99) * 500:.0f}ms", *common,
                           cwd=tmp_path)
        assert proc.returncode == 3, proc.stderr
        assert "at risk" in proc.stdout

    # The human-readable plan: the table, the paths, the verdict, the caveat.
    proc = konduit_cli("plan", "plan-cli", "--start", "05:00", "--window", "06:00", *common,
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("p50", "p95", "p99", "samples", "critical path", "fetch → sluggish → join",
                   "safe", "approximation"):
        assert needle in out, out
    sluggish_row = next(line for line in out.splitlines() if line.strip().startswith("sluggish"))
    quick_row = next(line for line in out.splitlines() if line.strip().startswith("quick"))
    assert "●" in sluggish_row and "●" not in quick_row

    assert_clean_error(konduit_cli("plan", "plan-cli", "--window", "25:00", *common, cwd=tmp_path),
                       "--window", "not a time of day")
    assert_clean_error(konduit_cli("plan", "plan-cli", "--window", "06:00", "--within", "1h",
                                   *common, cwd=tmp_path), "not both")
    assert_clean_error(konduit_cli("plan", "plan-cli", "--history", "lately", *common,
                                   cwd=tmp_path), "--history")
    assert_clean_error(konduit_cli("plan", "no-such-flow", *common, cwd=tmp_path),
                       "unknown workflow 'no-such-flow'")
