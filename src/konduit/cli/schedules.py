"""``konduit schedules``: list the schedules, pause and resume one."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from konduit.cli.common import DatabaseUrl, console, dump_json, opened, plain_app, stamp, styled
from konduit.errors import CliError


def schedules(
    pause: Annotated[str | None, typer.Option(
        "--pause", metavar="NAME", help="Pause this schedule: no worker starts its ticks.",
        show_default=False)] = None,
    resume: Annotated[str | None, typer.Option(
        "--resume", metavar="NAME",
        help="Resume this schedule; its missed= policy decides what becomes of the ticks that "
        "passed while it was paused.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the schedules as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List the schedules: name, workflow, timing, next tick, the execution of the latest tick
    and its status. Schedules are defined in code (wf.schedule) and stored when a worker of their
    App starts."""
    if pause is not None and resume is not None:
        raise CliError("give --pause or --resume, not both")
    with opened(plain_app(database_url)) as app:
        if pause is not None or resume is not None:
            name = pause if pause is not None else resume
            assert name is not None
            changed = app.pause_schedule(name) if pause is not None else app.resume_schedule(name)
            verb = "paused" if pause is not None else "resumed"
            console.print(f"schedule [bold]{escape(name)}[/bold] {verb}"
                          + ("" if changed else f" (it was {verb} already)"))
            return
        rows = app.schedules()
    if as_json:
        print(dump_json(rows))
        return
    if not rows:
        console.print("no schedules (they are stored when a worker of the App that defines "
                      "them starts)")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for header in ("name", "workflow", "schedule", "missed", "next tick", "last execution",
                   "started", "status", "state"):
        table.add_column(header)
    for r in rows:
        state = ("[yellow]paused[/yellow]" if r.paused
                 else "[red]behind[/red]" if r.behind else "active")
        last = r.last_execution_id
        table.add_row(
            escape(r.name), escape(f"{r.workflow_name}@{r.workflow_version}"),
            escape(r.schedule), r.missed, stamp(r.next_tick),
            str(last) if last is not None else "—", stamp(r.last_started_at),
            styled(r.last_status) if r.last_status else "—",
            state,
        )
    console.print(table)
    if any(r.behind for r in rows):
        console.print("[red]behind[/red]: ticks are due that no worker started; is a worker of "
                      "the App running?")
