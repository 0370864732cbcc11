"""Commands that show konduit off: demo and bench."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from konduit.cli.common import (
    DatabaseUrl,
    console,
    describe_url,
    err_console,
    reachable,
)
from konduit.databases import DEMO_DATABASE
from konduit.db.embedded import with_database
from konduit.errors import CliError
from konduit.settings import settings


def demo(
    executions: Annotated[int, typer.Option(min=1, help="Executions to start.")] = 5,
    concurrency: Annotated[int, typer.Option(min=1, help="Tasks each worker runs at once.")] = 8,
    workers: Annotated[int, typer.Option(min=1, help="In-process workers.")] = 2,
    incident_after: Annotated[int | None, typer.Option(
        "--incident-after", metavar="K", min=0,
        help="The image-resize call slows from ~0.2 s to 10 s in the executions after the K-th "
        "(default: only in the last one).", show_default=False)] = None,
    within: Annotated[str, typer.Option(
        "--within", metavar="DURATION",
        help="Each execution's window (deadline_at = its start + this).")] = "5s",
    database: Annotated[str, typer.Option(
        "--database", metavar="NAME",
        help="The demo's own database, on the server of --database-url / "
        "KONDUIT_DATABASE_URL (else the embedded server); created when missing.")] = DEMO_DATABASE,
    clean: Annotated[bool, typer.Option(
        "--clean", help="Drop the demo's database (its executions, workers, schedules) and "
        "exit.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Run the nightly content pipeline: transcribe, five parallel branches, publish; the last
    execution hits an incident (the image resize slows down) and degrades to a fallback. It
    runs in a database of its own (--database, konduit_demo) on the same server, never in the
    one --database-url or KONDUIT_DATABASE_URL names; --clean drops it."""
    from konduit.core.durations import parse_duration
    from konduit.databases import drop_own_database, own_database
    from konduit.demo import run_demo

    window = parse_duration(within, what="--within")
    server = reachable(database_url, schema=False)
    given = server or settings().database_url
    where = (f"database {database} on the embedded server" if not given
             else describe_url(with_database(given, database)))
    if clean:
        dropped = drop_own_database(database, server)
        console.print(f"dropped {where}" if dropped else f"no {where} to drop", soft_wrap=True,
                      markup=False)
        return
    with console.status(f"preparing {where} (the embedded server starts on first use)"):
        target = own_database(database, server)
    code = run_demo(executions=executions, concurrency=concurrency, workers=workers,
                    incident_after=incident_after, window=window, database_url=target,
                    console=console)
    again = " ".join(["konduit demo --clean", *([f"--database {database}"]
                                                if database != DEMO_DATABASE else []),
                      *(["--database-url URL"] if database_url else [])])
    shown = (f"konduit dashboard --database-url '{target}'" if not given
             else f"konduit dashboard with a --database-url naming {database}")
    console.print(f"\nthe demo ran in {where}, not in your default database: {shown} shows "
                  f"it; {again} drops it.", soft_wrap=True, markup=False)
    raise typer.Exit(code)


def bench(
    quick: Annotated[bool, typer.Option(
        "--quick", help="Smaller loads and fewer trials, no history (about a minute).")] = False,
    workers: Annotated[str | None, typer.Option(
        "--workers", metavar="P[,P...]",
        help="Worker process counts of the 'workers' curve (default: 1,2,4; quick: 1,2).",
        show_default=False)] = None,
    only: Annotated[list[str] | None, typer.Option(
        "--only", metavar="NAME", help="Run only this benchmark; repeatable (commit_probe, "
        "throughput, db_cost, workers, latency, start, wide, collide, backlog, history, "
        "fan_in_cost_by_width, simultaneous_finish, batching, map_10k, fair_share, wide_map, "
        "search, shapes, idle_fleet, prune_day; "
        "map_1m, fan_out_1m, history_load, search_history and soak run only when named).",
        show_default=False)] = None,
    duration: Annotated[float, typer.Option(
        "--duration", metavar="SECONDS", min=1,
        help="Soak only: seconds of steady load.")] = 1800.0,
    window: Annotated[float, typer.Option(
        "--window", metavar="SECONDS", min=0.5,
        help="Soak only: seconds per measured window.")] = 30.0,
    rate: Annotated[float, typer.Option(
        "--rate", metavar="N", min=0.01,
        help="Soak only: executions started per second (10 tasks each).")] = 10.0,
    retention: Annotated[int | None, typer.Option(
        "--retention", metavar="SECONDS", min=1,
        help="Soak only: the worker's App(retention=...) (default: 120 or 4 windows).",
        show_default=False)] = None,
    burst: Annotated[int, typer.Option(
        "--burst", metavar="N", min=0,
        help="Soak only: executions of the capacity burst before and after the soak.")] = 300,
    history_after: Annotated[int | None, typer.Option(
        "--history-after", metavar="SECONDS", min=1,
        help="Soak only: the worker's App(history_after=...): finished executions move into "
        "the history (default: no history).", show_default=False)] = None,
    history_executions: Annotated[int, typer.Option(
        "--history-executions", metavar="N", min=1,
        help="history_load only: finished executions in the history.")] = 1_000_000,
    prune_executions: Annotated[int, typer.Option(
        "--prune-executions", metavar="N", min=1,
        help="prune_day only: executions of the day pruned.")] = 100_000,
    profile: Annotated[str | None, typer.Option(
        "--profile", metavar="DIR", help="Run every worker process under cProfile and write "
        "its profile (.prof) into DIR.", show_default=False)] = None,
    output: Annotated[str | None, typer.Option(
        "--output", "-o", metavar="FILE", help="Also write the JSON report to FILE.",
        show_default=False)] = None,
    codec: Annotated[str | None, typer.Option(
        "--codec", metavar="KIND", help="Run with this payload codec (none, zlib, encrypted, "
        "aesgcm; default: KONDUIT_CODEC...), the worker processes too; an encrypting one "
        "without KONDUIT_CODEC_KEYS gets a key made for the run.", show_default=False)] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Measure the engine: a commit probe (what this storage commits per second), throughput
    through real worker processes and its curve over process counts, idle-worker latency,
    starts, wide joins, simultaneous finishes, a queued backlog, a large history, and the
    fan-in protocol's own costs. Prints one JSON document; its summary puts each figure beside
    its target. Each benchmark runs in its own scratch database on the server, created and
    dropped here. ``--only soak`` runs the soak (steady load with retention on for
    --duration seconds, with --history-after the history too; not part of a full run);
    ``--only history_load`` the throughput beside a history of --history-executions."""
    import os
    from pathlib import Path

    from konduit.bench.fleet import PROFILE_ENV
    from konduit.bench.soak import SoakSettings
    from konduit.bench.suite import run_bench, use_codec

    if output is not None and not Path(output).absolute().parent.is_dir():
        raise CliError(f"--output: directory {Path(output).absolute().parent} does not exist")
    curve: list[int] | None = None
    if workers is not None:
        try:
            curve = [int(p) for p in workers.split(",")]
        except ValueError:
            curve = []
        if not curve or min(curve) < 1:
            raise CliError(f"--workers: expected process counts like 1,2,4, got {workers!r}")
    if profile is not None:
        Path(profile).mkdir(parents=True, exist_ok=True)
        os.environ[PROFILE_ENV] = str(Path(profile).absolute())
    if codec is not None:
        use_codec(codec)
    report = run_bench(reachable(database_url, schema=False), quick=quick, workers=curve,
                       only=only,
                       soak=SoakSettings(duration=duration, window=window, rate=rate,
                                         retention=retention, burst=burst,
                                         history_after=history_after),
                       history_executions=history_executions,
                       prune_executions=prune_executions,
                       progress=lambda message: err_console.print(message, markup=False))
    text = json.dumps(report, indent=2)
    if output is not None:
        Path(output).write_text(text + "\n")
    print(text)
