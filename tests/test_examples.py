"""Every script in examples/ runs to the end, as a user would run it: ``python examples/X.py`` in
a fresh process, on a real, empty, migrated database (``KONDUIT_DATABASE_URL``). Each script
checks its own results with asserts, so a wrong answer fails here as well as a crash."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
            "http_client.py"} <= names


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
