"""``konduit alerts``: the stored alerts that workers raise and resolve (docs/alerts.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from konduit.cli.common import DatabaseUrl, console, dump_json, plain_app, stamp
from konduit.observe.stats import ALERT_EXIT_CODE
from konduit.records import AlertRecord

_SEVERITY = {"warning": "yellow", "critical": "bold red"}


def alerts(
    include_resolved: Annotated[bool, typer.Option(
        "--all", help="Resolved alerts too (default: open ones only).")] = False,
    kind: Annotated[str | None, typer.Option(
        help="Only this kind: window_at_risk, fan_in_wait, no_success, execution_stalled, "
        "degraded_budget, version_unserved or queue_unserved.",
        show_default=False)] = None,
    workflow: Annotated[str | None, typer.Option(
        help="Only alerts about this workflow.", show_default=False)] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many, newest first.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print the alerts as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List the alerts workers raised: windows at risk, fan-in waits over their threshold,
    workflows without a recent success. Exit code: 0, or 3 when an open alert is listed (so
    cron and monitoring can page on it); 1 on an error."""
    app = plain_app(database_url)
    try:
        found = app.alerts(include_resolved=include_resolved, kind=kind, workflow=workflow,
                           limit=limit)
    finally:
        app.close()
    if as_json:
        print(dump_json([a.to_json() for a in found]))
    else:
        print_alerts(found, include_resolved=include_resolved)
    if any(a.open for a in found):
        raise typer.Exit(ALERT_EXIT_CODE)


def print_alerts(found: list[AlertRecord], *, include_resolved: bool) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    if not found:
        console.print("[green]no alerts[/green]" if include_resolved else "[green]no open alerts[/green]")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for header in ("kind", "severity", "subject", "raised", "resolved", "message"):
        table.add_column(header, no_wrap=header != "message")
    for a in found:
        style = _SEVERITY.get(a.severity, "")
        severity = f"[{style}]{a.severity}[/{style}]" if a.open and style else escape(a.severity)
        resolved = "[red]open[/red]" if a.open else stamp(a.resolved_at)
        message = escape(a.message)
        if not a.open and a.details.get("resolution"):
            message += f" [dim]({escape(str(a.details['resolution']))})[/dim]"
        table.add_row(escape(a.kind), severity, escape(a.subject), stamp(a.raised_at), resolved,
                      message)
    console.print(table)
