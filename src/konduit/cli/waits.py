"""Commands and status lines for durable waits: send-event, and what waiting tasks wait for."""

from __future__ import annotations

import getpass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from konduit.cli.common import (
    DatabaseUrl,
    app_option,
    console,
    dump_json,
    load_app,
    opened,
    plain_app,
    read_json_argument,
    stamp,
)
from konduit.core.durations import format_elapsed
from konduit.core.ids import short_id
from konduit.core.waits import is_input_event
from konduit.records import TaskRecord

EXIT_NO_MATCH = 3
"""``send-event``: nothing could ever take the event (it was not kept)."""
EXIT_STORED = 4
"""``send-event``: nothing waits for the event now; it is kept for a step that may still wait
for it, until its retention runs out (a mistyped key looks like this too)."""


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
        "--json", help='Print {"event", "key", "result"} as JSON (and "kept_until" when '
        'stored).')] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Send an event to the step waiting for it (wf.wait_for_event) and to the workflows it
    starts (wf.on_event); prints woke, started, stored or no match. Stored: nothing waits for
    it now, and it is kept (until the time printed: its retention) for a step that may still
    wait for it; check the key when a step should have been waiting.

    Exit codes: 0 woke or started, 4 stored (nothing waits for it now; kept until its retention
    runs out), 3 no match (nothing could ever take it; nothing was kept), 1 any error.
    """
    value = read_json_argument(payload, "--payload")
    eid = execution_id  # the client resolves a unique prefix or tail too
    app = load_app(app_spec, database_url) if app_spec else plain_app(database_url)
    kept_until: datetime | None = None
    with opened(app):
        result = app.send_event(name, key=key, execution_id=eid, payload=value)
        if result == "stored":
            kept_until = app._read(lambda reads: reads.kept_event(name, key=key,
                                                                  execution_id=eid))
    if as_json:
        out: dict[str, Any] = {"event": name, "key": key, "result": result}
        if result == "stored":
            out["kept_until"] = None if kept_until is None else kept_until.isoformat()
        print(dump_json(out))
    else:
        console.print(escape(stored_line(kept_until)) if result == "stored" else result)
    if result == "no match":
        raise typer.Exit(EXIT_NO_MATCH)
    if result == "stored":
        raise typer.Exit(EXIT_STORED)


def answer(
    execution_id: Annotated[str, typer.Argument(
        metavar="ID", help="The execution (its id, or a unique start or end of it).")],
    step: Annotated[str, typer.Argument(metavar="STEP", help="The wait_for_input step.")],
    value: Annotated[str, typer.Option(
        "--value", "-v", metavar="JSON|@FILE|-",
        help="The answer as JSON, @file or - (standard input): an object matching the step's "
        "model.")],
    answered_by: Annotated[str | None, typer.Option(
        "--as", help="Who answers (default: this system user's name), kept with the answer.")
    ] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print {"execution_id", "step", "value", "answered_by", '
        '"answered_at"} as JSON.')] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Answer a step waiting for a person (wf.wait_for_input): the value is checked against
    the step's model (an error names each field at fault, and nothing changes) and becomes
    the step's output; who answered is recorded with it.

    Exit codes: 0 answered, 1 any error (a bad value, a step that waits for no answer now).
    """
    parsed = read_json_argument(value, "--value")
    who = answered_by if answered_by is not None else _system_user()
    with opened(plain_app(database_url)) as app:
        done = app.answer(execution_id, step, parsed, answered_by=who)
    if as_json:
        print(dump_json(done))
        return
    console.print(f"answered {escape(done.step)} of {short_id(done.execution_id)} as "
                  f"{escape(done.answered_by or '?')}")


def _system_user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no such user in a container's passwd
        return None


def inbox(
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many, oldest "
                                                             "first.")] = 100,
    execution_id: Annotated[str | None, typer.Option(
        "--execution", metavar="ID",
        help="Only the waits of this execution (its id, or a unique start or end of it).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the open waits as JSON.")
                       ] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List the steps waiting for a person's answer (wf.wait_for_input), oldest first:
    workflow, execution, step, waiting since, deadline and who may answer."""
    with opened(plain_app(database_url)) as app:
        rows = app.inbox(execution_id=execution_id, limit=limit)
    if as_json:
        print(dump_json(rows))
        return
    if not rows:
        console.print("nothing waits for an answer")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for header in ("execution", "workflow", "step", "waiting since", "deadline", "who"):
        table.add_column(header)
    for r in rows:
        table.add_row(short_id(r.execution_id), escape(r.workflow_name), escape(r.step),
                      stamp(r.waiting_since), _relative(r.deadline_at) if r.deadline_at
                      else "—", escape(r.who or "—"))
    console.print(table)


def stored_line(kept_until: datetime | None) -> str:
    """What ``send-event`` says of an event nothing waits for now."""
    kept = "" if kept_until is None else \
        f" until {kept_until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({_relative(kept_until)})"
    return (f"stored: nothing waits for this event now; it is kept{kept} for a step that "
            f"starts waiting for it before then (check the key if one should be waiting)")


def waiting_for(task: TaskRecord) -> str | None:
    """What a waiting task waits for, in words (None when it does not wait)."""
    if task.status != "waiting":
        return None
    kind = task.wait_kind
    if kind == "event":
        text = ("a person's answer (konduit answer ID STEP --value JSON)"
                if is_input_event(task.wait_event) else f"event {task.wait_event!r}")
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
