"""What the commands share: the console, option types, formatting, loading the App and
reaching the database."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer
from rich.console import Console

import konduit
from konduit.core.durations import format_elapsed
from konduit.db.connect import describe_url, open_database
from konduit.errors import CliError
from konduit.records import plain
from konduit.settings import settings, variable

# Piped (not a terminal, no COLUMNS set), lines are not wrapped at 80 columns: a script reading
# `konduit list | grep` gets each row on one line.
_piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
console = Console(highlight=False, width=4096 if _piped else None)
err_console = Console(stderr=True, highlight=False)

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url", metavar="URL",
        help="PostgreSQL URL (default: $KONDUIT_DATABASE_URL, else the embedded server).",
        show_default=False,
    ),
]


def app_option(help: str) -> Any:
    """The ``--app MODULE:ATTR`` option (or ``$KONDUIT_APP``) with this command's help."""
    return typer.Option("--app", metavar="MODULE:ATTR", envvar=variable("app"), help=help,
                        show_default=False)


# Options shared by the commands that read history (stats, metrics).
History = Annotated[str, typer.Option(
    "--history", metavar="DURATION", help="Use the executions started within this long ago.")]
FanInAlert = Annotated[str, typer.Option(
    "--fan-in-alert", metavar="DURATION",
    help="Alert when a join's fan-in wait exceeds this ...")]
Consecutive = Annotated[int, typer.Option(
    "--consecutive", min=1, help="... in each of its last this many executions.")]

FINISHED_STYLES = {
    "succeeded": "green",
    "degraded": "yellow",
    "running": "cyan",
    "active": "cyan",
    "pending": "dim",
    "scheduled": "dim",
    "waiting": "cyan",
    "retrying": "yellow",
    "ready": "dim",
    "failed": "red",
    "timed_out": "red",
    "cancelled": "magenta",
    "skipped": "dim",
}


# -- helpers ------------------------------------------------------------------------------------


def styled(status: str) -> str:
    style = FINISHED_STYLES.get(status)
    return f"[{style}]{status}[/{style}]" if style else status


def seconds(delta: timedelta | None) -> str:
    return format_elapsed(None if delta is None else delta.total_seconds())


def between(start: datetime | None, end: datetime | None) -> timedelta | None:
    return end - start if start is not None and end is not None else None


def stamp(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value is not None else "—"


def offset(value: datetime | None, origin: datetime | None) -> str:
    """``value`` as seconds after ``origin`` (the execution's start)."""
    return seconds(between(origin, value))


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def last_line(text: str | None) -> str:
    """The last non-empty line of an error (a traceback's is the exception itself)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def load_app(spec: str, database_url: str | None) -> konduit.App:
    """Import ``module:attribute`` (an App, or a Workflow to wrap in one) from the current
    directory or the installed packages; ``database_url`` overrides the App's own."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"APP must look like module:attribute (e.g. myproject.workflows:app), "
                       f"got {spec!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` would
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise CliError(f"cannot import module {module_name!r} (from {spec!r}): {exc}") from None
        raise  # the module exists but one of its own imports failed: show the traceback
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if isinstance(target, konduit.Workflow):
        return konduit.App([target], database_url=database_url)
    if not isinstance(target, konduit.App):
        raise CliError(f"{spec} is a {type(target).__name__}, not a konduit.App or konduit.Workflow")
    if database_url is None:
        return target
    # Same workflows, the database named on the command line (the registry is shared, not copied).
    app = konduit.App([], database_url=database_url)
    for name, value in vars(target).items():  # registry, pool size and other public settings
        if not name.startswith("_"):
            setattr(app, name, value)
    return app


@contextmanager
def opened(app: konduit.App) -> Iterator[konduit.App]:
    try:
        yield app
    finally:
        app.close()


def reachable(database_url: str | None, *, schema: bool = True) -> str | None:
    """Fail fast, in one line, when an explicitly configured database does not answer or, with
    ``schema``, has an older schema than this konduit needs (naming the command that fixes it).
    The embedded server is left alone: it is started and migrated on first use. Returns
    ``database_url``."""
    if not (database_url or settings().database_url):
        return database_url
    flag = " --database-url URL" if database_url else ""
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)  # the probe says it in one line

    async def probe() -> None:
        db = await open_database(database_url, max_size=1, name="konduit-cli", check_schema=schema,
                                 schema_hint=f"konduit db migrate{flag}")
        await db.close()

    asyncio.run(probe())
    return database_url


def plain_app(database_url: str | None) -> konduit.App:
    """An App without workflows: enough to inspect, cancel and migrate."""
    return konduit.App([], database_url=reachable(database_url))


def parse_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc}") from None


def read_json_argument(text: str | None, option: str) -> Any:
    """A JSON option's value: the JSON itself, ``@path`` for a file's contents, or ``-`` for
    standard input."""
    if text is None:
        return None
    source = option
    if text == "-":
        text, source = sys.stdin.read(), f"{option} - (standard input)"
    elif text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except OSError as exc:
            raise CliError(f"{option} {text}: cannot read {path!r}: {exc.strerror}") from None
        source = f"{option} @{path}"
    return parse_json(text, source)


def dump_json(value: Any) -> str:
    return json.dumps(value, indent=2, default=_json_default, ensure_ascii=False)


def _json_default(value: Any) -> Any:
    # Records (konduit.records) print as the dicts they replace, so --json keeps its shape.
    found = plain(value)
    return str(value) if found is value else found


__all__ = ["CliError", "describe_url"]
