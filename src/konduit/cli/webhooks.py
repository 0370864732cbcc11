"""``konduit webhooks``: the outbox of webhook deliveries (docs/webhooks.md)."""

from __future__ import annotations

import enum
from typing import Annotated
from urllib.parse import urlsplit

import typer

from konduit.cli.common import DatabaseUrl, console, dump_json, plain_app, stamp
from konduit.engine.webhooks import delivery_json
from konduit.records import WebhookDelivery


class DeliveryStatus(enum.StrEnum):
    """A webhook delivery's status, as `--status` takes it."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    REFUSED = "refused"


_STATUS = {"delivered": "green", "pending": "cyan", "failed": "red", "refused": "red"}


def webhooks(
    status: Annotated[DeliveryStatus | None, typer.Option(
        help="Only deliveries with this status.", show_default=False)] = None,
    retry: Annotated[str | None, typer.Option(
        "--retry", metavar="DELIVERY_ID",
        help="Send this failed or refused delivery again now (with a fresh attempt count).",
        show_default=False)] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many, newest first.")] = 100,
    execution_id: Annotated[str | None, typer.Option(
        "--execution", metavar="ID",
        help="Only the deliveries of this execution (its id, or a unique start or end of it).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the deliveries as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List webhook deliveries: event, receiver host, status, attempts, last error and next
    try. Exit code 1 when --retry names no failed or refused delivery."""
    app = plain_app(database_url)
    try:
        if retry is not None:
            if not app.retry_webhook_delivery(retry):
                console.print(f"delivery {retry} is not failed or refused (or does not exist): "
                              "nothing to retry")
                raise typer.Exit(1)
            console.print(f"delivery {retry} is due again")
            return
        found = app.webhook_deliveries(status=status, execution_id=execution_id,
                                       limit=limit)
    finally:
        app.close()
    if as_json:
        print(dump_json([delivery_json(r.to_dict()) for r in found]))
    else:
        print_deliveries(found)


def print_deliveries(found: list[WebhookDelivery]) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    if not found:
        console.print("no webhook deliveries")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for header in ("delivery", "event", "host", "status", "attempts", "created", "next try",
                   "last error"):
        table.add_column(header, no_wrap=header != "last error")
    for r in found:
        style = _STATUS.get(r.status, "")
        table.add_row(str(r.id), escape(r.event), escape(urlsplit(r.url).netloc),
                      f"[{style}]{r.status}[/{style}]" if style else escape(r.status),
                      str(r.attempts), stamp(r.created_at), stamp(r.next_attempt_at),
                      escape(r.last_error or ""))
    console.print(table)
