"""``konduit migrate-executions`` (a real subprocess) and ``POST /api/v1/executions/{id}/migrate`` (real
HTTP), on a real database: migrated, refused naming the step, and the token scope."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from konduit.bench.harness import LoopThread
from konduit.web import create_app, database_client
from konduit.web.security import Security, parse_tokens
from tests.support.browser import serving
from tests.support.migrating import register, run_ready, versioned
from tests.test_api_v1 import api, refused
from tests.test_cli import _env

pytestmark = pytest.mark.storage

V1 = {"a": [], "b": ["a"]}
V2 = {"a": [], "b": ["a"], "c": ["b"], "x": ["a"]}  # x starts at once once a has ended
V3 = {"b": []}  # a is gone
RO, OP = "ro-" + "r" * 20, "op-" + "o" * 20

MODULE = '''
from tests.support.migrating import versioned
import konduit
app = konduit.App([versioned(1, {v1}), versioned(2, {v2})])
'''


@pytest.fixture
def loop(db_url: str) -> Iterator[LoopThread]:
    thread = LoopThread(db_url)
    yield thread
    thread.close()


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = _env()
    root = Path(__file__).resolve().parent.parent
    # This checkout's sources first (not an installed konduit), then its tests, then the app.
    env["PYTHONPATH"] = f"{root / 'src'}:{root}" + (f":{cwd}" if cwd is not None else "")
    return subprocess.run([sys.executable, "-m", "konduit.cli", "migrate-executions", *args],
                          capture_output=True, text=True, env=env, timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def test_konduit_migrate_one_and_all_of_a_version(make_app, loop, db_url, tmp_path):
    app = make_app(versioned(1, V1), versioned(2, V2), versioned(3, V3))
    loop.run(register(loop.db, app.registry))
    ran = app.start("flow", version=1)
    loop.run(run_ready(loop.db, app.registry, only={"a"}))  # its a ran: x would start
    fresh = app.start("flow", version=1)  # a ready: x will wait for it
    # One execution, no code here: refused naming x, which would have to start now.
    proc = cli(str(ran.id), "--to", "2", "--database-url", db_url)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"refused {ran.id}" in proc.stdout and "step 'x' would start now" in proc.stdout
    # ... with an App that defines version 2 it migrates, and x is started.
    (tmp_path / "migr_app.py").write_text(textwrap.dedent(MODULE.format(v1=V1, v2=V2)))
    proc = cli(str(ran.id), "--to", "2", "--app", "migr_app:app", "--database-url", db_url,
               "--json", cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    [done] = json.loads(proc.stdout)
    assert done["migrated"] is True and done["started"] == ["x"] and done["to_version"] == 2
    assert done["execution_id"] == str(ran.id) and sorted(done["added"]) == ["c", "x"]
    # All of a version: v1 -> v3 refused for fresh (a is past and gone in v3).
    proc = cli("--workflow", "flow@1", "--to", "3", "--database-url", db_url)
    assert proc.returncode == 1
    assert f"refused {fresh.id}" in proc.stdout and "step 'a' has started" in proc.stdout
    proc = cli("--workflow", "flow@1", "--to", "2", "--database-url", db_url, "--json")
    assert proc.returncode == 0, proc.stderr
    [moved] = json.loads(proc.stdout)
    assert moved["execution_id"] == str(fresh.id) and moved["migrated"] is True
    assert moved["step"] is None and moved["reason"] is None
    assert app.status(fresh.id).version == 2
    proc = cli("--workflow", "flow@1", "--to", "2", "--database-url", db_url)
    assert proc.returncode == 0 and "no running executions of flow@1" in proc.stdout
    # Bad command lines: one clear line each.
    for args, needle in ((["--to", "2"], "either an EXECUTION_ID or --workflow"),
                         ([str(fresh.id)], "--to N is required"),
                         (["--workflow", "flow", "--to", "2"], "name@version")):
        proc = cli(*args, "--database-url", db_url)
        assert proc.returncode == 1 and needle in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_api_migrates_and_refuses_with_the_step(make_app, loop, db_url):
    app = make_app(versioned(1, V1), versioned(2, V2), versioned(3, V3))
    loop.run(register(loop.db, app.registry))
    handle = app.start("flow", version=1)
    with api(app, db_url) as http:
        url = f"/api/v1/executions/{handle.id}/migrate"
        body = refused(http.post(url, json={"to_version": 3}), 409)
        assert body["step"] == "a" and "step 'a' has started" in body["detail"]
        refused(http.post(url, json={"to_version": 0}), 422)
        refused(http.post(url, json={"to_version": 2, "extra": 1}), 422)
        refused(http.post(url, json={"to_version": 7}), 409, "body.to_version")
        refused(http.post("/api/v1/executions/00000000-0000-0000-0000-000000000000/migrate",
                          json={"to_version": 2}), 404)
        moved = http.post(url, json={"to_version": 2})
        assert moved.status_code == 200, moved.text
        out = moved.json()
        assert out["migrated"] is True and out["from_version"] == 1 and out["to_version"] == 2
        assert sorted(out["added"]) == ["c", "x"] and out["status"] == "running"
        assert http.post(url, json={"to_version": 2}).json()["migrated"] is False  # repeated
    for step in ("a", "b", "x"):  # x and b both wait on a; then c after b
        loop.run(run_ready(loop.db, app.registry, only={step}))
    loop.run(run_ready(loop.db, app.registry))
    result = handle.wait(timeout=10)
    assert result.version == 2 and result.output == {"c": "c", "x": "x"}


def test_api_migrate_needs_an_operator_token(make_app, db_url):
    app = make_app(versioned(1, V1), versioned(2, V2))
    handle = app.start("flow", version=1)
    security = Security(parse_tokens([f"ro:{RO}", f"op:{OP}"]))
    with serving(create_app(database_client(db_url, app), app, security=security)) as base, \
            httpx.Client(base_url=base, timeout=30) as http:
        url = f"/api/v1/executions/{handle.id}/migrate"
        assert http.post(url, json={"to_version": 2}).status_code == 401
        denied = http.post(url, json={"to_version": 2},
                           headers={"Authorization": f"Bearer {RO}"})
        assert denied.status_code == 403
        assert app.status(handle.id).version == 1
        ok = http.post(url, json={"to_version": 2}, headers={"Authorization": f"Bearer {OP}"})
        assert ok.status_code == 200 and ok.json()["migrated"] is True
