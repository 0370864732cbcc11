"""The ``konduit`` command line.

Every command that talks to the database takes ``--database-url``; without it the URL comes from
``KONDUIT_DATABASE_URL`` and, failing that, the embedded PostgreSQL server (migrated on first use).
Errors konduit knows about (:class:`konduit.KonduitError`) print one red line and exit 1.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import konduit
from konduit.db.connect import describe_url, open_database
from konduit.db.database import Row
from konduit.db.migrate import latest_version
from konduit.errors import CliError

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

cli = typer.Typer(
    name="konduit",
    help="Durable DAG workflows on PostgreSQL with an exactly-once join.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold database URLs with passwords
)
db_cli = typer.Typer(help="Database schema commands.", no_args_is_help=True)
cli.add_typer(db_cli, name="db")


DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="PostgreSQL URL (default: $KONDUIT_DATABASE_URL, else the embedded server).",
        show_default=False,
    ),
]
# Options shared by the commands that read history (stats, metrics).
History = Annotated[str, typer.Option(
    "--history", metavar="DURATION", help="Use the executions started within this long ago.")]
FanInAlert = Annotated[str, typer.Option(
    "--fan-in-alert", metavar="DURATION",
    help="Alert when a join's fan-in wait exceeds this ...")]
Consecutive = Annotated[int, typer.Option(
    "--consecutive", min=1, help="... in each of its last this many executions.")]

FINISHED_STYLES = {
    "succeeded": "green",
    "degraded": "yellow",
    "running": "cyan",
    "active": "cyan",
    "pending": "dim",
    "waiting": "dim",
    "ready": "dim",
    "failed": "red",
    "timed_out": "red",
    "cancelled": "magenta",
    "skipped": "dim",
}


# -- helpers ------------------------------------------------------------------------------------


def styled(status: str) -> str:
    style = FINISHED_STYLES.get(status)
    return f"[{style}]{status}[/{style}]" if style else status


def seconds(delta: timedelta | None) -> str:
    return "—" if delta is None else f"{delta.total_seconds():.3f}"


def between(start: datetime | None, end: datetime | None) -> timedelta | None:
    return end - start if start is not None and end is not None else None


def stamp(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value is not None else "—"


def offset(value: datetime | None, origin: datetime | None) -> str:
    """``value`` as seconds after ``origin`` (the execution's start)."""
    delta = between(origin, value)
    return "—" if delta is None else f"{delta.total_seconds():.3f}"


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def last_line(text: str | None) -> str:
    """The last non-empty line of an error (a traceback's is the exception itself)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def load_app(spec: str, database_url: str | None) -> konduit.App:
    """Import ``module:attribute`` (an App, or a Workflow to wrap in one) from the current
    directory or the installed packages; ``database_url`` overrides the App's own."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"APP must look like module:attribute (e.g. myproject.workflows:app), "
                       f"got {spec!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` would
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise CliError(f"cannot import module {module_name!r} (from {spec!r}): {exc}") from None
        raise  # the module exists but one of its own imports failed: show the traceback
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if isinstance(target, konduit.Workflow):
        return konduit.App([target], database_url=database_url)
    if not isinstance(target, konduit.App):
        raise CliError(f"{spec} is a {type(target).__name__}, not a konduit.App or konduit.Workflow")
    if database_url is None:
        return target
    # Same workflows, the database named on the command line (the registry is shared, not copied).
    app = konduit.App([], database_url=database_url)
    for name, value in vars(target).items():  # registry, pool size and other public settings
        if not name.startswith("_"):
            setattr(app, name, value)
    return app


@contextmanager
def opened(app: konduit.App) -> Iterator[konduit.App]:
    try:
        yield app
    finally:
        app.close()


def reachable(database_url: str | None, *, schema: bool = True) -> str | None:
    """Fail fast, in one line, when an explicitly configured database does not answer or, with
    ``schema``, has an older schema than this konduit needs (naming the command that fixes it).
    The embedded server is left alone: it is started and migrated on first use. Returns
    ``database_url``."""
    if not (database_url or os.environ.get("KONDUIT_DATABASE_URL")):
        return database_url
    flag = " --database-url URL" if database_url else ""
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)  # the probe says it in one line

    async def probe() -> None:
        db = await open_database(database_url, max_size=1, name="konduit-cli", check_schema=schema,
                                 schema_hint=f"konduit db migrate{flag}")
        await db.close()

    asyncio.run(probe())
    return database_url


def plain_app(database_url: str | None) -> konduit.App:
    """An App without workflows: enough to inspect, cancel and migrate."""
    return konduit.App([], database_url=reachable(database_url))


def parse_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc}") from None


def dump_json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)


# -- commands -----------------------------------------------------------------------------------


def _version(value: bool) -> None:
    if value:
        console.print(f"konduit {konduit.__version__}")
        raise typer.Exit()


@cli.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Durable DAG workflows on PostgreSQL with an exactly-once join."""


@db_cli.command("migrate")
def db_migrate(database_url: DatabaseUrl = None) -> None:
    """Apply the schema migrations this konduit needs (a no-op when the schema is current)."""
    with opened(konduit.App([], database_url=reachable(database_url, schema=False))) as app:
        applied = app.migrate()
    if applied:
        for name in applied:
            console.print(f"applied [green]{name}[/green]")
    console.print(f"schema is at version {latest_version()}"
                  + ("" if applied else " (already current)"))


@cli.command()
def worker(
    app_spec: Annotated[str, typer.Argument(metavar="APP", help="module:attribute of a konduit.App")],
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1,
                                             help="Tasks run at once.")] = 10,
    queue: Annotated[list[str] | None, typer.Option(
        "--queue", "-q", help="Queue to claim from; repeatable (default: default).")] = None,
    poll_interval: Annotated[float | None, typer.Option(
        help="Seconds between claims without a notification (default: $KONDUIT_POLL_INTERVAL or 1).",
        show_default=False)] = None,
    lease_seconds: Annotated[float | None, typer.Option(
        help="Lease length; a dead worker's tasks are retaken after it "
        "(default: $KONDUIT_LEASE_SECONDS or 15).",
        show_default=False)] = None,
    heartbeat_interval: Annotated[float | None, typer.Option(
        help="Seconds between lease extensions (default: $KONDUIT_HEARTBEAT_INTERVAL or 3).",
        show_default=False)] = None,
    shutdown_grace: Annotated[float | None, typer.Option(
        help="Seconds running tasks get to finish on SIGINT/SIGTERM (default: 10).",
        show_default=False)] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    database_url: DatabaseUrl = None,
) -> None:
    """Run a worker for the workflows of APP until SIGINT/SIGTERM (a graceful stop)."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    app = load_app(app_spec, database_url)
    names = sorted({spec.name for spec in app.registry})
    if not names:
        raise CliError(f"{app_spec} has no workflows: nothing for a worker to run")
    options: dict[str, Any] = {
        key: value
        for key, value in {
            "poll_interval": poll_interval,
            "lease_seconds": lease_seconds,
            "heartbeat_interval": heartbeat_interval,
            "shutdown_grace": shutdown_grace,
        }.items()
        if value is not None
    }
    queues = tuple(queue or ("default",))
    url = database_url or os.environ.get("KONDUIT_DATABASE_URL")
    where = describe_url(url) if url else "the App's database (embedded server by default)"
    err_console.print(
        f"konduit worker: {', '.join(names)} on {where}, "
        f"queues {', '.join(queues)}, concurrency {concurrency} (Ctrl-C stops gracefully)",
        soft_wrap=True,
    )
    with opened(app):
        try:
            done = app.run_worker(concurrency, queues=queues, **options)
        except ValueError as exc:  # WorkerConfig rejects inconsistent settings
            raise CliError(str(exc)) from None
    err_console.print(f"worker stopped after {done.completed} task(s)")
    # Tasks still running at the end of the grace period were released to other workers, but a
    # sync handler's thread cannot be interrupted, and the interpreter would join it at exit:
    # leave now, so a stop takes the grace period and no longer (their results are fenced off).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@cli.command()
def start(
    workflow: Annotated[str, typer.Argument(metavar="WORKFLOW", help="Name of the workflow to start.")],
    app_spec: Annotated[str, typer.Option(
        "--app", metavar="MODULE:ATTR", envvar="KONDUIT_APP",
        help="module:attribute of the konduit.App that defines the workflow.")],
    input: Annotated[str | None, typer.Option("--input", "-i", help="Input as JSON.")] = None,
    idempotency_key: Annotated[str | None, typer.Option(
        "--idempotency-key", "-k", help="Starting twice with the same key returns the same id.")
    ] = None,
    version: Annotated[int | None, typer.Option(help="Workflow version (default: the latest).",
                                                show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for it to finish.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds --wait waits at most.")] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Start an execution and print its id (with --wait: then its output)."""
    payload = parse_json(input, "--input")
    with opened(load_app(app_spec, reachable(database_url))) as app:
        handle = app.start(workflow, payload, idempotency_key=idempotency_key, version=version)
        console.print(str(handle.id))
        if not wait:
            return
        began = time.monotonic()
        try:
            result = handle.wait(timeout=timeout)
        except TimeoutError as exc:
            raise CliError(str(exc)) from None
        err_console.print(f"{styled(result.status)} after {time.monotonic() - began:.2f} s")
        console.print(dump_json(result.output), markup=False)


def step_table(steps: list[Row], tasks: list[Row], origin: datetime | None) -> Table:
    """One row per step, in firing order; times in seconds after the execution started."""
    attempts: dict[str, int] = {}
    for task in tasks:
        attempts[task["step"]] = attempts.get(task["step"], 0) + int(task["attempt"])
    far = datetime.max.replace(tzinfo=origin.tzinfo if origin else None)
    ordered = sorted(steps, key=lambda s: (s["fired_at"] or far, s["step"]))
    show_tasks = any(s["tasks_total"] != 1 for s in steps)  # only map steps make several
    table = Table(title="steps (seconds after the execution started)", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    table.add_column("step", no_wrap=True)
    table.add_column("status", no_wrap=True)
    if show_tasks:
        table.add_column("tasks", justify="right")
    for header in ("tries", "fired", "ended", "took", "fan-in\nwait"):
        table.add_column(header, justify="right")
    table.add_column("straggler", no_wrap=True)
    for s in ordered:
        is_join = int(s["up_total"]) > 1
        done = int(s["tasks_ok"]) + int(s["tasks_degraded"])
        cells = [escape(s["step"]), styled(s["status"])]
        if show_tasks:
            cells.append(f"{done}/{s['tasks_total']}" if s["tasks_total"] is not None else "—")
        cells += [
            str(attempts.get(s["step"], 0)),
            offset(s["fired_at"], origin),
            offset(s["ended_at"], origin),
            seconds(between(s["fired_at"], s["ended_at"])),
            seconds(between(s["first_upstream_at"], s["fired_at"])) if is_join else "",
            escape(s["straggler"] or "") if is_join else "",
        ]
        table.add_row(*cells)
    return table


@cli.command()
def status(
    execution_id: Annotated[str, typer.Argument(metavar="EXECUTION_ID", help="The execution's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Show an execution: status, error, output and a table of its steps."""
    with opened(plain_app(database_url)) as app:
        result = app.status(execution_id)
        steps = app.steps(result.id)
        tasks = app.tasks(result.id)
        versions = app.outputs(result.id)
        late = [p for p in app.payloads(result.id) if p["source"] == "late"]
    if as_json:
        print(dump_json({
            "id": result.id, "workflow": result.workflow, "version": result.version,
            "status": result.status, "error": result.error, "output": result.output,
            "outcomes": result.outcomes, "created_at": result.created_at,
            "finished_at": result.finished_at, "output_versions": versions,
            "late_results": late,
        }))
        return
    took = between(result.created_at, result.finished_at)
    console.print(f"execution [bold]{result.id}[/bold]  {escape(result.workflow)} "
                  f"v{result.version}  {styled(result.status)}")
    console.print(f"started {stamp(result.created_at)}"
                  + (f", finished {stamp(result.finished_at)} ({seconds(took)} s)" if took else ""))
    if result.error:
        console.print(f"[red]error:[/red] {escape(result.error)}")
    if result.output is not None:
        console.print("output:")
        console.print(dump_json(result.output), markup=False)
    if len(versions) > 1:
        console.print("output versions (repairs):")
        for version in versions:
            degraded = ", ".join(version["degraded"]) or "none degraded"
            console.print(f"  v{version['version']} {version['status']} ({degraded}): "
                          f"{dump_json(version['output'])}", markup=False, soft_wrap=True)
    if steps:
        console.print(step_table(steps, tasks, result.created_at))
    for payload in late:
        where = payload["step"] + (f"[{payload['map_index']}]" if payload["map_index"] else "")
        console.print(f"[yellow]late result[/yellow] of {escape(where)} (after its deadline; "
                      f"the join did not use it): {escape(dump_json(payload['payload']))}",
                      soft_wrap=True)


@cli.command("list")
def list_executions(
    status: Annotated[str | None, typer.Option(help="Only executions with this status.")] = None,
    workflow: Annotated[str | None, typer.Option(help="Only executions of this workflow.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 20,
    database_url: DatabaseUrl = None,
) -> None:
    """List recent executions, newest first."""
    with opened(plain_app(database_url)) as app:
        results = app.list(status=status, workflow=workflow, limit=limit)
    if not results:
        console.print("no executions")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    table.add_column("id", no_wrap=True, min_width=36)
    table.add_column("status", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("took", justify="right")
    table.add_column("workflow", overflow="fold")
    today = datetime.now().astimezone().date()
    for r in results:
        started = r.created_at.astimezone() if r.created_at else None
        table.add_row(
            str(r.id), styled(r.status),
            "—" if started is None else started.strftime(
                "%H:%M:%S" if started.date() == today else "%Y-%m-%d %H:%M"),
            seconds(between(r.created_at, r.finished_at)), f"{escape(r.workflow)} v{r.version}",
        )
    console.print(table)
    for r in results:
        if r.error:
            console.print(f"[red]{r.id}[/red]: {escape(last_line(r.error))}")


@cli.command()
def cancel(
    execution_id: Annotated[str, typer.Argument(metavar="EXECUTION_ID", help="The execution's id.")],
    database_url: DatabaseUrl = None,
) -> None:
    """Cancel a running execution (its pending work is never started)."""
    with opened(plain_app(database_url)) as app:
        if app.cancel(execution_id):
            console.print(f"cancelled {execution_id}")
            return
        result = app.status(execution_id)
    console.print(f"execution {execution_id} has already finished ({styled(result.status)}); "
                  "nothing to cancel")


@cli.command()
def repair(
    execution_id: Annotated[str, typer.Argument(metavar="EXECUTION_ID", help="The execution's id.")],
    app_spec: Annotated[str, typer.Option(
        "--app", metavar="MODULE:ATTR", envvar="KONDUIT_APP",
        help="module:attribute of the konduit.App that defines the workflow.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the repair to finish.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds --wait waits at most.")] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Re-run the degraded or failed branches of a finished execution and what depends on them.

    When it finishes, its output becomes a new version that replaces the degraded one; earlier
    versions stay visible (``status`` lists them). Workers of APP do the re-running.
    """
    with opened(load_app(app_spec, database_url)) as app:
        rerun = app.repair(execution_id)
        console.print(f"re-running {', '.join(rerun)} of {execution_id}")
        if not wait:
            return
        try:
            result = app.wait(execution_id, timeout)
        except konduit.ExecutionFailed as exc:
            result = exc.result
        versions = app.outputs(execution_id)
    console.print(f"execution {execution_id}: {styled(result.status)}")
    for version in versions:
        degraded = ", ".join(version["degraded"]) or "none degraded"
        console.print(f"  output v{version['version']} ({version['status']}, {degraded}): "
                      f"{dump_json(version['output'])}", soft_wrap=True)
    if result.status != "succeeded":
        raise typer.Exit(1)


@cli.command("dead-letters")
def dead_letters(
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 20,
    database_url: DatabaseUrl = None,
) -> None:
    """List dead-lettered tasks: retries exhausted or a non-retryable error."""
    with opened(plain_app(database_url)) as app:
        rows = app.dead_letters(limit)
    if not rows:
        console.print("no dead letters")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for header in ("task", "execution", "workflow", "step", "attempts", "failed at", "error"):
        table.add_column(header)
    for r in rows:
        step = r["step"] + (f"[{r['map_index']}]" if r["map_index"] else "")
        table.add_row(
            str(r["id"]), str(r["execution_id"]), escape(r["workflow_name"]), escape(step),
            str(r["attempt"]), stamp(r["finished_at"]),
            escape(last_line(r["error"]))[:80],
        )
    console.print(table)


@cli.command()
def dashboard(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve the dashboard on.")] = 8090,
    host: Annotated[str, typer.Option(
        help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    app_spec: Annotated[str | None, typer.Option(
        "--app", metavar="MODULE:ATTR", envvar="KONDUIT_APP",
        help="module:attribute of the konduit.App whose workflows Repair re-runs "
        "(without it, Repair is disabled).", show_default=False)] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Serve the web dashboard until SIGINT/SIGTERM: executions, each one's DAG with live step
    states and a timeline of its attempts and fan-in waits, dead letters with repair, the stats,
    /metrics and a JSON API under /api. While the database is down its pages answer 503."""
    from konduit.web.app import serve

    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)  # a down database is a 503 page
    app = load_app(app_spec, database_url) if app_spec else None
    where = describe_url(database_url or (app.database_url if app else None)
                         or os.environ.get("KONDUIT_DATABASE_URL"))
    serve(database_url, app, host=host, port=port, announce=lambda url: err_console.print(
        f"konduit dashboard: serving {url} from {where}"
        + (f", repairs with {app_spec}" if app_spec else " (read-only: no --app)") + " (Ctrl-C stops)",
        soft_wrap=True, markup=False))


@cli.command()
def metrics(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve /metrics on.")] = 9464,
    host: Annotated[str, typer.Option(
        help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    history: History = "24h",
    fan_in_alert: FanInAlert = "20s",
    consecutive: Consecutive = 2,
    database_url: DatabaseUrl = None,
) -> None:
    """Serve the numbers of `konduit stats` to Prometheus on http://HOST:PORT/metrics until
    SIGINT/SIGTERM. Every scrape reads the database; when it cannot (within 5 s), the scrape
    still answers, with konduit_scrape_error 1."""
    from konduit.observe.metrics import serve, wait_for_signal

    # Scrape errors are logged once each (and recovery once): warnings only, no library chatter.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    with serve(database_url, host=host, port=port, history=history, fan_in_alert=fan_in_alert,
               consecutive=consecutive) as exporter:
        err_console.print(f"konduit metrics: serving {exporter.url} from "
                          f"{describe_url(database_url or os.environ.get('KONDUIT_DATABASE_URL'))} "
                          f"(Ctrl-C stops)", soft_wrap=True, markup=False)
        wait_for_signal()


@cli.command()
def stats(
    workflow: Annotated[str | None, typer.Argument(
        metavar="WORKFLOW", help="Only this workflow (default: every workflow).",
        show_default=False)] = None,
    history: History = "24h",
    fan_in_alert: FanInAlert = "20s",
    consecutive: Consecutive = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print the stats as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Instrument the branches, not the pipeline: per branch p50/p95/p99 of its attempts,
    retries, outcomes and time since its last success; per join its fan-in wait, dispatch latency
    and usual straggler. Exit code: 0, or 3 when a fan-in alert fires (a join waited longer than
    --fan-in-alert in each of its last --consecutive executions) so cron and monitoring can page
    on it; 1 on an error."""
    import asyncio

    from konduit.observe.stats import Stats, load_stats, seconds_option, stats_renderables

    seconds_option(history, "--history")  # bad options are reported before connecting
    seconds_option(fan_in_alert, "--fan-in-alert")
    app = plain_app(database_url)

    async def load() -> Stats:
        client = await app.client_async()
        try:
            return await load_stats(client.db, workflow, history=history,
                                    fan_in_alert=fan_in_alert, consecutive=consecutive)
        finally:
            await client.db.close()

    result = asyncio.run(load())
    if as_json:
        print(dump_json(result.to_json()))
    else:
        for renderable in stats_renderables(result):
            console.print(renderable)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


@cli.command()
def plan(
    workflow: Annotated[str, typer.Argument(metavar="WORKFLOW", help="Name of the workflow to plan.")],
    app_spec: Annotated[str, typer.Option(
        "--app", metavar="MODULE:ATTR", envvar="KONDUIT_APP",
        help="module:attribute of the konduit.App (or Workflow) that defines the workflow.")],
    window: Annotated[str | None, typer.Option(
        "--window", metavar="HH:MM",
        help="The window to finish in: the next such time of day (local), or a date-time.",
        show_default=False)] = None,
    within: Annotated[str | None, typer.Option(
        "--within", metavar="DURATION", help="The window as a duration from the start (e.g. 45m).",
        show_default=False)] = None,
    start: Annotated[str | None, typer.Option(
        "--start", metavar="HH:MM",
        help="When the execution starts: a time of day (its next occurrence) or a date-time "
        "(default: now).", show_default=False)] = None,
    history: History = "7d",
    version: Annotated[int | None, typer.Option(
        help="Workflow version whose DAG to plan (default: the latest); history counts every "
        "version.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Show the critical path with each step's p50/p95/p99 from history, the predicted finish
    and whether the window is at risk."""
    import asyncio

    from konduit.observe.plan import (
        PLAN_NOTE,
        Plan,
        history_seconds,
        load_plan,
        parse_moment,
        plan_renderables,
        window_from,
    )

    history_seconds(history)  # a bad --history is reported before connecting
    app = load_app(app_spec, reachable(database_url))
    spec = app.registry.get(workflow, version)
    began = parse_moment(start, what="--start") if start is not None else \
        datetime.now().astimezone()
    deadline = window_from(began, window=window, within=within)

    async def load() -> Plan:
        client = await app.client_async()
        try:
            return await load_plan(client.db, spec, history=history, start=began, window=deadline)
        finally:
            await client.db.close()

    result = asyncio.run(load())
    if as_json:
        print(dump_json(result.to_json()))
        return
    for renderable in plan_renderables(result):
        console.print(renderable)
    console.print(f"[dim]{PLAN_NOTE}[/dim]")


@cli.command()
def demo(
    executions: Annotated[int, typer.Option(min=1, help="Executions to start.")] = 5,
    concurrency: Annotated[int, typer.Option(min=1, help="Tasks each worker runs at once.")] = 8,
    workers: Annotated[int, typer.Option(min=1, help="In-process workers.")] = 2,
    incident_after: Annotated[int | None, typer.Option(
        "--incident-after", metavar="K", min=0,
        help="The image-resize call slows from ~0.2 s to 10 s in the executions after the K-th "
        "(default: only in the last one).", show_default=False)] = None,
    within: Annotated[str, typer.Option(
        "--within", metavar="DURATION",
        help="Each execution's window (deadline_at = its start + this).")] = "5s",
    database_url: DatabaseUrl = None,
) -> None:
    """Run the nightly content pipeline: transcribe, five parallel branches, publish; the last
    execution hits the seed-004 incident (a slow image resize) and degrades to a fallback."""
    from konduit.core.durations import parse_duration
    from konduit.demo import run_demo

    window = parse_duration(within, what="--within")
    raise typer.Exit(run_demo(executions=executions, concurrency=concurrency, workers=workers,
                              incident_after=incident_after, window=window,
                              database_url=reachable(database_url, schema=False),
                              console=console))


@cli.command()
def bench(
    quick: Annotated[bool, typer.Option(
        "--quick", help="Smaller widths and fewer trials (well under a minute).")] = False,
    output: Annotated[str | None, typer.Option(
        "--output", "-o", metavar="FILE", help="Also write the JSON report to FILE.",
        show_default=False)] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Measure the fan-in protocol: cost per completion by join width, simultaneous finishes,
    batching, end-to-end throughput and join latency, a wide map. Prints one JSON document.
    Each benchmark runs in its own scratch database on the server, created and dropped here."""
    from pathlib import Path

    from konduit.bench import run_bench

    if output is not None and not Path(output).absolute().parent.is_dir():
        raise CliError(f"--output: directory {Path(output).absolute().parent} does not exist")
    report = run_bench(reachable(database_url, schema=False), quick=quick,
                       progress=lambda message: err_console.print(message, markup=False))
    text = json.dumps(report, indent=2)
    if output is not None:
        Path(output).write_text(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> None:
    """The ``konduit`` entry point."""
    try:
        cli(args=argv, prog_name="konduit")
    except konduit.KonduitError as exc:
        err_console.print(f"[red]error:[/red] {escape(one_line(str(exc)))}", soft_wrap=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/yellow]")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
