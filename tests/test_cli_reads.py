"""The command line reads like its peers': one line per command in the overview, options
named rather than typed, one error style for usage errors too, JSON input from a file or
standard input, ``--json`` on every command that prints a result, tables within 80 columns,
``konduit db reset`` and ``konduit embedded status|stop``. Real subprocesses, real database."""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import psycopg
import pytest

import konduit
from konduit.cli import COMMANDS
from tests.support.payloads import opened_rows
from tests.test_cli import KONDUIT

APP = '''
import konduit

wf = konduit.Workflow("cli-reads", version=1)


@wf.step()
def greet(ctx):
    return f"hello, {ctx.input['name']}"


app = konduit.App([wf])
'''


def run(*args: str, cwd: Path | None = None, columns: int = 80, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("KONDUIT_DATABASE_URL", "KONDUIT_APP")}
    environment["COLUMNS"] = str(columns)
    environment.update(env or {})
    return subprocess.run([*KONDUIT, *args], capture_output=True, text=True, cwd=cwd,
                          env=environment, timeout=120, input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "reads_app.py").write_text(textwrap.dedent(APP))
    return tmp_path


def commands_section(help_text: str) -> list[str]:
    lines = help_text.splitlines()
    start = lines.index("Commands:") + 1
    return [line for line in lines[start:] if line.strip()]


def test_the_overview_gives_each_command_one_line_within_80_columns() -> None:
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    section = commands_section(proc.stdout)
    names = [line.split()[0] for line in section]
    top_level = [name for group, name, _, _ in COMMANDS if not group]
    assert names[:len(top_level)] == top_level
    assert set(names) >= {"db", "embedded"}
    for line in section:
        assert line.startswith("  ") and not line.startswith("    "), \
            f"a command's summary wraps onto a second line: {line!r}"
        assert len(line) <= 80, line
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80


def every_command() -> list[list[str]]:
    found: list[list[str]] = []
    for group, name, _, _ in COMMANDS:
        found.append([group, name] if group else [name])
    return found


@pytest.mark.parametrize("words", every_command(), ids=" ".join)
def test_each_commands_help_names_its_values_and_fits_80_columns(words: list[str]) -> None:
    proc = run(*words, "--help")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "<bool>" not in text and "<str>" not in text and "<int>" not in text, text
    assert "<float>" not in text
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, wide


def test_usage_errors_are_one_red_error_line_naming_the_choices() -> None:
    for args, needles in (
        (["list", "--status", "bogus"], ["--status", "running", "succeeded"]),
        (["list", "--limit", "0"], ["--limit"]),
        (["no-such-command"], ["no-such-command"]),
        (["webhooks", "--status", "lost"], ["delivered", "refused"]),
    ):
        proc = run(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        first, *rest = proc.stderr.strip().splitlines()
        assert first.startswith("error: "), proc.stderr
        assert all(needle in first for needle in needles), first
        assert rest == [] or (len(rest) == 1 and rest[0].startswith("(see konduit")), rest
        assert "Usage:" not in proc.stderr


@pytest.mark.storage
def test_start_reads_its_input_from_a_file_or_standard_input_and_answers_json(
        db_url: str, app_dir: Path) -> None:
    (app_dir / "input.json").write_text('{"name": "file"}')
    common = ("--app", "reads_app:app", "--database-url", db_url)
    from_file = run("start", "cli-reads", "--input", "@input.json", "--json", *common,
                    cwd=app_dir)
    assert from_file.returncode == 0, from_file.stderr
    from_stdin = run("start", "cli-reads", "--input", "-", "--json", *common, cwd=app_dir,
                     stdin='{"name": "stdin"}')
    assert from_stdin.returncode == 0, from_stdin.stderr
    ids = [json.loads(p.stdout)["id"] for p in (from_file, from_stdin)]
    with psycopg.connect(db_url) as conn:
        inputs = dict(opened_rows(conn.execute("SELECT id::text, input FROM konduit_executions")
                                  .fetchall()))
    assert inputs == {ids[0]: {"name": "file"}, ids[1]: {"name": "stdin"}}

    missing = run("start", "cli-reads", "--input", "@nope.json", *common, cwd=app_dir)
    assert missing.returncode == 1 and missing.stderr.startswith("error: --input @nope.json")
    broken = run("start", "cli-reads", "--input", "-", *common, cwd=app_dir, stdin="{oops")
    assert broken.returncode == 1 and "not valid JSON" in broken.stderr

    cancelled = run("cancel", ids[0], "--json", "--database-url", db_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout) == {"id": ids[0], "cancelled": True,
                                            "status": "cancelled"}
    again = json.loads(run("cancel", ids[0], "--json", "--database-url", db_url).stdout)
    assert again["cancelled"] is False and again["status"] == "cancelled"

    sent = run("send-event", "doc-approved", "--key", "doc-9", "--payload", "-", "--json",
               "--database-url", db_url, stdin='{"ok": true}')
    assert sent.returncode == 3, sent.stderr  # nothing waits and nothing could: not kept
    assert json.loads(sent.stdout) == {"event": "doc-approved", "key": "doc-9",
                                       "result": "no match"}


@pytest.mark.storage
def test_tables_fit_80_columns_and_piped_output_is_not_wrapped(db_url: str) -> None:
    wf = konduit.Workflow("a-workflow-with-a-rather-long-name-for-a-table", version=3)

    @wf.step()
    def only(ctx):  # type: ignore[no-untyped-def]
        return 1

    with konduit.App([wf], database_url=db_url) as app:
        first = app.start(wf.name, {})
        for _ in range(4):
            app.start(wf.name, {})
    for args in (["list"], ["status", str(first.id)], ["workers"], ["dead-letters"],
                 ["schedules"], ["alerts"], ["webhooks"]):
        proc = run(*args, "--database-url", db_url)
        assert proc.returncode in (0, 3), (args, proc.stderr)
        # Tables, not sentences: a hint or an error is one line to copy, wrapped by the terminal.
        wide = [line for line in proc.stdout.splitlines()
                if len(line) > 80 and not line.startswith(("hint:", "error:"))]
        assert not wide, (args, wide)
    # Piped with no COLUMNS: rows are not folded at 80 columns, so `| grep` sees whole rows.
    environment = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run([*KONDUIT, "list", "--database-url", db_url], capture_output=True,
                           text=True, env=environment, timeout=60, stdin=subprocess.DEVNULL)
    rows = [line for line in piped.stdout.splitlines() if wf.name in line]
    assert len(rows) == 5, piped.stdout


@pytest.mark.storage
def test_db_reset_needs_yes_then_leaves_a_current_empty_schema(db_url: str) -> None:
    wf = konduit.Workflow("to-be-reset", version=1)

    @wf.step()
    def only(ctx):  # type: ignore[no-untyped-def]
        return 1

    with konduit.App([wf], database_url=db_url) as app:
        app.start(wf.name, {})
    refused = run("db", "reset", "--database-url", db_url)
    assert refused.returncode == 1 and "--yes" in refused.stderr
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM konduit_executions").fetchone() == (1,)
    done = run("db", "reset", "--yes", "--database-url", db_url)
    assert done.returncode == 0, done.stderr
    # The line wraps at 80 columns where the socket path's length puts it (KONDUIT_HOME).
    assert re.search(r"schema\s+is\s+at\s+version\s+\d+", done.stdout)
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM konduit_executions").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM konduit_workflows").fetchone() == (0,)
    from konduit.db.migrate import latest_version

    with psycopg.connect(db_url) as conn:
        version = conn.execute("SELECT max(version) FROM konduit_schema_version").fetchone()
    assert version == (latest_version(),)


def test_embedded_status_and_stop_on_a_server_that_is_not_there(tmp_path: Path) -> None:
    env = {"KONDUIT_HOME": str(tmp_path)}
    status = run("embedded", "status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    found = json.loads(status.stdout)
    assert found["running"] is False and found["initialised"] is False
    assert found["data_directory"].startswith(str(tmp_path))
    assert not any(tmp_path.iterdir()), "status must not start a server"
    stop = run("embedded", "stop", env=env)
    assert stop.returncode == 0 and "was not running" in stop.stdout


def test_embedded_status_of_the_running_server() -> None:
    from konduit.db.embedded import server_url

    if os.environ.get("KONDUIT_TEST_DATABASE_URL"):
        pytest.skip("the tests use another server; the embedded one may not run")
    # Started with its default database, whose URL the status gives (a new machine has only
    # `postgres` until something asks for the default one).
    server_url()
    found = json.loads(run("embedded", "status", "--json").stdout)
    assert found["running"] is True and isinstance(found["port"], int)
    with psycopg.connect(found["url"], connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
