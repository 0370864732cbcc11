"""Commands on executions: start, status, list, cancel, repair, redrive, fork, dead-letters."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

import konduit
from konduit.cli.common import (
    CliError,
    DatabaseUrl,
    app_option,
    between,
    console,
    dump_json,
    err_console,
    last_line,
    load_app,
    offset,
    one_line,
    opened,
    plain_app,
    reachable,
    read_json_argument,
    seconds,
    stamp,
    styled,
)
from konduit.cli.waits import print_waiting, waiting_json
from konduit.core.ids import short_id
from konduit.core.model import ExecutionStatus
from konduit.core.requests import (
    MAX_BATCH_SIZE,
    BulkRequest,
    CancelRequest,
    ForkRequest,
    StreamRequest,
    doc,
)
from konduit.core.search import ExecutionFilter, parse_tags, search_filter
from konduit.core.words import step_word
from konduit.records import BulkResult, JournalEntry, StepRecord, TaskRecord


def start(
    workflow: Annotated[str, typer.Argument(metavar="WORKFLOW", help="Name of the workflow to start.")],
    app_spec: Annotated[str | None, app_option(
        "module:attribute of the konduit.App that defines the workflow (without it: the "
        "definition a worker registered).")] = None,
    input: Annotated[str | None, typer.Option(
        "--input", "-i", metavar="JSON|@FILE|-",
        help="Input as JSON, @file for a file's, - for standard input's.")] = None,
    idempotency_key: Annotated[str | None, typer.Option(
        "--idempotency-key", "-k", metavar="KEY",
        help="Starting twice with the same key returns the same id.")
    ] = None,
    version: Annotated[int | None, typer.Option(help="Workflow version (default: the latest).",
                                                show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for it to finish.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds --wait waits at most.")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the id (and with --wait the result) as JSON.")] = False,
    tag: Annotated[list[str] | None, typer.Option(
        "--tag", metavar="KEY=VALUE", help="Tag it, to find it by (repeatable).")] = None,
    delay: Annotated[str | None, typer.Option(
        help="Start it this much later (10m): it is scheduled until then.")] = None,
    run_at: Annotated[str | None, typer.Option(
        "--run-at", help="Start it at this date-time (ISO 8601; naive means local).")] = None,
    priority: Annotated[int, typer.Option(
        help="Added to each step's priority: lower is claimed first.")] = 0,
    fair_key: Annotated[str | None, typer.Option(
        "--fair-key", metavar="KEY",
        help="The key its fair share is counted under, instead of what the workflow's fair_by "
        "computes (docs/fairness.md).", show_default=False)] = None,
    deadline_at: Annotated[str | None, typer.Option(
        "--deadline-at", metavar="DATE-TIME",
        help="When it must be finished: an ISO 8601 date-time with its zone "
        "(2026-11-30T06:00+01:00, or Z for UTC); it times out then.",
        show_default=False)] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Start an execution and print its id (with --wait: then its output).

    Exit codes with --wait: 0 it succeeded, 1 it failed, timed out or was cancelled (or any
    error), 2 a bad command line, 124 --timeout passed while it still runs (it goes on).
    """
    payload = read_json_argument(input, "--input")
    tags = parse_tags(tag or []) or None
    when = None
    if run_at is not None:
        try:
            when = datetime.fromisoformat(run_at).astimezone()
        except ValueError:
            raise CliError(f"--run-at {run_at!r}: an ISO 8601 date-time (2026-11-30T06:00)") \
                from None
    deadline = None if deadline_at is None else zoned_moment(deadline_at, "--deadline-at")
    app = load_app(app_spec, reachable(database_url)) if app_spec else plain_app(database_url)
    with opened(app):
        handle = app.start(workflow, payload, idempotency_key=idempotency_key, version=version,
                           tags=tags, run_at=when, delay=delay, priority=priority,
                           fair_key=fair_key, deadline_at=deadline)
        if not wait:
            print(dump_json({"id": handle.id}) if as_json else str(handle.id))
            return
        if not as_json:
            console.print(str(handle.id))
        began = time.monotonic()
        result = _wait(app, handle.id, timeout)
        if as_json:
            print(dump_json({"id": handle.id, "status": result.status, "error": result.error,
                             "output": result.output, "outcomes": result.outcomes}))
            if result.status != "succeeded":
                raise typer.Exit(EXIT_FAILED)
            return
        err_console.print(f"{styled(result.status)} after {time.monotonic() - began:.2f} s")
        if result.status != "succeeded":
            if result.error:
                err_console.print(f"[red]error:[/red] {escape(last_line(result.error))}",
                                  soft_wrap=True)
            raise typer.Exit(EXIT_FAILED)
        console.print(dump_json(result.output), markup=False)


def zoned_moment(text: str, option: str) -> datetime:
    """An ISO 8601 date-time that says its zone (``+01:00``, ``Z``); else a one-line error
    naming ``option``: a moment without a zone would mean whatever this machine's zone is."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CliError(f"{option} {text!r}: not an ISO 8601 date-time "
                       f"(e.g. 2026-11-30T06:00+01:00, or 2026-11-30T05:00Z)") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise CliError(f"{option} {text!r}: give its zone, e.g. {moment.isoformat()}+01:00 "
                       f"or {moment.isoformat()}Z for UTC")
    return moment


EXIT_FAILED = 1
"""``--wait``: the execution failed, timed out or was cancelled (as for any error)."""
EXIT_WAIT_TIMEOUT = 124
"""``--wait``: ``--timeout`` passed while the execution still runs (as ``timeout(1)`` exits)."""


def _wait(app: konduit.App, execution_id: UUID, timeout: float | None) -> konduit.ExecutionResult:
    """The finished execution's result, failed or not; exits 124 when ``timeout`` passes first
    (one red line: the execution goes on)."""
    try:
        return app.wait(execution_id, timeout)
    except konduit.ExecutionFailed as exc:
        return exc.result
    except TimeoutError as exc:
        err_console.print(f"[red]error:[/red] {escape(one_line(str(exc)))}", soft_wrap=True)
        raise typer.Exit(EXIT_WAIT_TIMEOUT) from None


def step_table(steps: list[StepRecord], tasks: list[TaskRecord], origin: datetime | None) -> Table:
    """One row per step, in firing order; times in seconds after the execution started."""
    attempts: dict[str, int] = {}
    open_tasks: dict[str, list[tuple[str, bool]]] = {}
    now = datetime.now(UTC)
    for task in tasks:
        attempts[task.step] = attempts.get(task.step, 0) + int(task.attempt)
        if task.status in ("ready", "running", "waiting"):
            backoff = task.status == "ready" and task.attempt > 0 and task.run_at is not None \
                and task.run_at > now
            open_tasks.setdefault(task.step, []).append((task.status, backoff))
    far = datetime.max.replace(tzinfo=origin.tzinfo if origin else None)
    ordered = sorted(steps, key=lambda s: (s.fired_at or far, s.step))
    show_tasks = any(s.tasks_total != 1 for s in steps)  # only map steps make several
    table = Table(title="steps (seconds after the execution started)", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    table.add_column("step", no_wrap=True)
    table.add_column("status", no_wrap=True)
    if show_tasks:
        table.add_column("tasks", justify="right")
    for header in ("tries", "fired", "ended", "took", "fan-in\nwait"):
        table.add_column(header, justify="right")
    table.add_column("straggler", no_wrap=True)
    for s in ordered:
        is_join = int(s.up_total) > 1
        done = int(s.tasks_ok) + int(s.tasks_degraded)
        # pending / ready / retrying / running / waiting: one word, one meaning (core.words).
        cells = [escape(s.step), styled(step_word(s.status, open_tasks.get(s.step, ())))]
        if show_tasks:
            cells.append(f"{done}/{s.tasks_total}" if s.tasks_total is not None else "—")
        cells += [
            str(attempts.get(s.step, 0)),
            offset(s.fired_at, origin),
            offset(s.ended_at, origin),
            seconds(between(s.fired_at, s.ended_at)),
            seconds(between(s.first_upstream_at, s.fired_at)) if is_join else "",
            escape(s.straggler or "") if is_join else "",
        ]
        table.add_row(*cells)
    return table


def journal_table(calls: list[JournalEntry]) -> Table:
    """The durable calls of an execution (``konduit status --journal``): one row a call."""
    table = Table(title="journal (durable calls)", title_justify="left")
    for column in ("step", "#", "call", "live in", "took", "replayed", "result"):
        table.add_column(column, justify="right" if column in ("#", "took", "result") else "left")
    for c in calls:
        table.add_row(
            escape(c.step + (f"[{c.map_index}]" if c.map_index else "")), str(c.seq),
            escape(c.name),
            f"attempt {c.attempt}" + (f" (run {c.generation})" if c.generation > 1 else ""),
            seconds(timedelta(seconds=c.duration_seconds)),
            f"{c.replays}x, last by attempt {c.last_replayed_attempt}" if c.replays else "no",
            f"{c.result_bytes} B")
    return table


def status(
    execution_id: Annotated[str, typer.Argument(
        metavar="EXECUTION_ID", help="The execution's id, or a unique start or end of it.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    journal: Annotated[bool, typer.Option(
        "--journal", help="Also list the durable calls its handlers recorded (ctx.call).")] = False,
    wait: Annotated[bool, typer.Option(
        "--wait", help="First wait for it to finish.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds --wait waits at most.")] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Show an execution: status, error, output, a table of its steps and the answers of its
    people's steps.

    Exit codes: 0, 1 any error; with --wait as for ``start --wait``: 0 it succeeded, 1 it
    failed, timed out or was cancelled, 124 --timeout passed while it still runs."""
    with opened(plain_app(database_url)) as app:
        result = app.status(execution_id)
        if wait:
            result = _wait(app, result.id, timeout)
        calls = app.journal(result.id) if journal else None
        steps = app.steps(result.id)
        tasks = app.tasks(result.id)
        versions = app.outputs(result.id)
        late = [p for p in app.payloads(result.id) if p.source == "late"]
        auto_repair = app.auto_repair_status(result.id)
        stall = None if result.finished else app.stall(result.id)
        streams = app.streams(result.id)
        answers = app.answers(result.id)
        # A running execution nobody serves waits forever without a word: say so.
        served = None if result.finished else app.workflow_served(result.workflow, result.version)
    hint = None if served is not False else (
        f"no live worker serves {result.workflow}@{result.version}: "
        f"start one with `konduit worker module:app`")
    if as_json:
        print(dump_json({
            "id": result.id, "workflow": result.workflow, "version": result.version,
            "status": result.status, "error": result.error, "output": result.output,
            "outcomes": result.outcomes, "created_at": result.created_at,
            "finished_at": result.finished_at, "output_versions": versions,
            "late_results": late, "served_by_live_worker": served, "hint": hint,
            "auto_repair": auto_repair, "waiting": waiting_json(tasks),
            "stalled": None if stall is None else stall.to_json(),
            **({} if calls is None else {"journal": calls}),
            "streams": streams, "answers": answers,
        }))
        if wait and result.status != "succeeded":
            raise typer.Exit(EXIT_FAILED)
        return
    took = between(result.created_at, result.finished_at)
    console.print(f"execution [bold]{result.id}[/bold]  {escape(result.workflow)} "
                  f"v{result.version}  {styled(result.status)}")
    console.print(f"started {stamp(result.created_at)}"
                  + (f", finished {stamp(result.finished_at)} ({seconds(took)})" if took else ""))
    if result.error:
        console.print(f"[red]error:[/red] {escape(result.error)}")
    if auto_repair:
        console.print(f"[yellow]{escape(auto_repair)}[/yellow]", soft_wrap=True)
    if stall is not None:
        console.print(f"[red]stalled[/red] since {stamp(stall.raised_at)}: nothing of it can run "
                      f"and the watchdog's fan-in decision could not move it:", soft_wrap=True)
        for why in stall.details.get("reasons", []):
            console.print(f"  {escape(str(why))}", soft_wrap=True)
    if result.output is not None:
        console.print("output:")
        console.print(dump_json(result.output), markup=False)
    if len(versions) > 1:
        console.print("output versions (repairs):")
        for version in versions:
            degraded = ", ".join(version.degraded) or "none degraded"
            console.print(f"  v{version.version} {version.status} ({degraded}): "
                          f"{dump_json(version.output)}", markup=False, soft_wrap=True)
    if steps:
        console.print(step_table(steps, tasks, result.created_at))
    for kept in streams:
        restarted = f", restarted {kept.restarts}x" if kept.restarts else ""
        console.print(f"stream [bold]{escape(kept.name)}[/bold]: {kept.chunks} chunks, {kept.bytes} "
                      f"bytes{restarted} (konduit stream {short_id(result.id)} --name "
                      f"{escape(kept.name)})", soft_wrap=True)
    for given in answers:
        console.print(f"answered [bold]{escape(given.step)}[/bold] by "
                      f"{escape(given.answered_by or '?')} at {stamp(given.answered_at)}: "
                      f"{escape(dump_json(given.value))}", soft_wrap=True)
    print_waiting(tasks)
    if calls is not None:
        console.print(journal_table(calls) if calls else "no durable calls recorded")
    if hint:
        console.print(f"[yellow]hint:[/yellow] {escape(hint)}", soft_wrap=True)
    for payload in late:
        where = payload.step + (f"[{payload.map_index}]" if payload.map_index else "")
        console.print(f"[yellow]late result[/yellow] of {escape(where)} (after its deadline; "
                      f"the join did not use it): {escape(dump_json(payload.payload))}",
                      soft_wrap=True)
    if wait and result.status != "succeeded":
        raise typer.Exit(EXIT_FAILED)


# The options of a bulk cancel or redrive: the search's (as `konduit list` takes them).
FilterStatus = Annotated[ExecutionStatus | None, typer.Option(
    "--status", help="Only executions with this status.", show_default=False)]
FilterWorkflow = Annotated[str | None, typer.Option(
    "--workflow", metavar="NAME[@VERSION]", help="Only executions of this workflow (and version).")]
FilterId = Annotated[str | None, typer.Option(
    "--id", help="The start or the end of the id (at least 4 hex digits).")]
FilterKey = Annotated[str | None, typer.Option("--key", help="The idempotency key.")]
FilterTags = Annotated[list[str] | None, typer.Option(
    "--tag", metavar="KEY=VALUE", help="Carries this tag (repeatable: all of them).")]
FilterInput = Annotated[list[str] | None, typer.Option(
    "--input", metavar="FIELD=VALUE", help="The input has this field (repeatable).")]
FilterSince = Annotated[str | None, typer.Option(
    "--since", help="Created since: a duration ago (1h) or a date-time.")]
FilterUntil = Annotated[str | None, typer.Option(
    "--until", help="Created before: a duration ago (1h) or a date-time.")]
FilterFairKey = Annotated[str | None, typer.Option(
    "--fair-key", help="Started with this fair key.")]
DryRun = Annotated[bool, typer.Option(
    "--dry-run", help="Count the executions it would touch; change nothing.")]
BatchSize = Annotated[int, typer.Option(
    "--batch-size", min=1, max=MAX_BATCH_SIZE, help=doc(BulkRequest, "batch_size") + ".")]


def _bulk_filter(execution_id: str | None, **parts: Any) -> ExecutionFilter | None:
    """The filter of a bulk command, or None for a command on one EXECUTION_ID; both, or
    neither, is refused naming what to give."""
    given = {k: v for k, v in parts.items() if v}
    if execution_id is not None:
        if given:
            options = ", ".join("--" + k.replace("_", "-") for k in sorted(given))
            raise CliError(f"give an EXECUTION_ID or a filter ({options}), not both")
        return None
    if not given:
        raise CliError("give an EXECUTION_ID, or a filter for many: --workflow, --status, "
                       "--since, --tag KEY=VALUE, ... (with --dry-run to count them first)")
    return search_filter(**parts)


def _print_bulk(result: BulkResult, as_json: bool) -> None:
    if as_json:
        print(dump_json({k: v for k, v in result.to_dict().items() if k != "ids"}
                        | {"ids": [str(i) for i in result.ids]}))
        return
    did = {"cancel": "cancelled", "redrive": "redriven"}[result.action]
    head = (f"dry run: {result.done} of {result.matched} matching execution(s) would be {did}"
            if result.dry_run else
            f"{did} {result.done} of {result.matched} matching execution(s) in "
            f"{result.batches} batch(es), {result.seconds:.1f} s (longest batch "
            f"{result.longest_batch_seconds * 1000:.0f} ms)")
    console.print(head)
    for reason, count in result.skipped.items():
        console.print(f"  skipped {count}: {escape(reason)}")


def cancel(
    execution_id: Annotated[str | None, typer.Argument(
        metavar="EXECUTION_ID", show_default=False,
        help="The execution's id, or a unique start or end of it; without it, the filter's "
             "executions.")] = None,
    reason: Annotated[str, typer.Option(
        "--reason", help=doc(CancelRequest, "reason") + ".")] = "cancelled",
    workflow: FilterWorkflow = None,
    status: FilterStatus = None,
    id: FilterId = None,
    key: FilterKey = None,
    tag: FilterTags = None,
    input: FilterInput = None,
    since: FilterSince = None,
    until: FilterUntil = None,
    fair_key: FilterFairKey = None,
    dry_run: DryRun = False,
    batch_size: BatchSize = 100,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print {"id", "cancelled", "status"} (for a filter: the counts) as '
                       "JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Cancel a running execution (its pending work is never started), or every execution a
    filter finds (``--workflow X --status running --since 1h --tag k=v``), a batch per
    transaction; ``--dry-run`` says how many it would touch."""
    where = _bulk_filter(execution_id, workflow=workflow, status=status, id=id, key=key,
                         tags=tag, inputs=input, since=since, until=until, fair_key=fair_key)
    if where is not None:
        with opened(plain_app(database_url)) as app:
            _print_bulk(app.bulk("cancel", where, dry_run=dry_run, batch_size=batch_size,
                                 reason=reason), as_json)
        return
    assert execution_id is not None
    with opened(plain_app(database_url)) as app:
        result = app.status(execution_id)  # a unique prefix or tail names it too
        cancelled = app.cancel(result.id, reason)
        result = app.status(result.id)
    if as_json:
        print(dump_json({"id": result.id, "cancelled": cancelled, "status": result.status}))
        return
    if cancelled:
        console.print(f"cancelled {result.id}")
        return
    console.print(f"execution {result.id} has already finished ({styled(result.status)}); "
                  "nothing to cancel")


def fork(
    execution_id: Annotated[str, typer.Argument(
        metavar="EXECUTION_ID", show_default=False,
        help="The origin execution's id, or a unique start or end of it.")],
    from_step: Annotated[str, typer.Option(
        "--from-step", show_default=False,
        help=doc(ForkRequest, "from_step") + ".")],
    input: Annotated[str | None, typer.Option(
        "--input", "-i", metavar="JSON|@FILE|-", show_default=False,
        help="The fork's input as JSON, @file for a file's, - for standard input's "
             "(default: the origin's).")] = None,
    app_spec: Annotated[str | None, app_option(
        "module:attribute of the konduit.App that defines the workflow (without it: the "
        "definition a worker registered; re-running a map step needs its code).")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="Wait for the fork to finish.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds --wait waits at most.")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print {"id", "forked_from", "from_step"} as JSON.')] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Start a new execution of an execution's workflow (its version) that copies the outputs
    of the steps --from-step depends on and runs that step and every other one; --input gives
    it a new input (copied steps keep what they made from the origin's: fork from the first
    step whose result should change). docs/recovering-executions.md. Exit codes with --wait
    as for ``start --wait``: 0, 1 (not succeeded), 124 (--timeout passed)."""
    new_input = read_json_argument(input, "--input")
    app = load_app(app_spec, reachable(database_url)) if app_spec else plain_app(database_url)
    with opened(app) as app:
        eid = app.status(execution_id).id  # a unique prefix or tail names it too
        forked = app.fork(eid, from_step=from_step, input=new_input).id
        said = {"id": forked, "forked_from": eid, "from_step": from_step}
        if not wait:
            if as_json:
                print(dump_json(said))
            else:
                console.print(f"forked {eid} at {from_step}: {forked}")
            return
        result = _wait(app, forked, timeout)
    if as_json:
        print(dump_json({**said, "status": result.status}))
    else:
        console.print(f"forked {eid} at {from_step}: {forked}")
        console.print(f"execution {forked}: {styled(result.status)}")
    if result.status != "succeeded":
        raise typer.Exit(1)


def redrive(
    execution_id: Annotated[str | None, typer.Argument(
        metavar="EXECUTION_ID", show_default=False,
        help="The execution's id, or a unique start or end of it; without it, the filter's "
             "executions.")] = None,
    app_spec: Annotated[str | None, app_option(
        "module:attribute of the konduit.App that defines the workflow (without it: the "
        "definition a worker registered; a workflow with map steps needs its code).")] = None,
    workflow: FilterWorkflow = None,
    status: FilterStatus = None,
    id: FilterId = None,
    key: FilterKey = None,
    tag: FilterTags = None,
    input: FilterInput = None,
    since: FilterSince = None,
    until: FilterUntil = None,
    fair_key: FilterFairKey = None,
    dry_run: DryRun = False,
    batch_size: BatchSize = 100,
    wait: Annotated[bool, typer.Option(
        "--wait", help="Wait for the redriven execution to finish (one EXECUTION_ID).")] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds --wait waits at most.")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the steps re-run (for a filter: the counts) as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Run a failed, timed-out or cancelled execution again from the steps that did not
    succeed, keeping every succeeded (and degraded) output, as a new generation of the re-run
    steps; or every execution a filter finds (``--workflow X --status failed --since 1h --tag
    k=v``), a batch per transaction, with ``--dry-run`` to count them first.

    A succeeded execution is not redriven: ``konduit repair`` re-runs its degraded steps
    (docs/recovering-executions.md). Exit codes with --wait as for ``start --wait``: 0, 1 (not
    succeeded), 124 (--timeout passed).
    """
    where = _bulk_filter(execution_id, workflow=workflow, status=status, id=id, key=key,
                         tags=tag, inputs=input, since=since, until=until, fair_key=fair_key)
    if where is not None and wait:
        raise CliError("--wait waits for one EXECUTION_ID, not a filter's executions")
    app = load_app(app_spec, reachable(database_url)) if app_spec else plain_app(database_url)
    with opened(app) as app:
        if where is not None:
            _print_bulk(app.bulk("redrive", where, dry_run=dry_run, batch_size=batch_size),
                        as_json)
            return
        assert execution_id is not None
        eid = app.status(execution_id).id  # a unique prefix or tail names it too
        if dry_run:
            raise CliError("--dry-run counts a filter's executions; for one, `konduit status` "
                           "shows which steps did not succeed")
        rerun = app.redrive(eid)
        if not wait:
            if as_json:
                print(dump_json({"id": eid, "rerun": rerun}))
            else:
                console.print(f"redriving {eid}: re-running {', '.join(rerun)}")
            return
        result = _wait(app, eid, timeout)
    if as_json:
        print(dump_json({"id": eid, "rerun": rerun, "status": result.status}))
    else:
        console.print(f"redriving {eid}: re-running {', '.join(rerun)}")
        console.print(f"execution {eid}: {styled(result.status)}")
    if result.status != "succeeded":
        raise typer.Exit(EXIT_FAILED)


def repair(
    execution_id: Annotated[str, typer.Argument(
        metavar="EXECUTION_ID", help="The execution's id, or a unique start or end of it.")],
    app_spec: Annotated[str | None, app_option(
        "module:attribute of the konduit.App that defines the workflow (without it: the "
        "definition a worker registered; a workflow with map steps needs its code).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the repair to finish.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds --wait waits at most.")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the steps re-run (and with --wait the result) as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Re-run the degraded or failed branches of a finished execution and what depends on them.

    When it finishes, its output becomes a new version that replaces the degraded one; earlier
    versions stay visible (``status`` lists them). The workers serving the workflow do the
    re-running; the definition comes from --app, else from the database (as they registered
    it). Exit codes with --wait as for ``start --wait``: 0, 1 (not succeeded), 124 (--timeout
    passed).
    """
    app = load_app(app_spec, reachable(database_url)) if app_spec else plain_app(database_url)
    with opened(app) as app:
        eid = app.status(execution_id).id  # a unique prefix or tail names it too
        rerun = app.repair(eid)
        if not as_json:
            console.print(f"re-running {', '.join(rerun)} of {eid}")
        if not wait:
            if as_json:
                print(dump_json({"id": eid, "rerun": rerun}))
            return
        result = _wait(app, eid, timeout)
        versions = app.outputs(eid)
    if as_json:
        print(dump_json({"id": eid, "rerun": rerun, "status": result.status,
                         "output_versions": versions}))
        if result.status != "succeeded":
            raise typer.Exit(EXIT_FAILED)
        return
    console.print(f"execution {eid}: {styled(result.status)}")
    for version in versions:
        degraded = ", ".join(version.degraded) or "none degraded"
        console.print(f"  output v{version.version} ({version.status}, {degraded}): "
                      f"{dump_json(version.output)}", soft_wrap=True)
    if result.status != "succeeded":
        raise typer.Exit(EXIT_FAILED)


def stream(
    execution_id: Annotated[str, typer.Argument(
        metavar="EXECUTION_ID", help="The execution's id, or a unique start or end of it.")],
    name: Annotated[str | None, typer.Option(
        "--name", help=doc(StreamRequest, "name") + ".")] = None,
    from_offset: Annotated[int, typer.Option(
        "--from", min=0, metavar="N", help=doc(StreamRequest, "from_offset") + ".")] = 0,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Wait for the records still to come until the stream ends.")
    ] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="One JSON object per record and line (offset, kind, attempt, data).")
    ] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Print an execution's durable stream (ctx.stream, docs/streams.md) from an offset: one
    line per record, its offset first, and a line where a retried attempt started writing
    again. With --follow, records are printed as they are written until the stream ends; to
    resume, pass the last offset printed + 1 as --from."""
    with opened(plain_app(database_url)) as app:
        for chunk in app.stream(execution_id, name, from_offset=from_offset, follow=follow):
            if as_json:
                print(json.dumps(chunk.to_json(), ensure_ascii=False), flush=True)
            elif chunk.restart:
                console.print(f"{chunk.offset}  [yellow]-- attempt {chunk.attempt} started "
                              f"again here (after attempt {chunk.previous_attempt}) --[/yellow]")
            else:
                console.print(f"{chunk.offset}  {escape(json.dumps(chunk.data, ensure_ascii=False))}",
                              soft_wrap=True)


def dead_letters(
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print the dead letters as JSON.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List dead-lettered tasks: retries exhausted or a non-retryable error."""
    with opened(plain_app(database_url)) as app:
        rows = app.dead_letters(limit)
    if as_json:
        print(dump_json(rows))
        return
    if not rows:
        console.print("no dead letters")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for header in ("task", "execution", "workflow", "step", "attempts", "failed at", "error"):
        table.add_column(header)
    for r in rows:
        step = r.step + (f"[{r.map_index}]" if r.map_index else "")
        table.add_row(
            str(r.id), short_id(r.execution_id), escape(r.workflow_name), escape(step),
            str(r.attempt), stamp(r.finished_at),
            escape(last_line(r.error))[:80],
        )
    console.print(table)
