"""Commands and status lines for durable waits: send-event, and what waiting tasks wait for."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape

from konduit.cli.common import (
    DatabaseUrl,
    app_option,
    console,
    dump_json,
    load_app,
    opened,
    plain_app,
    read_json_argument,
)
from konduit.core.durations import format_elapsed
from konduit.records import TaskRecord

EXIT_NO_MATCH = 3
"""``send-event``: nothing could ever take the event (it was not kept)."""


def send_event(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The event's name.")],
    key: Annotated[str | None, typer.Option(
        "--key", "-k", help="The key the waiting step computed (its key=).")] = None,
    payload: Annotated[str | None, typer.Option(
        "--payload", "-p", metavar="JSON|@FILE|-",
        help="The event's payload (the step's output) as JSON, @file or - (standard input).")
    ] = None,
    execution_id: Annotated[str | None, typer.Option(
        "--execution-id", "-e", help="Only this execution's step.")] = None,
    app_spec: Annotated[str | None, app_option(
        "module:attribute of the konduit.App: the waiting task is completed at once "
        "(without it a worker does, within its maintenance interval).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print {"event", "key", "result"} as JSON.')] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Send an event to the step waiting for it (wf.wait_for_event) and to the workflows it
    starts (wf.on_event); prints woke, started, stored or no match.

    Exit codes: 0 woke, started or stored, 3 no match (nothing could ever take it; nothing was
    kept), 1 any error.
    """
    value = read_json_argument(payload, "--payload")
    eid = execution_id  # the client resolves a unique prefix or tail too
    app = load_app(app_spec, database_url) if app_spec else plain_app(database_url)
    with opened(app):
        result = app.send_event(name, key=key, execution_id=eid, payload=value)
    if as_json:
        print(dump_json({"event": name, "key": key, "result": result}))
    else:
        console.print(result)
    if result == "no match":
        raise typer.Exit(EXIT_NO_MATCH)


def waiting_for(task: TaskRecord) -> str | None:
    """What a waiting task waits for, in words (None when it does not wait)."""
    if task.status != "waiting":
        return None
    kind = task.wait_kind
    if kind == "event":
        text = f"event {task.wait_event!r}"
        if task.wait_key is not None:
            text += f" key {task.wait_key!r}"
        if task.wait_until is not None:
            text += " (received; being applied)"
    elif kind == "timer":
        text = f"timer, fires {_relative(task.wait_until)}"
    else:
        text = f"child execution {task.wait_child}"
    if task.deadline_at is not None:
        text += f"; deadline {_relative(task.deadline_at)}"
    return text


def _relative(at: datetime | None) -> str:
    if at is None:
        return "—"
    delta = (at - datetime.now(UTC)).total_seconds()
    return f"in {format_elapsed(delta)}" if delta >= 0 else f"{format_elapsed(-delta)} ago"


def waiting_json(tasks: list[TaskRecord]) -> list[dict[str, Any]]:
    return [{"step": t.step, "kind": t.wait_kind, "event": t.wait_event,
             "key": t.wait_key, "until": t.wait_until, "child": t.wait_child,
             "deadline_at": t.deadline_at}
            for t in tasks if t.status == "waiting"]


def print_waiting(tasks: list[TaskRecord]) -> None:
    for task in tasks:
        text = waiting_for(task)
        if text is not None:
            console.print(f"[cyan]waiting[/cyan] {escape(task.step)}: {escape(text)}",
                          soft_wrap=True)
