"""Schema migrations are safe under running workers of the previous release (docs/production.md,
"Upgrades"): a rolling upgrade runs ``konduit db migrate`` while the old workers keep working,
then replaces them one by one.

The previous release's code is this repository at :data:`PREVIOUS` (the commit before this
release's migrations), extracted with ``git archive`` into a temporary folder. Its own
``konduit db migrate`` sets up a fresh database, its worker process (``PYTHONPATH`` on the old
sources) starts serving executions, and while a first batch is in flight the current code
migrates the database to the latest schema. The old worker must finish that batch and serve a
second one started by the current code, with retries, a map and a fan-in, and nothing it writes
may be refused by the new schema. Skipped, saying so, where git or the commit is unavailable (a
source archive); CI runs from a clone of main, where it is."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import konduit
from konduit.db.migrate import latest_version
from tests.support.workers import ROOT, stop_workers

pytestmark = [pytest.mark.storage, pytest.mark.slow]

PREVIOUS = "0750f2d"
"""The previous release: main before migration 0022 and later (schema version 21)."""

APP = '''
import logging
import os

import konduit

wf = konduit.Workflow("rolling", version=1)
log = logging.getLogger("rolling")


@wf.step(retry=konduit.Retry(max_attempts=3, backoff="fixed", base="0.1s"))
def split(ctx):
    log.warning("split attempt %s", ctx.attempt)
    if ctx.attempt == 1 and ctx.input.get("flaky"):
        raise RuntimeError("the first attempt fails")
    return list(range(ctx.input.get("items", 3)))


@wf.map(after=[split], over=lambda items: items)
def square(ctx):
    import time
    time.sleep(ctx.input.get("pause", 0))
    return ctx.item * ctx.item


@wf.step(after=[split])
def where(ctx):
    return os.path.dirname(konduit.__file__)  # which code ran the handler


@wf.step(after=[square, where])
def total(ctx):
    return {"sum": sum(ctx.upstream["square"]), "code": ctx.upstream["where"]}


app = konduit.App([wf], database_url=os.environ["ROLLING_DATABASE_URL"])
'''

STARTER = '''
import json, sys
from rolling_app import app
ids = [str(app.start("rolling", input=json.loads(arg)).id) for arg in sys.argv[1:]]
print(json.dumps(ids))
'''


def previous_release(tmp_path: Path) -> Path:
    """The previous release's ``src`` folder, extracted from git; skips when it cannot be."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is missing: the previous release cannot be extracted")
    found = subprocess.run([git, "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], cwd=ROOT,
                           capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} (the previous release) is not in this checkout")
    archive = tmp_path / "previous.tar"
    subprocess.run([git, "archive", "--format=tar", "-o", str(archive), PREVIOUS, "src"],
                   cwd=ROOT, check=True, capture_output=True)
    target = tmp_path / "previous"
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target / "src"


def old_environment(old_src: Path, app_dir: Path, db_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": os.pathsep.join([str(old_src), str(app_dir)]),
            "ROLLING_DATABASE_URL": db_url, "PYTHONDONTWRITEBYTECODE": "1"}


def old(args: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


BAD = ("Traceback", "ERROR", "UndefinedColumn", "violates")
"""What the old worker must never log (the new schema refusing what it writes)."""


def wait_all(app: konduit.App, ids: list[Any], log: Path, timeout: float = 90) -> None:
    """Wait for every execution to succeed, failing at once if the old worker logs an error
    (a write the new schema refuses would otherwise only show as a timeout)."""
    deadline = time.monotonic() + timeout
    pending = list(ids)
    while pending:
        text = log.read_text()
        assert not any(bad in text for bad in BAD), text
        assert time.monotonic() < deadline, (pending, text)
        results = [app.status(eid) for eid in pending]
        for r in results:
            assert r.status in ("pending", "running", "succeeded"), (r, text)
        pending = [r.id for r in results if r.status != "succeeded"]
        time.sleep(0.2)


def schema_version(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT max(version) FROM konduit_schema_version").fetchone()
    assert row is not None
    return int(row[0])


def test_the_new_schema_serves_a_worker_of_the_previous_release(
        tmp_path: Path, empty_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old_src = previous_release(tmp_path)
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "rolling_app.py").write_text(textwrap.dedent(APP))
    (app_dir / "start_rolling.py").write_text(textwrap.dedent(STARTER))
    env = old_environment(old_src, app_dir, empty_db_url)

    # The previous release sets the database up (its own migrations) and runs its worker.
    old(["-m", "konduit.cli", "db", "migrate", "--database-url", empty_db_url], env, app_dir)
    before = schema_version(empty_db_url)
    assert before < latest_version()
    log = tmp_path / "old-worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "konduit.cli", "worker", "rolling_app:app", "--database-url",
             empty_db_url, "--concurrency", "4", "--poll-interval", "0.2", "--log-level",
             "WARNING"], env=env, cwd=app_dir, stdout=out, stderr=subprocess.STDOUT)
    try:
        # A first batch in flight (each map item pauses) while the current code migrates.
        first = json.loads(old(["start_rolling.py", *[json.dumps(
            {"items": 4, "pause": 0.3, "flaky": i == 0}) for i in range(3)]], env, app_dir))
        time.sleep(0.5)
        assert worker.poll() is None, log.read_text()
        # The same definitions, in the current code (a new release's client starting them).
        monkeypatch.setenv("ROLLING_DATABASE_URL", empty_db_url)
        wf = runpy.run_path(str(app_dir / "rolling_app.py"))["wf"]
        with konduit.App([wf], database_url=empty_db_url) as current:
            applied = current.migrate()
            assert applied, "the current code had no migration to apply"
            assert schema_version(empty_db_url) == latest_version()
            # A second batch, started by the current code on the new schema.
            second = [current.start("rolling", {"items": 5, "flaky": i == 1}).id
                      for i in range(3)]
            wait_all(current, [*first, *second], log)
            outputs = [current.status(eid).output for eid in [*first, *second]]
        assert [o["sum"] for o in outputs] == [14] * 3 + [30] * 3
        # Every handler ran in the old release's code, not in this checkout's.
        assert {o["code"] for o in outputs} == {str(old_src / "konduit")}, outputs
        assert worker.poll() is None, log.read_text()
    finally:
        stop_workers([worker])
    assert worker.returncode == 0, log.read_text()
    text = log.read_text()
    assert not any(bad in text for bad in BAD), text
