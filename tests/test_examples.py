"""Every script in examples/ runs to the end, as a user would run it: ``python examples/X.py`` in
a fresh process, with ``KONDUIT_DATABASE_URL`` naming a real, empty, migrated database. Each
script checks its own results with asserts, so a wrong answer fails here as well as a crash. The
scripts run in a database of their own on that server (``konduit_examples``), and the one the
URL names stays empty."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from konduit.databases import EXAMPLES_DATABASE
from konduit.db.embedded import with_database

pytestmark = [pytest.mark.storage]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Seconds each takes on a quiet 2-core machine is a few; the fan-out runs a shrunk catalogue
# here (KONDUIT_EXAMPLE_ITEMS) and is slow all the same: thousands of tasks.
SLOW = {"fan_out_100k.py"}
ENV = {"fan_out_100k.py": {"KONDUIT_EXAMPLE_ITEMS": "5000"}}


def scripts() -> list[Path]:
    return sorted(EXAMPLES.glob("*.py"))


def test_the_examples_are_there() -> None:
    names = {path.name for path in scripts()}
    assert {"content_pipeline.py", "human_approval.py", "nightly_schedule.py", "fan_out_100k.py",
            "http_client.py", "durable_agent.py"} <= names


@pytest.mark.parametrize("script", scripts(), ids=lambda path: path.name)
def test_each_example_has_a_docstring_saying_what_it_shows(script: Path) -> None:
    docstring = ast.get_docstring(ast.parse(script.read_text()))
    assert docstring and len(docstring.split()) >= 20, f"{script.name}: say what it shows and how to run it"
    assert f"python examples/{script.name}" in docstring, f"{script.name}: say how to run it"


@pytest.mark.parametrize(
    "script",
    [pytest.param(path, marks=[pytest.mark.slow] if path.name in SLOW else []) for path in scripts()],
    ids=lambda path: path.name)
def test_the_example_runs(script: Path, db_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KONDUIT_DATABASE_URL", "KONDUIT_TEST_DATABASE_URL", "KONDUIT_APP")}
    env.update(KONDUIT_DATABASE_URL=db_url, **ENV.get(script.name, {}))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"{script.name} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}")
    assert done.stdout.strip(), f"{script.name} printed nothing"
    with psycopg.connect(db_url) as conn:  # the user's database: untouched
        assert conn.execute("SELECT count(*) FROM konduit_executions").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM konduit_workflows").fetchone() == (0,)
    with psycopg.connect(with_database(db_url, EXAMPLES_DATABASE)) as conn:
        names = {row[0] for row in conn.execute("SELECT DISTINCT workflow_name FROM konduit_executions")}
    assert names, f"{script.name} started nothing in {EXAMPLES_DATABASE}"


def test_an_example_runs_again_on_its_database(db_url: str, tmp_path: Path) -> None:
    """The examples' database outlives a run: a second run finds the first one's executions
    and stored events, and passes all the same."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KONDUIT_DATABASE_URL", "KONDUIT_TEST_DATABASE_URL", "KONDUIT_APP")}
    env.update(KONDUIT_DATABASE_URL=db_url)
    for _ in range(2):
        done = subprocess.run([sys.executable, str(EXAMPLES / "human_approval.py")], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
