"""The ``konduit`` command line.

Every command that talks to the database takes ``--database-url``; without it the URL comes from
``KONDUIT_DATABASE_URL`` and, failing that, the embedded PostgreSQL server (migrated on first use).
Errors konduit knows about (:class:`konduit.KonduitError`) print one red line and exit 1.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

import konduit
from konduit.cli import (
    alerts,
    executions,
    observe,
    operate,
    retention,
    schedules,
    search,
    tools,
    waits,
    webhooks,
)
from konduit.cli.common import CliError, console, err_console, load_app, one_line

cli = typer.Typer(
    name="konduit",
    help="Durable DAG workflows on PostgreSQL with an exactly-once join.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold database URLs with passwords
)
db_cli = typer.Typer(help="Database schema commands.", no_args_is_help=True)
cli.add_typer(db_cli, name="db")


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


# Registration order is the order of `konduit --help`.
db_cli.command("migrate")(operate.db_migrate)
cli.command()(operate.worker)
cli.command()(operate.workers)
cli.command()(schedules.schedules)
cli.command()(executions.start)
cli.command()(executions.status)
cli.command("list")(search.list_executions)
cli.command()(executions.cancel)
cli.command("send-event")(waits.send_event)
cli.command()(executions.repair)
cli.command("dead-letters")(executions.dead_letters)
cli.command()(retention.prune)
cli.command()(observe.dashboard)
cli.command()(observe.metrics)
cli.command()(observe.stats)
cli.command()(observe.plan)
cli.command()(alerts.alerts)
cli.command()(webhooks.webhooks)
cli.command()(tools.demo)
cli.command()(tools.bench)


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


__all__ = ["CliError", "cli", "load_app", "main"]


if __name__ == "__main__":
    main()
