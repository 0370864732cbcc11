"""``konduit list``: find executions by id (start or end), key, tags, input fields, status,
workflow@version and time range, newest first (:meth:`konduit.App.search`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from konduit.cli.common import (
    DatabaseUrl,
    between,
    console,
    dump_json,
    last_line,
    opened,
    plain_app,
    seconds,
    styled,
)
from konduit.core.ids import short_id
from konduit.core.model import ExecutionStatus
from konduit.core.search import search_filter


def list_executions(
    status: Annotated[ExecutionStatus | None, typer.Option(
        help="Only executions with this status.", show_default=False)] = None,
    workflow: Annotated[str | None, typer.Option(
        metavar="NAME[@VERSION]", help="Only executions of this workflow (and version).")] = None,
    id: Annotated[str | None, typer.Option(
        "--id", help="The start or the end of the id (at least 4 hex digits).")] = None,
    key: Annotated[str | None, typer.Option("--key", help="The idempotency key.")] = None,
    tag: Annotated[list[str] | None, typer.Option(
        "--tag", metavar="KEY=VALUE", help="Carries this tag (repeatable: all of them).")] = None,
    input: Annotated[list[str] | None, typer.Option(
        "--input", metavar="FIELD=VALUE",
        help="The input has this field (input.episode=42; the value is JSON, else text; "
             "repeatable).")] = None,
    since: Annotated[str | None, typer.Option(
        help="Created since: a duration ago (1h) or a date-time.")] = None,
    until: Annotated[str | None, typer.Option(
        help="Created before: a duration ago (1h) or a date-time.")] = None,
    fair_key: Annotated[str | None, typer.Option(
        "--fair-key", help="Started with this fair key (Workflow(fair_by=)).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000,
                                       help="At most this many, newest first.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print the executions as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List executions, newest first: recent ones, or those a search finds."""
    where = search_filter(id=id, key=key, tags=tag, inputs=input, status=status,
                          workflow=workflow, since=since, until=until, fair_key=fair_key)
    with opened(plain_app(database_url)) as app:
        results = app.search(where, limit=limit)
    if as_json:
        print(dump_json([{
            "id": r.id, "workflow": r.workflow_name, "version": r.workflow_version,
            "status": r.status, "error": r.error, "created_at": r.created_at,
            "finished_at": r.finished_at,
            "took_seconds": (None if (took := between(r.created_at, r.finished_at)) is None
                             else took.total_seconds()),
            "idempotency_key": r.idempotency_key, "tags": r.tags or {}, "run_at": r.run_at,
            "priority": r.priority, "fair_key": r.fair_key,
        } for r in results]))
        return
    if not results:
        console.print("no executions")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    # The random tail of each id (a UUIDv7 starts with its time): unique enough to tell rows
    # apart and to paste back into `konduit status`; --json has the whole ids.
    table.add_column("id", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("took", justify="right")
    table.add_column("workflow", overflow="fold")
    table.add_column("tags", overflow="fold")
    today = datetime.now().astimezone().date()
    for r in results:
        started = (r.run_at or r.created_at).astimezone()
        table.add_row(
            short_id(r.id), styled(r.status),
            started.strftime("%H:%M:%S" if started.date() == today else "%Y-%m-%d %H:%M"),
            seconds(between(r.created_at, r.finished_at)),
            f"{escape(r.workflow_name)} v{r.workflow_version}",
            escape(" ".join(f"{k}={v}" for k, v in (r.tags or {}).items())),
        )
    console.print(table)
    for r in results:
        if r.error:
            console.print(f"[red]{short_id(r.id)}[/red]: {escape(last_line(r.error))}")
