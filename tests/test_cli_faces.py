"""What the command line can do that the Python faces can: `konduit start --fair-key
--deadline-at`, `konduit repair` and `konduit plan` by name without --app, plain usage lines,
and `konduit migrate-executions` apart from `konduit db migrate`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

import konduit
from tests.support.workers import ROOT, running_worker, worker_environment

CLI = [sys.executable, "-m", "konduit.cli"]


def konduit_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = worker_environment(COLUMNS="200")  # this checkout's sources, as the workers get
    env.pop("KONDUIT_DATABASE_URL", None)
    env.pop("KONDUIT_APP", None)
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd or ROOT,
                          env=env, timeout=120, stdin=subprocess.DEVNULL)


def assert_clean_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1, \
        proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def fair_workflow() -> konduit.Workflow:
    wf = konduit.Workflow("cli-faces-fair", version=1)

    @wf.step()
    def work(ctx):  # type: ignore[no-untyped-def]
        return ctx.input

    return wf


def row(db_url: str, execution_id: str) -> tuple[str | None, datetime | None]:
    with psycopg.connect(db_url) as conn:
        found = conn.execute("SELECT fair_key, deadline_at FROM konduit_executions WHERE id = %s",
                             (execution_id,)).fetchone()
    assert found is not None
    return found[0], found[1]


# -- konduit start --fair-key --deadline-at ------------------------------------------------------


@pytest.mark.storage
def test_start_takes_a_fair_key_and_a_deadline_by_name(make_app: Callable[..., konduit.App],
                                                       db_url: str) -> None:
    app = make_app(fair_workflow())
    app.start("cli-faces-fair", {"customer": "registers"})  # registers the definition
    common = ("--database-url", db_url)

    proc = konduit_cli("start", "cli-faces-fair", "--input", '{"customer": "acme"}',
                       "--fair-key", "big-tenant", "--deadline-at", "2031-01-02T06:00+01:00",
                       *common)
    assert proc.returncode == 0, proc.stderr
    fair, deadline = row(db_url, proc.stdout.strip())
    assert fair == "big-tenant"
    assert deadline == datetime(2031, 1, 2, 5, 0, tzinfo=UTC)

    # Z for UTC; without --fair-key, no key (the workflow has no fair_by), as App.start does.
    proc = konduit_cli("start", "cli-faces-fair", "--input", '{"customer": "acme"}',
                       "--deadline-at", "2031-01-02T05:00:00Z", *common)
    assert proc.returncode == 0, proc.stderr
    assert row(db_url, proc.stdout.strip()) == (None, datetime(2031, 1, 2, 5, 0, tzinfo=UTC))
    assert app.start("cli-faces-fair", {}, fair_key="big-tenant").status().status in (
        "pending", "running")  # the Python face takes the same


@pytest.mark.storage
def test_a_deadline_without_a_zone_or_unreadable_is_one_line_naming_the_option(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    make_app(fair_workflow()).start("cli-faces-fair", {"customer": "registers"})
    before = _count(db_url)
    for value, needle in (("2031-01-02T06:00", "give its zone"),
                          ("tomorrow at six", "not an ISO 8601 date-time")):
        proc = konduit_cli("start", "cli-faces-fair", "--input", '{"customer": "a"}',
                           "--deadline-at", value, "--database-url", db_url)
        assert_clean_error(proc, "--deadline-at", repr(value), needle)
    assert _count(db_url) == before  # nothing started


def _count(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        found = conn.execute("SELECT count(*) FROM konduit_executions").fetchone()
    assert found is not None
    return int(found[0])


# -- konduit repair and konduit plan without --app -----------------------------------------------


@pytest.mark.storage
@pytest.mark.slow
def test_repair_without_app_by_the_registered_definition(make_app: Callable[..., konduit.App],
                                                         db_url: str) -> None:
    """As `konduit start` without --app: the CLI plans the re-run from the definition a worker
    registered, and the worker that has the code runs it."""
    from tests.apps import api_app

    api_app.HEALED.clear()
    app = make_app(*api_app.WORKFLOWS)
    try:
        with running_worker(app, poll_interval=0.05):
            first = app.start("api-flow", {"fail": True}).wait(timeout=60)
            assert first.outcomes["flaky"] == "failed"
            api_app.HEALED.set()
            proc = konduit_cli("repair", str(first.id)[:13], "--json", "--wait", "--timeout",
                               "60", "--database-url", db_url)
            assert proc.returncode == 0, (proc.stdout, proc.stderr)
            data = json.loads(proc.stdout)
            assert sorted(data["rerun"]) == ["end", "flaky"] and data["status"] == "succeeded"
            assert data["output_versions"][-1]["output"] == ["fine", "flaky"]
    finally:
        api_app.HEALED.clear()


@pytest.mark.storage
def test_repair_without_app_of_a_map_workflow_says_it_needs_the_code(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    from tests.apps import typed_app

    app = make_app(typed_app.fan)
    with running_worker(app):
        done = app.start("typed-map").wait(timeout=60)
    assert_clean_error(konduit_cli("repair", str(done.id), "--database-url", db_url),
                       "needs its code", "konduit repair --app")


@pytest.mark.storage
def test_plan_without_app_by_the_registered_definition(make_app: Callable[..., konduit.App],
                                                       db_url: str, tmp_path: Path) -> None:
    wf = konduit.Workflow("cli-faces-plan", version=1)

    @wf.step()
    def fetch(ctx):  # type: ignore[no-untyped-def]
        return 1

    @wf.step(after=[fetch], deadline="20s")
    def slow(ctx):  # type: ignore[no-untyped-def]
        return 2

    @wf.step(after=[fetch])
    def quick(ctx):  # type: ignore[no-untyped-def]
        return 3

    @wf.step(after=[slow, quick])
    def join(ctx):  # type: ignore[no-untyped-def]
        return 4

    app = make_app(wf)
    with running_worker(app):
        app.start("cli-faces-plan").wait(timeout=60)
    proc = konduit_cli("plan", "cli-faces-plan", "--within", "1h", "--json",
                       "--database-url", db_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["workflow"] == "cli-faces-plan" and data["version"] == 1
    assert {s["step"] for s in data["steps"]} == {"fetch", "slow", "quick", "join"}
    assert data["verdict"] == "safe"
    assert "slow" in data["budgets"]
    # The text form too, and an unknown name names the registered ones.
    text = konduit_cli("plan", "cli-faces-plan", "--database-url", db_url, cwd=tmp_path)
    assert text.returncode == 0 and "join" in text.stdout, text.stderr
    assert_clean_error(konduit_cli("plan", "no-such-flow", "--database-url", db_url,
                                   cwd=tmp_path), "unknown workflow 'no-such-flow'",
                       "cli-faces-plan")


# -- usage lines, and the two migrates ------------------------------------------------------------


def _every_command_path() -> list[list[str]]:
    from konduit.cli import COMMANDS, HIDDEN_ALIASES

    return [[g, n] if g else [n] for g, n, _, _ in COMMANDS] + [[a] for a in HIDDEN_ALIASES] \
        + [[], ["db"], ["embedded"]]


def test_usage_lines_have_no_braces() -> None:
    """Typer writes a required argument as {EXECUTION_ID} in the usage line; konduit writes
    EXECUTION_ID (and [WORKFLOW] when it may be left out), as git and pip do."""
    usage = {
        " ".join(path): konduit_cli(*path, "--help").stdout.splitlines()[0]
        for path in (["start"], ["repair"], ["plan"], ["stats"], ["migrate-executions"],
                     ["db", "migrate"], [])
    }
    assert usage["start"] == "Usage: konduit start [OPTIONS] WORKFLOW"
    assert usage["repair"] == "Usage: konduit repair [OPTIONS] EXECUTION_ID"
    assert usage["stats"] == "Usage: konduit stats [OPTIONS] [WORKFLOW]"
    assert usage["migrate-executions"] == \
        "Usage: konduit migrate-executions [OPTIONS] [EXECUTION_ID]"
    for line in usage.values():
        assert "{" not in line and "}" not in line, line


def test_every_usage_line_is_plain(capsys: pytest.CaptureFixture[str]) -> None:
    from konduit.cli import command_tree

    for path in _every_command_path():
        try:
            command_tree().main(args=[*path, "--help"], prog_name="konduit",
                                standalone_mode=False)
        except SystemExit:
            pass
        out = capsys.readouterr().out
        first = out.splitlines()[0]
        assert first.startswith("Usage: konduit"), (path, out)
        assert "{" not in first and "}" not in first, first


def test_the_two_migrates_say_what_the_other_does() -> None:
    overview = konduit_cli("--help").stdout
    assert "migrate-executions" in overview
    assert "\n  migrate " not in overview  # the old name is hidden...
    executions = konduit_cli("migrate-executions", "--help").stdout
    schema = konduit_cli("db", "migrate", "--help").stdout
    assert "konduit db migrate" in " ".join(executions.split())
    assert "not the database schema" in " ".join(executions.split())
    assert "konduit migrate-executions" in " ".join(schema.split())
    assert "not your executions" in " ".join(schema.split())
    old = konduit_cli("migrate", "--help")  # ... and still works
    assert old.returncode == 0 and "The old name of `konduit migrate-executions`" in old.stdout
    assert "--to N" in old.stdout and "--workflow NAME@VERSION" in old.stdout


def test_the_old_migrate_spelling_runs_the_same_command() -> None:
    for name in ("migrate", "migrate-executions"):
        proc = konduit_cli(name, "--workflow", "x@1")
        assert_clean_error(proc, "--to N is required")

