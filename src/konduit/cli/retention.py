"""``konduit prune``: delete finished executions older than a cutoff, in batches."""

from __future__ import annotations

from typing import Annotated

import typer

from konduit.cli.common import DatabaseUrl, console, dump_json, opened, plain_app
from konduit.engine.retention import BATCH_SIZE


def _prune(database_url: str | None, older_than: str, include_dead_letters: bool,
           batch_size: int, dry_run: bool) -> tuple[int, int]:
    with opened(plain_app(database_url)) as app:
        before = app.count_prunable(older_than)
        if dry_run:
            return before.deletable(include_dead_letters), before.dead_letters
        deleted = app.prune(older_than, include_dead_letters=include_dead_letters,
                            batch_size=batch_size)
        kept = 0 if include_dead_letters else app.count_prunable(older_than).dead_letters
        return deleted, kept


def prune(
    older_than: Annotated[str, typer.Option(
        "--older-than", metavar="DURATION",
        help="Delete executions that finished longer ago than this (e.g. 30d, 12h).")],
    include_dead_letters: Annotated[bool, typer.Option(
        "--include-dead-letters",
        help="Also delete executions holding a dead letter no repair has superseded.")] = False,
    batch_size: Annotated[int, typer.Option(
        min=1, help="Executions deleted per transaction.")] = BATCH_SIZE,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only count what would be deleted.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Delete finished executions older than --older-than with all their rows (steps, tasks,
    attempts, payloads, output versions), in batches. Pending and running executions are never
    touched; executions holding a dead letter are kept unless --include-dead-letters."""
    deleted, kept = _prune(database_url, older_than, include_dead_letters, batch_size, dry_run)
    if as_json:
        print(dump_json({"deleted": 0 if dry_run else deleted,
                         "would_delete": deleted if dry_run else None,
                         "kept_with_dead_letters": kept, "dry_run": dry_run}))
        return
    verb = "would prune" if dry_run else "pruned"
    console.print(f"{verb} {deleted} execution(s) that finished more than {older_than} ago")
    if kept and not include_dead_letters:
        console.print(f"kept {kept} holding a dead letter (see `konduit dead-letters`; "
                      "--include-dead-letters prunes them too)")


def move_history(
    older_than: Annotated[str, typer.Option(
        "--older-than", metavar="DURATION",
        help="Move executions that finished longer ago than this (e.g. 1d, 12h).")],
    batch_size: Annotated[int, typer.Option(
        min=1, help="Executions moved per transaction.")] = BATCH_SIZE,
    as_json: Annotated[bool, typer.Option("--json", help="Print the count as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Move finished executions older than --older-than, with all their rows, out of the tables
    the workers write into the history (tables partitioned by day, which prune drops a day at a
    time). They read the same after the move. Pending and running executions, and those
    holding a dead letter, stay. App(history_after=...) has the workers do it every minute."""
    with opened(plain_app(database_url)) as app:
        moved = app.move_to_history(older_than, batch_size=batch_size)
    if as_json:
        print(dump_json({"moved": moved}))
        return
    console.print(f"moved {moved} execution(s) that finished more than {older_than} ago "
                  "into the history")
