"""``konduit migrate-executions``: move running executions to another version of their
workflow (``konduit migrate``, its first name, still works, hidden from the help). Not to be
confused with ``konduit db migrate``, which brings konduit's own tables to this release."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from konduit.cli.common import (
    CliError,
    DatabaseUrl,
    app_option,
    console,
    dump_json,
    load_app,
    opened,
    plain_app,
    reachable,
)
from konduit.errors import MigrationRefused
from konduit.records import MigrationRecord


def _workflow_at(text: str) -> tuple[str, int]:
    name, sep, version = text.rpartition("@")
    if not sep or not name or not version.isdigit() or int(version) < 1:
        raise CliError(f"--workflow must look like name@version (e.g. ingest@1), got {text!r}")
    return name, int(version)


def _line(r: MigrationRecord) -> str:
    where = f"{escape(r.workflow)} v{r.from_version} -> v{r.to_version}"
    if r.migrated:
        changes = [f"{what}: {', '.join(escape(s) for s in steps)}"
                   for what, steps in (("added", r.added), ("dropped", r.dropped),
                                       ("started", r.started), ("skipped", r.skipped)) if steps]
        return f"[green]migrated[/green] {r.execution_id} ({where})" \
            + (f"; {'; '.join(changes)}" if changes else "")
    if r.reason is None:
        return f"unchanged {r.execution_id}: already at v{r.to_version}"
    return f"[red]refused[/red] {r.execution_id} ({where}): {escape(r.reason)}"


def migrate(
    execution_id: Annotated[str | None, typer.Argument(
        metavar="EXECUTION_ID", help="The execution to migrate (or use --workflow).",
        show_default=False)] = None,
    to: Annotated[int | None, typer.Option("--to", min=1, metavar="N",
                                           help="The version to move to.",
                                           show_default=False)] = None,
    workflow: Annotated[str | None, typer.Option(
        "--workflow", metavar="NAME@VERSION",
        help="Migrate every running execution of this workflow version.")] = None,
    app_spec: Annotated[str | None, app_option(
        "module:attribute of an App that defines version N: needed only when a step "
        "must start at once.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Move running executions to version N of their workflow.

    This changes executions, not the database schema: `konduit db migrate` applies konduit's
    schema migrations.

    Allowed when every step that started or ended exists in version N with the same
    upstreams; the rest of the execution then follows version N's DAG. Both versions must be
    registered (a worker defining them has started). Prints, per execution, migrated or
    refused with the reason; exits 1 when any was refused.
    """
    if to is None:
        raise CliError("--to N is required: the version to move to")
    if (execution_id is None) == (workflow is None):
        raise CliError("give either an EXECUTION_ID or --workflow NAME@VERSION")
    app = load_app(app_spec, reachable(database_url)) if app_spec else plain_app(database_url)
    with opened(app):
        if workflow is not None:
            name, version = _workflow_at(workflow)
            records = app.migrate_workflow(name, version, to)
        else:
            assert execution_id is not None
            try:
                records = [app.migrate(execution_id, to_version=to)]
            except MigrationRefused as refused:
                status = app.status(execution_id)
                records = [MigrationRecord(
                    execution_id=status.id, workflow=status.workflow,
                    from_version=status.version, to_version=to, migrated=False,
                    reason=str(refused), step=refused.step)]
    if as_json:
        print(dump_json([r.to_dict() for r in records]))
    else:
        if not records:
            console.print(f"no running executions of {escape(workflow or '')}")
        for r in records:
            console.print(_line(r), soft_wrap=True)
    if any(not r.migrated and r.reason is not None for r in records):
        raise typer.Exit(1)
