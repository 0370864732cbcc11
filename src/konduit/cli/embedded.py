"""Commands on the embedded PostgreSQL server: status and stop."""

from __future__ import annotations

from typing import Annotated

import typer

from konduit.cli.common import console, dump_json
from konduit.db import embedded as server


def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Show where the embedded PostgreSQL server keeps its data and whether it runs (it is not
    started by this command)."""
    found = server.server_status()
    if as_json:
        print(dump_json(found))
        return
    console.print(f"data directory: {found['data_directory']}", soft_wrap=True, markup=False)
    if not found["running"]:
        state = "not running" + ("" if found["initialised"] else " (not initialised yet)")
        console.print(f"server: {state}")
        return
    console.print(f"server: running, pid {found['pid']}, port {found['port']}")
    console.print(f"url: {found['url']}", soft_wrap=True, markup=False)


def stop() -> None:
    """Stop the embedded PostgreSQL server (fast shutdown: open sessions are ended). Any
    command that needs it starts it again."""
    if server.stop_server():
        console.print("stopped the embedded PostgreSQL server")
    else:
        console.print("the embedded PostgreSQL server was not running")
