"""``konduit demo``: the nightly content pipeline of seed 004, with simulated work.

transcribe fans out to five branches that run in parallel (summarise, translate, cover_image,
captions, schedule); publish joins all five. Each step sleeps 50-400 ms; translate fails its
first attempt with a transient error on every other execution, so retries show up. The summary
shows per execution the fan-in wait of publish (first branch finished -> publish ready) and the
straggler that set it (the branch publish waited for last), then per branch (seed 004: instrument
the branches, not the pipeline) its p50, max, how often it straggled and its retries.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import statistics
import threading
import time
import traceback
from datetime import date, datetime
from typing import Any
from uuid import UUID

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import konduit
from konduit.client import ExecutionResult

# Bump the version whenever a step's options change: a database that already ran the demo keeps
# the old definition under the old version number.
pipeline = konduit.Workflow("nightly-content", version=1)
BRANCHES = ("summarise", "translate", "cover_image", "captions", "schedule")
CHANNELS = ("web", "podcast", "youtube", "newsletter", "instagram", "linkedin")


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


@pipeline.step(after=[transcribe])
async def cover_image(ctx: konduit.Context) -> dict[str, Any]:
    return {"image": f"covers/episode-{ctx.input['episode']}.png", "took": await work()}


@pipeline.step(after=[transcribe])
async def captions(ctx: konduit.Context) -> dict[str, Any]:
    return {"captions": len(ctx.input["channels"]), "took": await work()}


@pipeline.step(after=[transcribe])
async def schedule(ctx: konduit.Context) -> dict[str, Any]:
    return {"slot": f"{ctx.input['date']}T06:00:00Z", "took": await work()}


@pipeline.step(after=[summarise, translate, cover_image, captions, schedule])
async def publish(ctx: konduit.Context) -> dict[str, Any]:
    await work()
    return {"episode": ctx.input["episode"], "channels": ctx.input["channels"],
            "assets": sorted(ctx.upstream)}


# -- running it -----------------------------------------------------------------------------


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start and end else None


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}s"


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


def _summary(app: konduit.App, ids: list[UUID],
             results: dict[UUID, ExecutionResult]) -> tuple[Table, Table, int]:
    """One table per execution, one per branch (seed 004: instrument the branches, not the
    pipeline), and how many executions retried a step."""
    runs = Table(title="executions", title_justify="left")
    for header in ("execution", "status", "total", "fan-in wait", "straggler", "retries"):
        runs.add_column(header, justify="right" if header in ("total", "fan-in wait") else "left",
                        no_wrap=header in ("straggler", "retries"))
    took: dict[str, list[float]] = {name: [] for name in BRANCHES}
    straggled: dict[str, int] = dict.fromkeys(BRANCHES, 0)
    tries: dict[str, int] = dict.fromkeys(BRANCHES, 0)
    retried = 0
    for eid in ids:
        result = results.get(eid) or app.status(eid)
        steps = {s["step"]: s for s in app.steps(eid)}
        extra = {t["step"]: int(t["attempt"]) - 1 for t in app.tasks(eid) if t["attempt"] > 1}
        retried += bool(extra)
        for name in BRANCHES:
            seconds = _seconds(steps[name]["fired_at"], steps[name]["ended_at"])
            if seconds is not None:
                took[name].append(seconds)
            tries[name] += extra.get(name, 0)
        join = steps["publish"]
        straggler = join["straggler"]
        if straggler in straggled:
            straggled[straggler] += 1
        slowest = _seconds(steps[straggler]["fired_at"], steps[straggler]["ended_at"]) \
            if straggler else None
        color = "green" if result.status == "succeeded" else "red"
        runs.add_row(
            str(eid)[:8], f"[{color}]{result.status}[/{color}]",
            _fmt(_seconds(result.created_at, result.finished_at)),
            _fmt(_seconds(join["first_upstream_at"], join["fired_at"])),
            f"[yellow]{straggler}[/yellow] {_fmt(slowest)}" if straggler else "—",
            ", ".join(f"{step} +{n}" for step, n in extra.items()) or "—",
        )
    branches = Table(title="branches", title_justify="left")
    for header in ("branch", "p50", "max", "straggler in", "retries"):
        branches.add_column(header, justify="left" if header == "branch" else "right")
    for name in BRANCHES:
        values = took[name]
        branches.add_row(
            name, _fmt(statistics.median(values) if values else None),
            _fmt(max(values) if values else None), f"{straggled[name]}/{len(ids)}",
            str(tries[name]),
        )
    return runs, branches, retried


def run_demo(*, executions: int = 5, concurrency: int = 8, workers: int = 2,
             database_url: str | None = None, console: Console | None = None,
             timeout: float = 60.0) -> int:
    """Run the demo; returns the exit code (0 when every execution succeeded)."""
    console = console or Console()
    app = konduit.App([pipeline], database_url=database_url)
    # Engine warnings (a branch failing for good, say) print above the progress bar, briefly.
    log_handler = RichHandler(console=console, level=logging.WARNING, show_path=False,
                              show_time=False)
    log_handler.setFormatter(_BriefFormatter())
    logging.getLogger("konduit").addHandler(log_handler)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []
    try:
        with console.status("connecting to PostgreSQL (the embedded server starts on first use)"):
            app.migrate()  # opens the database first; also readies a fresh real database
        today = date.today().isoformat()
        suffix = secrets.token_hex(3)
        began = time.monotonic()
        ids = [
            app.start(
                pipeline.name,
                {"episode": i, "date": today, "channels": list(CHANNELS),
                 "flaky_translate": i % 2 == 1},
                idempotency_key=f"nightly-{today}-{i}-{suffix}",
            ).id
            for i in range(1, executions + 1)
        ]
        console.print(f"started {executions} execution(s) of [bold]{pipeline.name}[/bold] "
                      f"on {workers} worker(s) x {concurrency} slots\n"
                      f"transcribe → ({', '.join(BRANCHES)}) → publish")
        threads, errors = _start_workers(app, workers, concurrency, stop)
        results = _wait_all(app, ids, console, stop, timeout)
        wall = time.monotonic() - began
        runs, branches, retried = _summary(app, ids, results)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        app.close()
        logging.getLogger("konduit").removeHandler(log_handler)
    console.print(runs)
    console.print(branches)
    for exc in errors:
        console.print(f"[red]worker failed:[/red] {exc}")
    ok = sum(r.status == "succeeded" for r in results.values())
    console.print(
        f"{ok}/{executions} succeeded in {wall:.1f} s; {retried}/{executions} retried a step "
        "(translate's transient error).\nfan-in wait = first branch finished → publish ready; "
        "the straggler is the branch publish waited for last."
    )
    if len(results) < executions:
        console.print(f"[red]{executions - len(results)} execution(s) still unfinished after "
                      f"{timeout:.0f} s[/red]")
    return 0 if ok == executions and not errors else 1
