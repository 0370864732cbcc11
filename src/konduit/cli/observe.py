"""Commands that watch the history: dashboard, metrics, stats, plan."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Annotated

import typer

from konduit.cli.common import (
    Consecutive,
    DatabaseUrl,
    FanInAlert,
    History,
    app_option,
    console,
    describe_url,
    dump_json,
    err_console,
    load_app,
    plain_app,
    reachable,
)
from konduit.settings import default, settings, variable


def dashboard(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve the dashboard on.")] = 8090,
    host: Annotated[str, typer.Option(
        help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    app_spec: Annotated[str | None, app_option(
        "module:attribute of the konduit.App whose workflows Repair re-runs "
        "(without it, the pages' Repair is disabled; the API starts and repairs from the "
        "definitions workers registered).")] = None,
    token: Annotated[list[str] | None, typer.Option(
        "--token", metavar="[ro:|op:]SECRET",
        help="A token the API and the pages accept (repeatable): ro:SECRET reads, op:SECRET (or a "
        "bare SECRET) also starts, cancels and repairs. Added to KONDUIT_API_TOKEN's "
        "(comma-separated). Needed to listen on anything but a loopback address.",
        show_default=False)] = None,
    trusted_proxy: Annotated[list[str] | None, typer.Option(
        "--trusted-proxy", metavar="ADDRESS", envvar=variable("trusted_proxies"),
        help="A reverse proxy (address or network, repeatable) whose X-Forwarded-For names the "
        "client. None by default: the throttles of wrong tokens count per peer address.",
        show_default=False)] = None,
    database_url: DatabaseUrl = None,
    read_database_url: Annotated[str | None, typer.Option(
        "--read-database-url", envvar=variable("read_database_url"),
        help="A streaming replica for the pages' and the API's lists, details and stats "
        "(docs/read-replicas.md); writes and waits stay on the primary.",
        show_default=False)] = None,
    read_max_lag: Annotated[float | None, typer.Option(
        "--read-max-lag", min=0, envvar=variable("read_max_lag"),
        help="Seconds the replica may trail the primary before reads go to the primary "
        f"(default: {default('read_max_lag'):g}).", show_default=False)] = None,
) -> None:
    """Serve the web dashboard until SIGINT/SIGTERM: executions (paged, with a strip of queue
    depth and the oldest waiting task per queue), each one's input, DAG with live step states, a
    timeline of its attempts and fan-in waits, full tracebacks and map steps summarised in one
    row; Cancel and Repair behind a confirmation page; workers (alive, dead or stopped, slots,
    running attempts, abandoned threads, last heartbeat); dead letters (paged); alerts; the
    stats; /metrics and a JSON API under /api/v1 (docs at /api/v1/docs, OpenAPI at
    /openapi.json). See docs/dashboard.md. While the database is down its pages answer 503.
    With tokens, the API needs Authorization: Bearer and the pages a login (docs/api.md)."""
    from konduit.extras import require

    require("web", "konduit dashboard")  # one line naming the extra, not an ImportError
    from konduit.db.replica import DEFAULT_MAX_LAG
    from konduit.web.app import serve
    from konduit.web.security import check_bind, parse_tokens, tokens_from_env

    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)  # a down database is a 503 page
    tokens = tokens_from_env() + parse_tokens(token or [])
    check_bind(host, tokens)  # before loading the App: a refusal should not wait for it
    app = load_app(app_spec, database_url) if app_spec else None
    where = describe_url(database_url or (app.database_url if app else None)
                         or settings().database_url)
    guard = (f", {len(tokens)} token(s) required" if tokens else ", no token (loopback only)")
    proxies = [p.strip() for v in trusted_proxy or [] for p in v.split(",") if p.strip()]
    if read_database_url:
        bound = DEFAULT_MAX_LAG if read_max_lag is None else read_max_lag
        guard += f", reads from {describe_url(read_database_url)} within {bound:g} s"
    serve(database_url, app, host=host, port=port, tokens=tokens, trusted_proxies=proxies,
          read_database_url=read_database_url, read_max_lag=read_max_lag,
          announce=lambda url: err_console.print(
        f"konduit dashboard: serving {url} from {where}"
        + (f", repairs with {app_spec}" if app_spec
           else " (no --app: the API starts workflows from their registered definitions; "
           "the pages' Repair needs --app)") + guard
        + " (Ctrl-C stops)", soft_wrap=True, markup=False))


def metrics(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve /metrics on.")] = 9464,
    host: Annotated[str, typer.Option(
        help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    history: History = "24h",
    fan_in_alert: FanInAlert = "20s",
    consecutive: Consecutive = 2,
    database_url: DatabaseUrl = None,
) -> None:
    """Serve the numbers of `konduit stats` to Prometheus on http://HOST:PORT/metrics until
    SIGINT/SIGTERM. Every scrape reads the database; when it cannot (within 5 s), the scrape
    still answers, with konduit_scrape_error 1."""
    from konduit.observe.metrics import serve, wait_for_signal

    # Scrape errors are logged once each (and recovery once): warnings only, no library chatter.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    with serve(database_url, host=host, port=port, history=history, fan_in_alert=fan_in_alert,
               consecutive=consecutive) as exporter:
        err_console.print(f"konduit metrics: serving {exporter.url} from "
                          f"{describe_url(database_url or settings().database_url)} "
                          f"(Ctrl-C stops)", soft_wrap=True, markup=False)
        wait_for_signal()


def stats(
    workflow: Annotated[str | None, typer.Argument(
        metavar="WORKFLOW", help="Only this workflow (default: every workflow).",
        show_default=False)] = None,
    history: History = "24h",
    fan_in_alert: FanInAlert = "20s",
    consecutive: Consecutive = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print the stats as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Instrument the branches, not the pipeline: per branch p50/p95/p99 of its attempts,
    retries, outcomes and time since its last success; per join its fan-in wait, dispatch latency
    and usual straggler. Exit code: 0, or 3 when a fan-in alert fires (a join waited longer than
    --fan-in-alert in each of its last --consecutive executions) so cron and monitoring can page
    on it; 1 on an error."""

    from konduit.observe.stats import Stats, seconds_option, stats_renderables
    from konduit.reads import ReadModel

    seconds_option(history, "--history")  # bad options are reported before connecting
    seconds_option(fan_in_alert, "--fan-in-alert")
    app = plain_app(database_url)

    async def load() -> Stats:
        client = await app.client_async()
        try:
            return await ReadModel(client.reads).stats(
                workflow, history=history, fan_in_alert=fan_in_alert, consecutive=consecutive)
        finally:
            await client.close()

    result = asyncio.run(load())
    if as_json:
        print(dump_json(result.to_json()))
    else:
        for renderable in stats_renderables(result):
            console.print(renderable)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def plan(
    workflow: Annotated[str, typer.Argument(metavar="WORKFLOW", help="Name of the workflow to plan.")],
    app_spec: Annotated[str | None, app_option(
        "module:attribute of the konduit.App (or Workflow) that defines the workflow (without "
        "it: the definition a worker registered in the database).")] = None,
    window: Annotated[str | None, typer.Option(
        "--window", metavar="HH:MM",
        help="The window to finish in: the next such time of day (local), or a date-time.",
        show_default=False)] = None,
    within: Annotated[str | None, typer.Option(
        "--within", metavar="DURATION", help="The window as a duration from the start (e.g. 45m).",
        show_default=False)] = None,
    start: Annotated[str | None, typer.Option(
        "--start", metavar="HH:MM",
        help="When the execution starts: a time of day (its next occurrence) or a date-time "
        "(default: now).", show_default=False)] = None,
    history: History = "7d",
    version: Annotated[int | None, typer.Option(
        help="Workflow version whose DAG to plan (default: the latest); history counts every "
        "version.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Show the critical path with each step's p50/p95/p99 from history, the predicted finish
    and whether the window is at risk. The workflow's definition comes from --app, else from
    the database (as a worker serving it registered it). Exit code: 0, or 3 when the window is
    at risk or will be missed (so a nightly check can page on it); 1 on an error."""

    from konduit.observe.plan import (
        PLAN_AT_RISK_EXIT_CODE,
        PLAN_NOTE,
        Plan,
        history_seconds,
        parse_moment,
        plan_renderables,
        window_from,
    )

    history_seconds(history)  # a bad --history is reported before connecting
    app = load_app(app_spec, reachable(database_url)) if app_spec else plain_app(database_url)
    began = parse_moment(start, what="--start") if start is not None else \
        datetime.now().astimezone()
    deadline = window_from(began, window=window, within=within)

    from konduit.core.budgets import Reserve
    from konduit.core.workflow import WorkflowSpec
    from konduit.engine.stored import StoredSpecs
    from konduit.observe.budgets import budget_renderables, plan_budgets
    from konduit.reads import ReadModel

    async def load() -> tuple[WorkflowSpec, Plan, dict[str, float], dict[str, Reserve]]:
        client = await app.client_async()
        try:
            # The App's own definition, else the one a worker registered (by name, no code).
            specs = StoredSpecs(app.registry)
            await specs.load(client.db, workflow, version)
            spec = specs.get(workflow, version)
            model = ReadModel(client.reads)
            return (spec, await model.plan(spec, history=history, start=began, window=deadline),
                    await model.own_budgets(spec), await model.window_reserves(spec))
        finally:
            await client.close()

    spec, result, own, reserves = asyncio.run(load())
    found = plan_budgets(spec, result, own, reserves)
    if as_json:
        print(dump_json(result.to_json() | {"budgets": {s: b.to_json() for s, b in found.items()}}))
    else:
        for renderable in [*plan_renderables(result), *budget_renderables(found)]:
            console.print(renderable)
        console.print(f"[dim]{PLAN_NOTE}[/dim]")
    if result.verdict in ("at risk", "will miss"):
        raise typer.Exit(PLAN_AT_RISK_EXIT_CODE)
