"""The ``konduit`` command line, run for real in subprocesses against this test's database."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import konduit
from konduit.core.ids import short_id
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage

_script = shutil.which("konduit", path=str(Path(sys.executable).parent)) or shutil.which("konduit")
KONDUIT = [_script] if _script else [sys.executable, "-m", "konduit.cli"]

# A module for `konduit worker` / `konduit start`, imported from the current directory. Its App
# names a database that does not exist: the CLI's --database-url must win.
CLI_APP = '''
import konduit

wf = konduit.Workflow("cli-hello", version=1)


@wf.step()
def greet(ctx):
    return f"hello, {ctx.input['name']}"


@wf.step(after=[greet])
def shout(ctx):
    return ctx.upstream["greet"].upper()


@wf.step(after=[greet])
async def count(ctx):
    return len(ctx.upstream["greet"])


@wf.step(after=[shout, count])
def publish(ctx):
    return {"text": ctx.upstream["shout"], "length": ctx.upstream["count"]}


app = konduit.App([wf], database_url="postgresql://nobody@127.0.0.1:1/not_this_one")
'''


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KONDUIT_DATABASE_URL", None)
    env.pop("KONDUIT_APP", None)
    env["COLUMNS"] = "200"  # wide enough that Rich never shortens an id
    return env


def konduit_cli(*args: str, cwd: Path | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KONDUIT, *args], capture_output=True, text=True, cwd=cwd,
                          env=_env(), timeout=timeout, stdin=subprocess.DEVNULL)


def assert_clean_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 1, one line on stderr naming the problem, no traceback."""
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr


def _diamond() -> konduit.Workflow:
    wf = konduit.Workflow("cli-diamond", version=1)

    @wf.step()
    def fetch(ctx):  # type: ignore[no-untyped-def]
        return ctx.input

    @wf.step(after=[fetch])
    def fast(ctx):  # type: ignore[no-untyped-def]
        return "fast"

    @wf.step(after=[fetch])
    def slow(ctx):  # type: ignore[no-untyped-def]
        time.sleep(0.3)
        return "slow"

    @wf.step(after=[fast, slow])
    def join(ctx):  # type: ignore[no-untyped-def]
        return sorted(ctx.upstream.values())

    return wf


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "cli_app.py").write_text(textwrap.dedent(CLI_APP))
    return tmp_path


def test_version_and_help() -> None:
    proc = konduit_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"konduit {konduit.__version__}"
    proc = konduit_cli("--help")
    assert proc.returncode == 0
    for command in ("worker", "start", "status", "list", "cancel", "dead-letters", "demo", "db"):
        assert command in proc.stdout


def test_python_dash_m_works_too() -> None:
    proc = subprocess.run([sys.executable, "-m", "konduit.cli", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"konduit {konduit.__version__}"


def test_db_migrate_on_a_migrated_database_is_a_no_op(db_url: str) -> None:
    proc = konduit_cli("db", "migrate", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert "already current" in proc.stdout
    assert "applied" not in proc.stdout


def test_an_unmigrated_database_says_which_command_fixes_it(empty_db_url: str) -> None:
    assert_clean_error(konduit_cli("list", "--database-url", empty_db_url),
                       "konduit db migrate --database-url URL")
    proc = konduit_cli("db", "migrate", "--database-url", empty_db_url)
    assert proc.returncode == 0, proc.stderr
    assert "applied 0001_" in proc.stdout
    proc = konduit_cli("list", "--database-url", empty_db_url)
    assert proc.returncode == 0, proc.stderr
    assert "no executions" in proc.stdout


def test_a_database_with_a_migration_missing_below_its_newest_is_refused(
        empty_db_url: str) -> None:
    """`konduit db migrate`, App.migrate() and `konduit health` refuse a database that recorded
    a later migration and not an earlier one, naming it, and apply nothing."""
    import psycopg

    from konduit.db.migrate import migrations

    assert konduit_cli("db", "migrate", "--database-url", empty_db_url).returncode == 0
    gap = migrations()[-2]
    name = f"{gap.version:04d}_{gap.name}.sql"

    def recorded() -> list[tuple[int, str]]:
        with psycopg.connect(empty_db_url) as c:
            return c.execute("SELECT version, name FROM konduit_schema_version "
                             "ORDER BY version").fetchall()

    with psycopg.connect(empty_db_url, autocommit=True) as c:
        c.execute("DELETE FROM konduit_schema_version WHERE version = %s", (gap.version,))
    before = recorded()
    assert_clean_error(konduit_cli("db", "migrate", "--database-url", empty_db_url),
                       f"never applied {name}", "konduit db reset --yes")
    with pytest.raises(konduit.SchemaGap) as refused, \
            konduit.App([], database_url=empty_db_url) as app:
        app.migrate()
    assert refused.value.files == (name,)
    assert_clean_error(konduit_cli("health", "--database-url", empty_db_url),
                       f"never applied {name}")
    assert recorded() == before


def test_a_database_a_newer_konduit_migrated_is_accepted_and_said(
        empty_db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """`konduit db migrate` and App.migrate() accept a database with migrations this konduit
    does not have (a rolling upgrade: a newer konduit migrated it) and name them, rather than
    calling it current; `konduit health` passes with a note naming them."""
    import logging

    import psycopg

    from konduit.db.migrate import latest_version

    assert konduit_cli("db", "migrate", "--database-url", empty_db_url).returncode == 0
    newer = latest_version() + 1
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        c.execute("INSERT INTO konduit_schema_version (version, name) VALUES (%s, %s)",
                  (newer, "from_a_newer_release"))
    said = f"migrations this konduit does not know: {newer:04d}_from_a_newer_release"

    proc = konduit_cli("db", "migrate", "--database-url", empty_db_url)
    assert proc.returncode == 0, proc.stderr
    assert "already current" not in proc.stdout
    assert f"schema is at version {newer}, newer than this konduit's {latest_version()}" \
        in proc.stdout
    assert said in proc.stdout
    assert said not in proc.stderr  # said once

    caplog.set_level(logging.WARNING, logger="konduit.db.migrate")
    with konduit.App([], database_url=empty_db_url) as app:
        assert app.migrate() == []
    assert any(said in r.getMessage() for r in caplog.records if r.name == "konduit.db.migrate")

    proc = konduit_cli("health", "--database-url", empty_db_url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: ")
    assert f"note: the database has {said}" in proc.stdout


def test_another_migration_under_one_of_this_konduits_numbers_is_refused(
        empty_db_url: str) -> None:
    """`konduit db migrate`, App.migrate() and `konduit health` refuse a database that recorded
    another name under one of this konduit's numbers, naming both."""
    import psycopg

    from konduit.db.migrate import migrations

    assert konduit_cli("db", "migrate", "--database-url", empty_db_url).returncode == 0
    last = migrations()[-1]
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        c.execute("UPDATE konduit_schema_version SET name = 'a_branchs_migration' "
                  "WHERE version = %s", (last.version,))
    said = (f"recorded migration {last.version:04d} as a_branchs_migration, where this konduit "
            f"has {last.version:04d}_{last.name}.sql")
    assert_clean_error(konduit_cli("db", "migrate", "--database-url", empty_db_url), said,
                       f"SET name = '{last.name}'")
    with pytest.raises(konduit.SchemaConflict) as refused, \
            konduit.App([], database_url=empty_db_url) as app:
        app.migrate()
    assert refused.value.recorded == ("a_branchs_migration",)
    assert_clean_error(konduit_cli("health", "--database-url", empty_db_url), said)


def test_list_and_status_of_running_and_finished_executions(make_app, db_url: str) -> None:
    app = make_app(_diamond())
    first = app.start("cli-diamond", {"n": 1}).id
    second = app.start("cli-diamond", {"n": 2}).id

    proc = konduit_cli("list", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    # The table shows each id's random tail (--json the whole id).
    assert short_id(first) in proc.stdout and short_id(second) in proc.stdout
    assert proc.stdout.index(short_id(second)) < proc.stdout.index(short_id(first))  # newest first
    assert "running" in proc.stdout

    proc = konduit_cli("status", str(first), "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert "running" in proc.stdout and "fetch" in proc.stdout

    with running_worker(app, concurrency=4):
        app.wait(first, timeout=30)
        app.wait(second, timeout=30)

    proc = konduit_cli("status", str(first), "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "succeeded" in out
    assert '"fast"' in out and '"slow"' in out  # the output
    for header in ("step", "tries", "fired", "ended", "fan-in", "straggler"):
        assert header in out
    join_row = next(line for line in out.splitlines() if line.strip().startswith("join"))
    assert "slow" in join_row  # the straggler of the join

    proc = konduit_cli("status", str(first), "--json", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["status"] == "succeeded"
    assert data["output"] == ["fast", "slow"]
    assert data["outcomes"]["join"] == "succeeded"

    proc = konduit_cli("list", "--status", "succeeded", "--limit", "1", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert short_id(second) in proc.stdout and short_id(first) not in proc.stdout
    proc = konduit_cli("list", "--workflow", "no-such-workflow", "--database-url", db_url)
    assert proc.returncode == 0
    assert "no executions" in proc.stdout


def test_cancel(make_app, db_url: str) -> None:
    app = make_app(_diamond())
    eid = app.start("cli-diamond", {}).id
    proc = konduit_cli("cancel", str(eid), "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert f"cancelled {eid}" in proc.stdout
    assert app.status(eid).status == "cancelled"

    proc = konduit_cli("cancel", str(eid), "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert "already finished" in proc.stdout


def test_unknown_execution_is_one_clear_line(db_url: str) -> None:
    missing = str(uuid.uuid4())
    for command in ("status", "cancel"):
        assert_clean_error(konduit_cli(command, missing, "--database-url", db_url),
                           f"no execution with id {missing}")
    assert_clean_error(konduit_cli("status", "not-an-id", "--database-url", db_url),
                       "not an execution id")


def test_unreachable_database_is_one_clear_line() -> None:
    began = time.monotonic()
    proc = konduit_cli("list", "--database-url", "postgresql://nobody@127.0.0.1:1/nothing")
    assert_clean_error(proc, "cannot connect to database nothing on 127.0.0.1:1")
    assert time.monotonic() - began < 20  # no half-minute pool retries


def test_start_and_worker_from_a_module_in_the_current_directory(app_dir: Path,
                                                                db_url: str) -> None:
    common = ("--app", "cli_app:app", "--database-url", db_url)
    proc = konduit_cli("start", "cli-hello", "--input", '{"name": "ada"}',
                       "--idempotency-key", "nightly-1", *common, cwd=app_dir)
    assert proc.returncode == 0, proc.stderr
    eid = proc.stdout.strip()
    assert uuid.UUID(eid)
    again = konduit_cli("start", "cli-hello", "--input", '{"name": "ada"}',
                        "--idempotency-key", "nightly-1", *common, cwd=app_dir)
    assert again.stdout.strip() == eid  # same key, same execution

    log = (app_dir / "worker.log").open("w")
    worker = subprocess.Popen(
        [*KONDUIT, "worker", "cli_app:app", "--database-url", db_url, "-c", "2", "-q", "default",
         "--poll-interval", "0.2", "--shutdown-grace", "5"],
        cwd=app_dir, env=_env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    try:
        proc = konduit_cli("start", "cli-hello", "--input", '{"name": "grace"}', "--wait",
                           "--timeout", "30", *common, cwd=app_dir)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert uuid.UUID(lines[0])
        assert json.loads("\n".join(lines[1:])) == {"text": "HELLO, GRACE", "length": 12}

        status = json.loads(konduit_cli("status", eid, "--json", "--database-url", db_url).stdout)
        assert status["status"] == "succeeded"  # the first one ran too
        assert status["output"] == {"text": "HELLO, ADA", "length": 10}
    finally:
        worker.send_signal(signal.SIGINT)
        try:
            code = worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
            log.close()
    output = (app_dir / "worker.log").read_text()
    assert code == 0, output
    assert "konduit worker: cli-hello on database" in output
    assert "worker stopped after" in output
    assert "Traceback" not in output


def test_start_errors_are_one_clear_line(app_dir: Path, db_url: str) -> None:
    common = ("--database-url", db_url)
    assert_clean_error(konduit_cli("start", "cli-hello", "--app", "cli_app:app", "--input", "{nope",
                                   *common, cwd=app_dir), "--input is not valid JSON")
    assert_clean_error(konduit_cli("start", "cli-hello", "--app", "no_such_module:app", *common,
                                   cwd=app_dir), "cannot import module 'no_such_module'")
    assert_clean_error(konduit_cli("start", "cli-hello", "--app", "cli_app:nothing", *common,
                                   cwd=app_dir), "has no attribute 'nothing'")
    assert_clean_error(konduit_cli("start", "cli-hello", "--app", "cli_app", *common,
                                   cwd=app_dir), "module:attribute")
    assert_clean_error(konduit_cli("start", "no-such-flow", "--app", "cli_app:app", *common,
                                   cwd=app_dir), "unknown workflow 'no-such-flow'", "cli-hello")
    assert_clean_error(konduit_cli("worker", "no_such_module:app", *common, cwd=app_dir),
                       "cannot import module")


def test_dead_letters(make_app, db_url: str) -> None:
    wf = konduit.Workflow("cli-doomed", version=1)

    @wf.step()
    def doomed(ctx):  # type: ignore[no-untyped-def]
        raise konduit.NonRetryableError("the source file is corrupt")

    app = make_app(wf)
    proc = konduit_cli("dead-letters", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert "no dead letters" in proc.stdout

    eid = app.start("cli-doomed", {}).id
    with running_worker(app, concurrency=2), pytest.raises(konduit.ExecutionFailed):
        app.wait(eid, timeout=5)  # a working engine ends it in well under a second
    proc = konduit_cli("dead-letters", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert short_id(eid) in proc.stdout
    assert "doomed" in proc.stdout
    assert "the source file is corrupt" in proc.stdout


def test_demo_runs_to_success(db_url: str) -> None:
    proc = konduit_cli("demo", "--executions", "2", "--database-url", db_url, timeout=120)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "2/2 succeeded" in proc.stdout
    assert "fan-in wait" in proc.stdout and "straggler" in proc.stdout
    for branch in ("summarise", "translate", "cover_image", "captions", "schedule"):
        assert branch in proc.stdout


def test_the_maintenance_interval_comes_from_the_flag_or_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from konduit.worker.config import WorkerConfig

    monkeypatch.setenv("KONDUIT_MAINTENANCE_INTERVAL", "0.25")
    assert WorkerConfig().maintenance_interval == 0.25
    with pytest.raises(ValueError, match="maintenance_interval must be > 0"):
        WorkerConfig(maintenance_interval=0)
    bad = konduit_cli("worker", "tests.apps.waits_app:app", "--maintenance-interval", "0")
    assert bad.returncode == 2 and "--maintenance-interval" in bad.stderr
