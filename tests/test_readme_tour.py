"""The README's code runs as written (issue 7, case 11): each block is extracted and run as its
own program, on this test's database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.storage]

README = Path(__file__).resolve().parent.parent / "README.md"


def python_block(section: str) -> str:
    """The first ```python block under the ``## section`` heading of the README."""
    text = README.read_text()
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    found = re.search(r"```python\n(.*?)```", text[start:end if end != -1 else None], re.S)
    assert found, f"no python block under '## {section}'"
    return found.group(1)


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("KONDUIT_DATABASE_URL", "KONDUIT_TEST_DATABASE_URL")}
    environment.update(env)
    return subprocess.run(args, cwd=cwd, env=environment, capture_output=True, text=True, timeout=180)


def test_the_five_minute_tour_runs_as_written(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "tour.py").write_text(python_block("A five-minute tour"))
    done = run([sys.executable, "tour.py"], tmp_path, KONDUIT_DATABASE_URL=db_url)
    assert done.returncode == 0, done.stderr[-3000:]
    status, published = done.stdout.splitlines()[0].split(" ", 1)
    assert status == "succeeded"
    assert published == "['caption', 'cover_image', 'summarise', 'translate']"
    assert done.stdout.splitlines()[1] == "False"  # cancel of a finished execution


def test_the_testing_example_passes_under_pytest(admin_url: str, tmp_path: Path) -> None:
    (tmp_path / "test_word_count.py").write_text(python_block("Testing your workflows"))
    done = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_word_count.py"],
               tmp_path, KONDUIT_TEST_DATABASE_URL=admin_url)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout


def test_the_operating_example_defines_and_prunes(db_url: str, tmp_path: Path) -> None:
    """The 'Operating it every night' block is a valid definition, and its App registers it
    (schedule, flow limit, hedge) and prunes with it on a real database."""
    block = python_block("Operating it every night")
    script = ("import konduit\n" + block + "\napp.migrate()\n"
              "print([s.name for s in wf.schedules], wf.spec['resize_image'].flow is not None,"
              " wf.spec['fetch_metadata'].hedge is not None, app.prune(older_than='30d'))\n"
              "app.close()\n")
    (tmp_path / "night.py").write_text(script)
    done = run([sys.executable, "night.py"], tmp_path, KONDUIT_DATABASE_URL=db_url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "['nightly'] True True 0"


def test_the_durable_waits_example_runs_as_written(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "review.py").write_text(python_block("Waiting for people, time and other workflows"))
    done = run([sys.executable, "review.py"], tmp_path, KONDUIT_DATABASE_URL=db_url)
    assert done.returncode == 0, done.stderr[-3000:]
    sent, output = done.stdout.splitlines()[:2]
    assert sent in ("stored", "woke")
    assert output == "{'text': {'by': 'ana', 'de': '...'}, 'reviewed': True}"
