"""``konduit demo``: a nightly content pipeline, with simulated work, and an incident.

transcribe fans out to five branches that run in parallel (summarise, translate, cover_image,
captions, schedule); publish joins them. Each step sleeps 50-400 ms; translate fails its first
attempt with a transient error on every other execution, so retries show up.

Every execution has a window (``deadline_at`` = its start + ``window`` seconds, the 6 am
publication of a production night). The demo runs that night at one twentieth of its pace
(:data:`SEED_SCALE`: one production second is 50 ms here), and takes every number from it at that
scale: the image-resize call behind cover_image normally takes 3-5 s (0.15-0.25 s here), and
cover_image carries the default rule, a deadline of its own, *adaptive*: 1.5 x its p99 over the
last 7 days, clamped between 10 s and 45 s (0.5 s and 2.25 s here), 16 s (0.8 s here) while it
has fewer than 20 successful runs of history. Its normal runs make that budget the 10 s floor on
a database that ran the demo before. In the last execution(s) the resize slows down as it did
in production; its 38 s would be 1.9 s here, shorter than the demo's window, so the incident is
stretched to 10 s (200 production seconds) to make waiting for it visibly miss the window. Past the
deadline the engine cancels the handler and the branch ends ``degraded`` with its fallback
image; cover_image is an optional branch of publish's ``Join.required()``, so publish goes out
inside the window instead of waiting 10 s for the resize.

The summary shows per execution whether publish made the window, the fan-in wait of publish
(first branch finished -> publish ready), the straggler that set it, and which branch degraded
and why; per branch (instrument the branches, not the pipeline) its p50, max, how often
it straggled or degraded and its retries; and the plan for the next run (``konduit plan``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import statistics
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from rich import box
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import konduit
from konduit.core.durations import format_elapsed
from konduit.core.ids import short_id
from konduit.db.connect import open_database
from konduit.db.database import Database, Row
from konduit.engine.client import ExecutionResult
from konduit.engine.deadlines import MAX_SAMPLES, MIN_SAMPLES, adaptive_budget

# Bump the version whenever a step's options change: a database that already ran the demo keeps
# the old definition under the old version number. (2: cover_image's deadline and fallback;
# 3: its clamp follows the default 10-45 s.)
pipeline = konduit.Workflow("nightly-content", version=3)
BRANCHES = ("summarise", "translate", "cover_image", "captions", "schedule")
CHANNELS = ("web", "podcast", "youtube", "newsletter", "instagram", "linkedin")

SEED_SCALE = 0.05
"""Demo seconds per production second: a production night, twenty times faster."""


def seed(seconds: float) -> float:
    """A production duration at the demo's pace."""
    return seconds * SEED_SCALE


RESIZE_SECONDS = (seed(3), seed(5))
"""How long the image-resize call normally takes (in production: 4 s)."""
INCIDENT_RESIZE_SECONDS = 10.0
"""... and during the incident: production's 38 s would be 1.9 s, inside the demo's window, so it
is stretched to 10 s (200 production seconds) to make waiting for it miss the window."""
COVER_DEADLINE = konduit.Deadline.adaptive(
    # The default rule: "1.5x the p99 from the last 7 days, clamped between 10s and 45s".
    factor=1.5, quantile=0.99, window="7d", floor=seed(10), ceiling=seed(45), default=seed(16)
)
FALLBACK_COVER = {"image": "fallback.png", "degraded": True}
T = TypeVar("T")


class TransientError(Exception):
    """What a flaky downstream API raises: worth retrying."""


async def work() -> float:
    """Simulated work: a short random sleep; returns the seconds it took."""
    took = random.uniform(0.05, 0.4)
    await asyncio.sleep(took)
    return round(took, 3)


@pipeline.step()
async def transcribe(ctx: konduit.Context) -> dict[str, Any]:
    took = await work()
    return {"episode": ctx.input["episode"], "words": random.randint(4000, 9000), "took": took}


@pipeline.step(after=[transcribe])
async def summarise(ctx: konduit.Context) -> dict[str, Any]:
    return {"summary": f"{ctx.upstream['transcribe']['words'] // 40} words", "took": await work()}


@pipeline.step(after=[transcribe], retry=konduit.Retry(max_attempts=3, base="100ms", jitter=False))
async def translate(ctx: konduit.Context) -> dict[str, Any]:
    if ctx.input["flaky_translate"] and ctx.attempt == 1:
        await work()
        raise TransientError("translation API answered 503 Service Unavailable")
    return {"languages": ["de", "es", "fr"], "took": await work()}


@pipeline.step(after=[transcribe], deadline=COVER_DEADLINE, required=False,
               fallback=lambda ctx: dict(FALLBACK_COVER))
async def cover_image(ctx: konduit.Context) -> dict[str, Any]:
    # The image-resize service. No cooperation needed: at the deadline the engine cancels this
    # coroutine (a sync handler would be abandoned on its thread) and uses the fallback.
    took = INCIDENT_RESIZE_SECONDS if ctx.input.get("incident") else random.uniform(*RESIZE_SECONDS)
    await asyncio.sleep(took)
    return {"image": f"covers/episode-{ctx.input['episode']}.png", "took": round(took, 3)}


@pipeline.step(after=[transcribe])
async def captions(ctx: konduit.Context) -> dict[str, Any]:
    return {"captions": len(ctx.input["channels"]), "took": await work()}


@pipeline.step(after=[transcribe])
async def schedule(ctx: konduit.Context) -> dict[str, Any]:
    return {"slot": f"{ctx.input['date']}T06:00:00Z", "took": await work()}


@pipeline.step(after=[summarise, translate, cover_image, captions, schedule],
               join=konduit.Join.required())
async def publish(ctx: konduit.Context) -> dict[str, Any]:
    await work()
    cover = ctx.upstream.get("cover_image") or {}
    return {"episode": ctx.input["episode"], "channels": ctx.input["channels"],
            "assets": sorted(ctx.upstream), "cover": cover.get("image"),
            "degraded": sorted(b for b, o in ctx.outcomes.items() if o == "degraded")}


# -- running it -----------------------------------------------------------------------------


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start and end else None


class _BriefFormatter(logging.Formatter):
    def formatException(self, ei: Any) -> str:
        return "".join(traceback.format_exception_only(ei[1])).strip()


def _start_workers(app: konduit.App, count: int, concurrency: int,
                   stop: threading.Event) -> tuple[list[threading.Thread], list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            app.run_worker(concurrency, stop_event=stop, poll_interval=0.1, shutdown_grace=2.0)
        except BaseException as exc:  # reported after the demo
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, name=f"demo-worker-{i}", daemon=True)
               for i in range(count)]
    for thread in threads:
        thread.start()
    return threads, errors


def _wait_all(app: konduit.App, ids: list[UUID], console: Console, stop: threading.Event,
              timeout: float) -> dict[UUID, ExecutionResult]:
    """Poll until every execution finished (or ``timeout``), with a progress bar."""
    results: dict[UUID, ExecutionResult] = {}
    deadline = time.monotonic() + timeout
    columns = (TextColumn("executions finished"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("run", total=len(ids))
        while len(results) < len(ids) and time.monotonic() < deadline and not stop.is_set():
            for eid in ids:
                if eid not in results:
                    result = app.status(eid)
                    if result.finished:
                        results[eid] = result
            progress.update(bar, completed=len(results))
            time.sleep(0.1)
    return results


@dataclass
class Degraded:
    """A branch that ended degraded (or otherwise not succeeded) in one execution."""

    execution: UUID
    step: str
    outcome: str
    after: float | None  # its span: fired -> ended
    reason: str
    published_with: Any = None


@dataclass
class Summary:
    runs: Table
    branches: Table
    retried: int = 0
    in_window: int = 0
    degraded: list[Degraded] = field(default_factory=list)


def _reason(error: str | None) -> str:
    """The last line of a task's error (a traceback's is the exception itself)."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no error recorded"


def _summary(app: konduit.App, ids: list[UUID], results: dict[UUID, ExecutionResult],
             windows: dict[UUID, datetime], slow: set[UUID]) -> Summary:
    """One table per execution, one per branch (instrument the branches, not the
    pipeline), and the branches that degraded."""
    runs = Table(title="executions (* = the slow image resize)", title_justify="left",
                 box=box.SIMPLE_HEAD, collapse_padding=True, show_edge=False)
    for header in ("execution", "status", "took", "in window", "fan-in\nwait", "straggler",
                   "degraded"):
        runs.add_column(header, justify="right" if header[0] in "tif" else "left",
                        no_wrap=header in ("execution", "status", "took"), overflow="fold")
    took: dict[str, list[float]] = {name: [] for name in BRANCHES}
    straggled: dict[str, int] = dict.fromkeys(BRANCHES, 0)
    degraded_in: dict[str, int] = dict.fromkeys(BRANCHES, 0)
    tries: dict[str, int] = dict.fromkeys(BRANCHES, 0)
    summary = Summary(runs, Table(title="branches", title_justify="left"))
    for eid in ids:
        result = results.get(eid) or app.status(eid)
        steps = {s.step: s for s in app.steps(eid)}
        tasks = app.tasks(eid)
        extra = {t.step: int(t.attempt) - 1 for t in tasks if t.attempt > 1}
        summary.retried += bool(extra)
        for name in BRANCHES:
            seconds = _seconds(steps[name].fired_at, steps[name].ended_at)
            if seconds is not None:
                took[name].append(seconds)
            tries[name] += extra.get(name, 0)
        bad = []
        for name in BRANCHES:
            status = steps[name].status
            if status in ("succeeded", "waiting", "active"):
                continue
            degraded_in[name] += status == "degraded"
            error = next((t.error for t in reversed(tasks) if t.step == name), None)
            output = result.output if isinstance(result.output, dict) else {}
            summary.degraded.append(Degraded(
                eid, name, status, _seconds(steps[name].fired_at, steps[name].ended_at),
                _reason(error), output.get("cover") if name == "cover_image" else None,
            ))
            bad.append(f"[yellow]{name}[/yellow]" if status == "degraded"
                       else f"[red]{name} {status}[/red]")
        join = steps["publish"]
        straggler = join.straggler
        if straggler in straggled:
            straggled[straggler] += 1
        slowest = _seconds(steps[straggler].fired_at, steps[straggler].ended_at) \
            if straggler else None
        published = join.ended_at if join.status in ("succeeded", "degraded") else None
        window = windows[eid]
        if published is not None and published <= window:
            summary.in_window += 1
            made = f"[green]✓ {format_elapsed(_seconds(published, window))} left[/green]"
        elif published is not None:
            made = f"[red]✗ {format_elapsed(_seconds(window, published))} late[/red]"
        else:
            made = "[red]not published[/red]"
        color = "green" if result.status == "succeeded" else "red"
        runs.add_row(
            short_id(eid) + ("[yellow]*[/yellow]" if eid in slow else ""),
            f"[{color}]{result.status}[/{color}]",
            format_elapsed(_seconds(result.created_at, result.finished_at)),
            made,
            format_elapsed(_seconds(join.first_upstream_at, join.fired_at)),
            f"[yellow]{straggler}[/yellow] {format_elapsed(slowest)}" if straggler else "—",
            ", ".join(bad) or "—",
        )
    branches = summary.branches
    branches.box = box.SIMPLE_HEAD
    branches.show_edge = False
    for header in ("branch", "p50", "max", "straggler in", "degraded in", "retries"):
        branches.add_column(header, justify="left" if header == "branch" else "right")
    for name in BRANCHES:
        values = took[name]
        branches.add_row(
            name, format_elapsed(statistics.median(values) if values else None),
            format_elapsed(max(values) if values else None), f"{straggled[name]}/{len(ids)}",
            f"{degraded_in[name]}/{len(ids)}", str(tries[name]),
        )
    return summary


async def _with_db(database_url: str, use: Callable[[Database], Awaitable[T]]) -> T:
    # Migrated by run_demo already: no schema check on every look.
    db = await open_database(database_url, max_size=1, name="konduit-demo", check_schema=False)
    try:
        return await use(db)
    finally:
        await db.close()


def _cover_deadline(database_url: str) -> str:
    """cover_image's budget for the next tasks and where it comes from, as the engine computes
    it (:mod:`konduit.engine.deadlines`): 1.5 x p99 of its successful runs over 7 days, clamped."""
    d = COVER_DEADLINE
    assert d.ceiling is not None and d.default is not None

    async def query(db: Database) -> Row | None:
        return await db.one("step_duration_quantile", workflow_name=pipeline.name,
                            step="cover_image", quantile=d.quantile, window_seconds=d.window,
                            max_samples=MAX_SAMPLES)

    row = asyncio.run(_with_db(database_url, query))
    p99 = None if row is None or row["seconds"] is None else float(row["seconds"])
    samples = 0 if row is None else int(row["samples"])
    budget = adaptive_budget(d, p99, samples)
    rule = (f"{d.factor:g} x its p99 over 7 days, clamped to [{d.floor:g} s, {d.ceiling:g} s] "
            f"(production's {d.floor / SEED_SCALE:g}-{d.ceiling / SEED_SCALE:g} s at the demo's pace)")
    if p99 is None or samples < MIN_SAMPLES:
        return (f"{budget:g} s, the default while its history is thin ({samples} successful "
                f"run(s), fewer than {MIN_SAMPLES}); then {rule}")
    return f"{budget:.2f} s = {rule}; its p99 is {p99:.2f} s over {samples} runs"


def _plan(database_url: str, window: float) -> list[Any]:
    """The plan of the next run from the history just made (what ``konduit plan`` prints)."""
    from konduit.observe.plan import load_plan, plan_renderables

    async def load(db: Database) -> list[Any]:
        start = datetime.now(UTC)
        plan = await load_plan(db, pipeline.spec, history="7d", start=start,
                               window=start + timedelta(seconds=window))
        return plan_renderables(plan, steps_table=False)

    return asyncio.run(_with_db(database_url, load))


def run_demo(*, executions: int = 5, concurrency: int = 8, workers: int = 2,
             incident_after: int | None = None, window: float = 5.0,
             database_url: str | None = None, console: Console | None = None,
             timeout: float = 60.0) -> int:
    """Run the demo; returns the exit code (0 when every execution succeeded, degraded branches
    included). Executions after the ``incident_after``-th (default: the last one) hit the slow
    image resize; each has ``window`` seconds from its start to publish."""
    console = console or Console()
    if incident_after is None:
        incident_after = executions - 1
    incidents = max(0, executions - incident_after)
    app = konduit.App([pipeline], database_url=database_url)
    # Engine warnings (a branch failing for good, say) print above the progress bar, briefly.
    # Piped, a plain line: Rich pads its log lines to the console's width, 4,096 columns there.
    log_handler: logging.Handler
    if console.is_terminal:
        log_handler = RichHandler(console=console, level=logging.WARNING, show_path=False,
                                  show_time=False)
        log_handler.setFormatter(_BriefFormatter())
    else:
        log_handler = logging.StreamHandler(console.file)
        log_handler.setLevel(logging.WARNING)
        log_handler.setFormatter(_BriefFormatter("%(levelname)-8s %(message)s"))
    logging.getLogger("konduit").addHandler(log_handler)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []
    plan: list[Any] = []
    try:
        with console.status("connecting to PostgreSQL (the embedded server starts on first use)"):
            app.migrate()  # opens the database first; also readies a fresh real database
        today = date.today().isoformat()
        suffix = secrets.token_hex(3)
        console.print(
            f"[bold]{pipeline.name}[/bold] v{pipeline.version}: transcribe → "
            f"({', '.join(BRANCHES)}) → publish\n"
            f"{executions} execution(s) on {workers} worker(s) x {concurrency} slots, each with "
            f"a {window:g} s window to publish in"
        )
        if incidents:
            first = incident_after + 1
            which = f"execution {first}" if incidents == 1 else f"executions {first}-{executions}"
            console.print(
                f"[yellow]incident[/yellow] in {which}: the image-resize call behind cover_image "
                f"slows from ~{statistics.mean(RESIZE_SECONDS):g} s to "
                f"{INCIDENT_RESIZE_SECONDS:g} s.\ncover_image's deadline: "
                f"{_cover_deadline(app.database_url)}; past it: {FALLBACK_COVER['image']}",
                soft_wrap=True,
            )
        threads, errors = _start_workers(app, workers, concurrency, stop)
        began = time.monotonic()
        ids: list[UUID] = []
        windows: dict[UUID, datetime] = {}
        slow: set[UUID] = set()
        for i in range(1, executions + 1):
            deadline_at = datetime.now(UTC) + timedelta(seconds=window)
            eid = app.start(
                pipeline.name,
                {"episode": i, "date": today, "channels": list(CHANNELS),
                 "flaky_translate": i % 2 == 1, "incident": i > incident_after},
                idempotency_key=f"nightly-{today}-{i}-{suffix}",
                deadline_at=deadline_at,
            ).id
            ids.append(eid)
            windows[eid] = deadline_at
            if i > incident_after:
                slow.add(eid)
        results = _wait_all(app, ids, console, stop, timeout)
        wall = time.monotonic() - began
        summary = _summary(app, ids, results, windows, slow)
        try:
            plan = _plan(app.database_url, window)
        except konduit.KonduitError as exc:  # the plan is a bonus: never fail the demo for it
            plan = [f"[yellow]no plan: {escape(str(exc))}[/yellow]"]
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        app.close()
        logging.getLogger("konduit").removeHandler(log_handler)
    console.print(summary.runs)
    console.print(summary.branches)
    if summary.degraded:
        console.print("degraded branches (the join went on without waiting for them):")
    for d in summary.degraded:
        used = "" if d.published_with is None else \
            f"; publish went out with {escape(json.dumps(d.published_with))}"
        console.print(
            f"  {short_id(d.execution)} [yellow]{d.step}[/yellow] {d.outcome} after "
            f"{format_elapsed(d.after)}: {escape(d.reason)}{used}",
            soft_wrap=True,
        )
    for failure in errors:
        console.print(f"[red]worker failed:[/red] {failure}")
    ok = sum(r.status == "succeeded" for r in results.values())
    console.print(
        f"{ok}/{executions} succeeded in {wall:.1f} s; published inside the window: "
        f"{summary.in_window}/{executions}; {summary.retried}/{executions} retried a step "
        f"(translate's transient error); {len({d.execution for d in summary.degraded})}/"
        f"{executions} degraded a branch.",
        soft_wrap=True,
    )
    console.print("fan-in wait = first branch finished → publish ready; the straggler is the "
                  "branch publish waited for last.", soft_wrap=True)
    if incidents:
        console.print(
            f"without cover_image's deadline, publish would have waited "
            f"{INCIDENT_RESIZE_SECONDS:g} s for the resize and missed the {window:g} s window.",
            soft_wrap=True,
        )
    if plan:
        console.print(f"\nthe next run, planned from this history "
                      f"(konduit plan {pipeline.name} --app konduit.demo:pipeline "
                      f"--within {window:g}s):", soft_wrap=True)
        for renderable in plan:
            console.print(renderable)
    if len(results) < executions:
        console.print(f"[red]{executions - len(results)} execution(s) still unfinished after "
                      f"{timeout:.0f} s[/red]")
    return 0 if ok == executions and not errors else 1
