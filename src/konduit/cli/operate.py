"""Commands that run and look after konduit: db migrate, worker, workers, health."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from dataclasses import MISSING, fields
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

import konduit
from konduit import logs
from konduit.cli.common import (
    DatabaseUrl,
    console,
    describe_url,
    dump_json,
    err_console,
    load_app,
    opened,
    plain_app,
    reachable,
)
from konduit.core.durations import format_elapsed
from konduit.db.connect import open_database
from konduit.db.migrate import (
    describe_unknown,
    latest_version,
    recorded_versions,
    unknown_migrations,
)
from konduit.db.migrate import reset as reset_schema
from konduit.errors import CliError
from konduit.settings import default, described, settings, variable
from konduit.worker import stopping
from konduit.worker.config import WorkerConfig, new_worker_id

log = logging.getLogger(__name__)

# The worker's defaults that no variable sets, as WorkerConfig declares them (those a variable
# sets are shown from konduit.settings, and left to WorkerConfig when no flag is given).
WORKER: dict[str, Any] = {f.name: f.default for f in fields(WorkerConfig)
                          if f.default is not MISSING}


def db_migrate(database_url: DatabaseUrl = None) -> None:
    """Apply the schema migrations this konduit needs to its database's tables (a no-op when
    the schema is current). This changes konduit's tables, not your executions: moving running
    executions to a new version of their workflow is `konduit migrate-executions`."""
    # Said below, on standard output, rather than twice (the migrator logs it too).
    logging.getLogger("konduit.db.migrate").setLevel(logging.ERROR)
    with opened(konduit.App([], database_url=reachable(database_url, schema=False))) as app:
        applied = app.migrate()
        unknown = _unknown_migrations(database_url)
    if applied:
        for name in applied:
            console.print(f"applied [green]{name}[/green]")
    if unknown:
        console.print(f"schema is at version {max(unknown)}, newer than this konduit's "
                      f"{latest_version()}")
        console.print(f"note: {escape(describe_unknown(unknown))}", soft_wrap=True)
    else:
        console.print(f"schema is at version {latest_version()}"
                      + ("" if applied else " (already current)"))


def _unknown_migrations(database_url: str | None) -> dict[int, str]:
    """The migrations the database recorded that this konduit does not have (a newer
    konduit's)."""
    async def go() -> dict[int, str]:
        db = await open_database(database_url, max_size=1, name="konduit-cli",
                                 check_schema=False, migrate_embedded=False)
        try:
            return unknown_migrations(await recorded_versions(db))
        finally:
            await db.close()

    return asyncio.run(go())


def db_reset(
    yes: Annotated[bool, typer.Option(
        "--yes", help="Confirm: every execution, schedule and record in it is deleted.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Drop every konduit table and function of a development database and migrate afresh.

    Everything konduit stored there is deleted: executions, their history, schedules, workers,
    alerts, webhooks and tokens. Without --yes nothing is touched.
    """
    url = database_url or settings().database_url or None
    where = describe_url(url)
    if not yes:
        raise CliError(f"konduit db reset deletes everything konduit stored in {where}; "
                       f"add --yes to do it")

    async def go() -> list[str]:
        db = await open_database(url, max_size=1, name="konduit-cli", check_schema=False,
                                 migrate_embedded=False)
        try:
            return [f"{m.version:04d}_{m.name}" for m in await reset_schema(db)]
        finally:
            await db.close()

    applied = asyncio.run(go())
    console.print(f"reset {where}: dropped konduit's tables, applied {len(applied)} migrations; "
                  f"schema is at version {latest_version()}")


def worker(
    app_spec: Annotated[str, typer.Argument(metavar="APP", help="module:attribute of a konduit.App")],
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1,
                                             help="Tasks run at once.")] = WORKER["concurrency"],
    queue: Annotated[list[str] | None, typer.Option(
        "--queue", "-q",
        help=f"Queue to claim from; repeatable (default: {', '.join(WORKER['queues'])}).")] = None,
    poll_interval: Annotated[float | None, typer.Option(
        help=f"Seconds between claims without a notification (default: {described('poll_interval')}).",
        show_default=False)] = None,
    lease_seconds: Annotated[float | None, typer.Option(
        help="Lease length; a dead worker's tasks are retaken after it "
        f"(default: {described('lease_seconds')}).",
        show_default=False)] = None,
    heartbeat_interval: Annotated[float | None, typer.Option(
        help=f"Seconds between lease extensions (default: {described('heartbeat_interval')}).",
        show_default=False)] = None,
    maintenance_interval: Annotated[float | None, typer.Option(
        min=0.05, help="Seconds between maintenance sweeps: expired leases, deadlines, due "
        f"timers and waits (default: {described('maintenance_interval')}).",
        show_default=False)] = None,
    leader_lease: Annotated[float | None, typer.Option(
        min=0.05, help="Seconds the maintenance leader's lease holds without renewal; another "
        "worker takes over after it, or at once when the leader's process is gone "
        f"(default: {described('leader_lease')}).", show_default=False)] = None,
    stall_grace: Annotated[float | None, typer.Option(
        min=0.05, help="Seconds a running execution in which nothing can run is left before the "
        "maintenance pass re-runs its fan-in decision and raises execution_stalled "
        f"(default: {described('stall_grace')}).", show_default=False)] = None,
    shutdown_grace: Annotated[float | None, typer.Option(
        help=f"Seconds running tasks get to finish on SIGINT/SIGTERM "
        f"(default: {WORKER['shutdown_grace']:g}).",
        show_default=False)] = None,
    isolation: Annotated[str, typer.Option(
        help="How sync handlers run: 'thread' (one that ignores its deadline is abandoned) or "
        "'process' (a child process each, killed at the deadline).")] = WORKER["isolation"],
    max_abandoned: Annotated[int | None, typer.Option(
        min=0, help="Abandoned threads of user code (handlers, start-time code, trigger code, "
        "maps' over()) tolerated before the worker drains and exits "
        f"non-zero for its supervisor to restart it (default: {described('max_abandoned')}).",
        show_default=False)] = None,
    fallback_timeout: Annotated[float | None, typer.Option(
        help="Seconds a fallback may run before its task ends timed_out "
        f"(default: {described('fallback_timeout')}).", show_default=False)] = None,
    connect_wait: Annotated[float | None, typer.Option(
        "--connect-wait", metavar="SECONDS", min=0,
        help="How long to wait for a database that does not answer at start "
        "(default: until it answers; each failed attempt is logged).",
        show_default=False)] = None,
    alert_interval: Annotated[float | None, typer.Option(
        min=0, help="Seconds between evaluations of the alert rules; 0 turns them off in this "
        f"worker (default: {described('alert_interval')}).", show_default=False)] = None,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", metavar="PORT", min=0, max=65535,
        envvar=variable("worker_metrics_port"),
        help="Serve this worker's histograms (attempt durations) on http://HOST:PORT/metrics "
        f"(default: {described('worker_metrics_port')}).", show_default=False)
    ] = default("worker_metrics_port"),
    metrics_host: Annotated[str, typer.Option(
        "--metrics-host", metavar="HOST",
        help="The address --metrics-port listens on (0.0.0.0: every interface, for a "
        "Prometheus on another host).")
    ] = WORKER["metrics_host"],
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    log_format: Annotated[str, typer.Option(
        "--log-format", envvar=variable("log_format"),
        help="'text' or 'json': one JSON object per line on stderr with time, level, logger, "
        "message, worker, and execution_id, step, map_index, attempt on lines logged inside "
        "an attempt.")] = default("log_format"),
    database_url: DatabaseUrl = None,
) -> None:
    """Run a worker for the workflows of APP until SIGINT/SIGTERM (a graceful stop). A database
    that is down at start is waited for, so a worker started during an outage comes up with it."""
    try:
        logs.configure(log_level, log_format.lower())
    except ValueError as exc:
        raise CliError(f"--log-format/--log-level: {exc}") from None
    # In JSON the stderr stream is all log lines: the banners go through the log too.
    as_json = log_format.lower() == "json"

    def say(text: str) -> None:
        if as_json:
            log.info("%s", text)
        else:
            err_console.print(escape(text), soft_wrap=True)

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
            "maintenance_interval": maintenance_interval,
            "leader_lease": leader_lease,
            "stall_grace": stall_grace,
            "shutdown_grace": shutdown_grace,
            "isolation": isolation,
            "max_abandoned": max_abandoned,
            "fallback_timeout": fallback_timeout,
            "alert_interval": alert_interval,
            "metrics_port": metrics_port,
            "metrics_host": metrics_host if metrics_port is not None else None,
        }.items()
        if value is not None
    }
    # Chosen here so that the lines logged before the worker runs carry it too.
    options["worker_id"] = logs_worker = new_worker_id()
    logs.bind_worker(logs_worker)
    queues = tuple(queue or WORKER["queues"])
    url = database_url or settings().database_url
    where = describe_url(url) if url else "the App's database (embedded server by default)"
    say(f"konduit worker: {', '.join(names)} on {where}, "
        f"queues {', '.join(queues)}, concurrency {concurrency} (Ctrl-C stops gracefully)")
    # This process exists to run the worker: a stop that hangs ends it (after saying where).
    stopping.exit_when_stuck = stopping.stuck_after() / 2
    with opened(app):
        try:
            done = app.run_worker(concurrency, queues=queues, connect_wait=connect_wait,
                                  **options)
        except ValueError as exc:  # WorkerConfig rejects inconsistent settings
            raise CliError(str(exc)) from None
        except konduit.WorkerUnhealthy as exc:
            # Threads that ignored their deadline still run and cannot be stopped: exit now,
            # non-zero, so the supervisor starts a fresh process.
            if as_json:
                log.error("%s", exc)
            else:
                err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)
    say(f"worker stopped after {done.completed} task(s)")
    # Tasks still running at the end of the grace period were released to other workers, but a
    # sync handler's thread cannot be interrupted, and the interpreter would join it at exit:
    # leave now, so a stop takes the grace period and no longer (their results are fenced off).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def workers(
    stale: Annotated[float | None, typer.Option(
        "--stale", metavar="SECONDS", min=0,
        help="Count a worker live when heard from within this long (default: its own lease).",
        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the workers as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List the live workers: host and pid, queues, workflow versions served, isolation, slots
    in use, abandoned handler threads, how long ago each last sent a heartbeat, and which one
    leads its deployment's maintenance."""
    with opened(plain_app(database_url)) as app:
        rows = app.workers(stale)
    if as_json:
        print(dump_json(rows))
        return
    if not rows:
        console.print("no live workers")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for header in ("host", "pid", "queues", "workflows", "isolation", "slots", "abandoned",
                   "heartbeat", "leader"):
        table.add_column(header, justify="right" if header in ("pid", "slots") else "left")
    for r in rows:
        abandoned = int(r.abandoned)
        table.add_row(
            escape(r.hostname), str(r.pid), escape(", ".join(r.queues)),
            escape(", ".join(r.workflows)) or "—", r.isolation,
            f"{r.running}/{r.concurrency}",
            f"[yellow]{abandoned}[/yellow]" if abandoned else "0",
            f"{format_elapsed(r.heartbeat_age)} ago",
            "maintenance" if r.leader else "",
        )
    console.print(table)


def health(
    worker: Annotated[bool, typer.Option(
        "--worker", help="Also require a live worker on this host (same hostname, heard from "
        "within its lease): the check of a worker's container or pod.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Exit 0 when the database answers and has the schema this konduit needs (and, with
    --worker, a worker of this host is live); else exit 1 with one line saying why. The
    container image's HEALTHCHECK; a probe's command in Kubernetes. A schema a newer konduit
    migrated is no failure: a note names its migrations this konduit does not know."""
    if not (database_url or settings().database_url):
        raise CliError("konduit health checks a database of your own: set "
                       f"{variable('database_url')} or pass --database-url")
    with opened(plain_app(database_url)) as app:
        live = app.workers() if worker else []
    host = socket.gethostname()
    if worker and not any(w.hostname == host for w in live):
        raise CliError(f"no live worker on {host} (konduit workers lists the live ones)")
    unknown = _unknown_migrations(database_url)
    console.print(f"ok: {describe_url(database_url or settings().database_url)}"
                  + (f", a live worker on {host}" if worker else ""))
    if unknown:
        console.print(f"note: {escape(describe_unknown(unknown))}", soft_wrap=True)
