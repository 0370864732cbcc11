"""The ``konduit`` command line.

Every command that talks to the database takes ``--database-url``; without it the URL comes from
``KONDUIT_DATABASE_URL`` and, failing that, the embedded PostgreSQL server (migrated on first use).
Errors konduit knows about (:class:`konduit.KonduitError`) print one red line and exit 1.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer
import typer.main
from rich.markup import escape

import konduit
from konduit.cli import (
    alerts,
    embedded,
    executions,
    migrating,
    observe,
    operate,
    retention,
    schedules,
    search,
    tools,
    versions,
    waits,
    webhooks,
)
from konduit.cli.common import CliError, console, err_console, load_app, one_line

# Plain help, as git and pip print it: `--limit INTEGER`, flags without a type, choices listed,
# one line per command in the overview. Typer's rich panels print `<bool>` beside every flag and
# wrap each command's whole docstring into the overview.
cli = typer.Typer(
    name="konduit",
    help="Durable DAG workflows on PostgreSQL with an exactly-once join.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_show_locals=False,  # locals may hold database URLs with passwords
)
db_cli = typer.Typer(help="Database schema commands.", no_args_is_help=True, rich_markup_mode=None)
cli.add_typer(db_cli, name="db", help="Database schema: migrate, reset.")
embedded_cli = typer.Typer(help="The embedded PostgreSQL server (the default database).",
                           no_args_is_help=True, rich_markup_mode=None)
cli.add_typer(embedded_cli, name="embedded", help="The embedded PostgreSQL: status, stop.")


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


# Registration order is the order of `konduit --help`; each command's line there is its own
# (the first sentence of a docstring is often too long for 80 columns).
GROUPS: dict[str, typer.Typer] = {"": cli, "db": db_cli, "embedded": embedded_cli}
COMMANDS: list[tuple[str, str, Callable[..., Any], str]] = [
    ("db", "migrate", operate.db_migrate, "Apply konduit's schema migrations (its tables)."),
    ("db", "reset", operate.db_reset, "Drop every konduit table and migrate afresh (dev)."),
    ("embedded", "status", embedded.status, "Where the embedded server runs, if it does."),
    ("embedded", "stop", embedded.stop, "Stop the embedded server."),
    ("", "worker", operate.worker, "Run a worker for the workflows of an App."),
    ("", "workers", operate.workers, "List the live workers and their slots."),
    ("", "health", operate.health, "Check the database (and a local worker): a probe."),
    ("", "schedules", schedules.schedules, "List schedules; pause or resume one."),
    ("", "start", executions.start, "Start an execution and print its id."),
    ("", "status", executions.status, "Show an execution, its steps and what it waits for."),
    ("", "list", search.list_executions, "Find executions: id, key, tag, input, status."),
    ("", "cancel", executions.cancel, "Cancel a running execution, or a filter's."),
    ("", "send-event", waits.send_event, "Send an event to waiting steps and on_event workflows."),
    ("", "inbox", waits.inbox, "List the steps waiting for a person's answer."),
    ("", "answer", waits.answer, "Answer a step waiting for a person (wait_for_input)."),
    ("", "repair", executions.repair, "Re-run a finished execution's degraded branches."),
    ("", "redrive", executions.redrive, "Run failed executions again from where they failed."),
    ("", "fork", executions.fork, "Run again from a step, reusing the outputs before it."),
    ("", "migrate-executions", migrating.migrate,
     "Move running executions to another workflow version."),
    ("", "dead-letters", executions.dead_letters, "List dead-lettered tasks."),
    ("", "stream", executions.stream, "Print an execution's durable stream; --follow for more."),
    ("", "prune", retention.prune, "Delete finished executions older than a duration."),
    ("", "move-history", retention.move_history, "Move old finished executions into history."),
    ("", "dashboard", observe.dashboard, "Serve the web dashboard and the HTTP API."),
    ("", "metrics", observe.metrics, "Serve Prometheus metrics."),
    ("", "stats", observe.stats, "Latency of every branch and join, from history."),
    ("", "plan", observe.plan, "Critical path and predicted finish of a workflow."),
    ("", "alerts", alerts.alerts, "List the alerts workers raised."),
    ("", "versions", versions.versions, "Workflow versions: running executions, workers."),
    ("", "webhooks", webhooks.webhooks, "List webhook deliveries; retry failed ones."),
    ("", "demo", tools.demo, "Run the nightly content pipeline demo."),
    ("", "bench", tools.bench, "Run the benchmarks; print JSON."),
]
for _group, _name, _function, _summary in COMMANDS:
    GROUPS[_group].command(_name, short_help=_summary)(_function)
# Old spellings that keep working, out of the help: `konduit migrate` read too much like
# `konduit db migrate` (the schema) for a command that moves executions between versions.
HIDDEN_ALIASES: dict[str, str] = {"migrate": "migrate-executions"}
for _alias, _target in HIDDEN_ALIASES.items():
    cli.command(_alias, hidden=True, short_help=f"The old name of {_target}.",
                help=f"The old name of `konduit {_target}` (the same command).\n\n"
                + (inspect.getdoc(migrating.migrate) or ""))(migrating.migrate)


def command_tree() -> Any:
    """The command tree, with each option that takes a value shown as ``--limit LIMIT`` (as
    argparse, git and pip show them) rather than Typer's ``--limit <int>``, and arguments in
    the usage line as ``EXECUTION_ID`` (``[WORKFLOW]`` when optional) rather than Typer's
    ``{EXECUTION_ID}``."""
    root = typer.main.get_command(cli)
    _name_values(root)
    return root


def _name_values(node: Any) -> None:
    for param in getattr(node, "params", ()):
        descriptor = getattr(param, "type_descriptor", None)
        choice = descriptor is not None and getattr(descriptor, "is_choice", False)
        takes_value = param.param_type_name == "option" and not getattr(param, "is_flag", False)
        if takes_value and param.metavar is None and not choice and param.name:
            param.metavar = param.name.upper()
        if param.param_type_name == "argument" and not choice:
            # `APP  module:attribute of a konduit.App`, not `APP <str>  ...`.
            param.metavar = param.metavar or (param.name or "value").upper()
            param.display_type_rich = lambda ctx: None
        if param.param_type_name == "argument":
            param.get_usage_pieces = functools.partial(_usage_piece, param)
    for child in getattr(node, "commands", {}).values():
        _name_values(child)


def _usage_piece(param: Any, ctx: Any) -> list[str]:
    name = param.metavar or (param.name or "value").upper()
    if not param.required:
        name = f"[{name}]"
    return [name + ("..." if param.nargs != 1 else "")]


def _exception_type(name: str) -> type[Exception]:
    # Typer raises click's exceptions, from its own copy of click in recent releases and from
    # click itself before: found through the class it exports, they are caught either way.
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


UsageError = _exception_type("UsageError")
ClickException = _exception_type("ClickException")


def main(argv: list[str] | None = None) -> None:
    """The ``konduit`` entry point: every error, a usage error too, is one red ``error:`` line
    on standard error (exit 2 for a bad command line, 1 otherwise)."""
    try:
        code = command_tree().main(args=argv, prog_name="konduit", standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except UsageError as exc:
        _error_line(exc)
        raise SystemExit(getattr(exc, "exit_code", 2)) from None
    except konduit.KonduitError as exc:
        err_console.print(f"[red]error:[/red] {escape(one_line(str(exc)))}", soft_wrap=True)
        raise SystemExit(1) from None
    except (KeyboardInterrupt, typer.Abort):
        err_console.print("[yellow]interrupted[/yellow]")
        raise SystemExit(130) from None
    except ClickException as exc:  # an unreadable file for a file option, and the like
        _error_line(exc)
        raise SystemExit(getattr(exc, "exit_code", 1)) from None
    raise SystemExit(code if isinstance(code, int) else 0)


def _error_line(exc: Exception) -> None:
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    if type(exc).__name__ == "NoArgsIsHelpError":  # `konduit` or `konduit db` alone: the help
        print(message)
        return
    err_console.print(f"[red]error:[/red] {escape(one_line(message))}", soft_wrap=True)
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        err_console.print(f"(see {ctx.command_path} --help)", soft_wrap=True, markup=False)


__all__ = ["CliError", "cli", "load_app", "main"]


if __name__ == "__main__":
    main()
