"""``konduit versions``: per workflow and version, its running executions and the live workers
serving it, so a version kept for its executions to drain can be watched until it has none
(docs/changing-workflows.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from konduit.cli.common import DatabaseUrl, console, dump_json, plain_app, stamp
from konduit.core.durations import format_elapsed
from konduit.records import VersionState


def versions(
    workflow: Annotated[str | None, typer.Argument(
        help="Only the versions of this workflow.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the versions as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List every registered workflow version with its running executions and the live workers
    serving it. A version with running executions and no live worker is marked UNSERVED (its
    executions wait until a worker that registers it starts; see the version_unserved alert).
    Exit code: 0, or 3 when a listed version is unserved."""
    app = plain_app(database_url)
    try:
        found = app.versions(workflow)
    finally:
        app.close()
    if as_json:
        print(dump_json([{**v.to_dict(), "unserved": v.unserved} for v in found]))
    else:
        print_versions(found, workflow)
    if any(v.unserved for v in found):
        raise typer.Exit(3)


def print_versions(found: list[VersionState], workflow: str | None) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    if not found:
        console.print("no workflow registered" + (f" as {escape(workflow)!s}" if workflow else ""))
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for header in ("workflow", "version", "policy", "running", "workers", "served"):
        table.add_column(header, no_wrap=header != "workers",
                         justify="right" if header in ("version", "running") else "left")
    for v in found:
        if v.unserved:
            served = (f"[bold red]UNSERVED[/bold red] for {format_elapsed(v.unserved_seconds)}"
                      f" (last worker {stamp(v.last_served_at)})")
        elif v.workers:
            served = "[green]yes[/green]"
        else:
            served = "[dim]no worker (nothing running)[/dim]"
        policy = f"rev {v.policy_revision}" + (
            f" since {stamp(v.policy_updated_at)}" if v.policy_updated_at else "")
        table.add_row(escape(v.name), str(v.version), policy, str(v.running),
                      escape(", ".join(v.workers)) or "—", served)
    console.print(table)
