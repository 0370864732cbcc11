"""``konduit list --json``, ``konduit dead-letters --json`` and the exit codes of
``konduit start --wait`` (0 succeeded, 1 failed/timed out/cancelled, 124 --timeout passed), run
for real in subprocesses against this test's database."""

from __future__ import annotations

import importlib.util
import json
import textwrap
import uuid
from pathlib import Path
from types import ModuleType

import pytest

import konduit
from tests.support.workers import running_worker
from tests.test_cli import konduit_cli

pytestmark = pytest.mark.storage

WAIT_APP = '''
import konduit

ok = konduit.Workflow("wait-ok", version=1)


@ok.step()
def fine(ctx):
    return {"fine": True}


bad = konduit.Workflow("wait-bad", version=1)


@bad.step()
def broken(ctx):
    raise konduit.NonRetryableError("the input is corrupt")


app = konduit.App([ok, bad], database_url="postgresql://nobody@127.0.0.1:1/not_this_one")
'''


@pytest.fixture
def wait_app(tmp_path: Path) -> tuple[Path, ModuleType]:
    (tmp_path / "wait_app.py").write_text(textwrap.dedent(WAIT_APP))
    spec = importlib.util.spec_from_file_location("wait_app_for_test", tmp_path / "wait_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tmp_path, module


def test_start_wait_exit_codes(wait_app: tuple[Path, ModuleType], make_app, db_url: str) -> None:
    app_dir, module = wait_app
    common = ("--app", "wait_app:app", "--database-url", db_url)

    # No worker runs: --timeout passes with the execution still running.
    proc = konduit_cli("start", "wait-ok", "--wait", "--timeout", "0.5", *common, cwd=app_dir)
    assert proc.returncode == 124, (proc.stdout, proc.stderr)
    assert uuid.UUID(proc.stdout.strip())
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

    app = make_app(module.ok, module.bad)
    with running_worker(app, concurrency=2):
        proc = konduit_cli("start", "wait-ok", "--wait", "--timeout", "30", *common, cwd=app_dir)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert json.loads("\n".join(lines[1:])) == {"fine": True}

        proc = konduit_cli("start", "wait-bad", "--wait", "--timeout", "30", *common, cwd=app_dir)
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        eid = proc.stdout.strip()
        assert app.status(eid).status == "failed"
        assert "failed" in proc.stderr and "the input is corrupt" in proc.stderr
        assert "Traceback" not in proc.stderr

    # A bad command line is click's usage error.
    proc = konduit_cli("start", "wait-ok", "--wait", "--timeout", "soon", *common, cwd=app_dir)
    assert proc.returncode == 2

    proc = konduit_cli("start", "--help")
    assert "124" in proc.stdout


def test_list_json(make_app, db_url: str) -> None:
    wf = konduit.Workflow("cli-json", version=1)

    @wf.step()
    def only(ctx):  # type: ignore[no-untyped-def]
        return ctx.input

    app = make_app(wf)
    proc = konduit_cli("list", "--json", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []

    done = app.start("cli-json", 1)
    with running_worker(app, concurrency=1):
        done.wait(timeout=30)
    running = app.start("cli-json", 2)
    proc = konduit_cli("list", "--json", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["id"], r["status"]) for r in rows] == [(str(running.id), "running"),
                                                      (str(done.id), "succeeded")]
    assert rows[0]["workflow"] == "cli-json" and rows[0]["version"] == 1
    assert rows[0]["finished_at"] is None and rows[0]["took_seconds"] is None
    assert rows[1]["took_seconds"] >= 0 and rows[1]["error"] is None

    proc = konduit_cli("list", "--json", "--status", "succeeded", "--database-url", db_url)
    assert [r["id"] for r in json.loads(proc.stdout)] == [str(done.id)]


def test_dead_letters_json(make_app, db_url: str) -> None:
    wf = konduit.Workflow("cli-json-doomed", version=1)

    @wf.step()
    def doomed(ctx):  # type: ignore[no-untyped-def]
        raise konduit.NonRetryableError("the source file is corrupt")

    app = make_app(wf)
    proc = konduit_cli("dead-letters", "--json", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []

    handle = app.start("cli-json-doomed")
    with running_worker(app, concurrency=1), pytest.raises(konduit.ExecutionFailed):
        handle.wait(timeout=30)
    proc = konduit_cli("dead-letters", "--json", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)
    assert row["execution_id"] == str(handle.id)
    assert row["step"] == "doomed" and row["workflow_name"] == "cli-json-doomed"
    assert "the source file is corrupt" in row["error"]
