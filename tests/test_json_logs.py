"""``konduit worker --log-format json``: real worker processes, their stderr read line by line.

One execution has a retried step, a degraded branch and a step whose first attempt kills its
worker (the first worker process); a second worker reclaims it. Every retry, degradation and
reclaim must be logged exactly once, by the worker that did it, and every line must be a JSON
object naming the worker (and, inside an attempt, the attempt)."""

from __future__ import annotations

import importlib.util
import json
import logging
import signal
import subprocess
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from konduit import logs
from tests.test_cli import KONDUIT, _env

pytestmark = [pytest.mark.storage, pytest.mark.slow]

LOG_APP = '''
import asyncio
import logging
import os

import konduit

wf = konduit.Workflow("logged", version=1)
user = logging.getLogger("user-code")


@wf.step(retry=konduit.Retry(max_attempts=3, backoff="fixed", base="0.1s"))
def flaky(ctx):
    user.info("hello from flaky")
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return "ok"


@wf.step(deadline="0.5s", fallback=lambda ctx: "cached", required=False)
async def slow(ctx):
    await asyncio.sleep(10)


@wf.step(after=[flaky, slow], retry=konduit.Retry(max_attempts=3, backoff="fixed", base="0.1s"),
         join=konduit.Join.all_done())
def crash(ctx):
    if os.environ.get("LOG_TEST_KILLER") == "1":
        os._exit(1)  # the worker dies mid-attempt: another one must reclaim the task
    return "survived"


app = konduit.App([wf], database_url="postgresql://nobody@127.0.0.1:1/not_this_one")
'''


def _worker(app_dir: Path, db_url: str, log: Path, *, killer: bool) -> subprocess.Popen[bytes]:
    env = {**_env(), "KONDUIT_LOG_FORMAT": "json", "LOG_TEST_KILLER": "1" if killer else "0"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [*KONDUIT, "worker", "log_app:app", "--database-url", db_url, "-c", "4",
             "--poll-interval", "0.2", "--lease-seconds", "2", "--heartbeat-interval", "0.5",
             "--shutdown-grace", "5"],
            cwd=app_dir, env=env, stdout=subprocess.DEVNULL, stderr=out,
            stdin=subprocess.DEVNULL,
        )


def _lines(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line in {log.name}: {line!r}")
        assert isinstance(entry, dict), line
        out.append(entry)
    return out


def _count(lines: list[dict[str, Any]], text: str, step: str) -> int:
    return sum(1 for e in lines if text in e["message"] and e.get("step") == step)


def test_json_lines_and_each_retry_degradation_and_reclaim_logged_once(
    make_app, db_url: str, tmp_path: Path
) -> None:
    (tmp_path / "log_app.py").write_text(textwrap.dedent(LOG_APP))
    spec = importlib.util.spec_from_file_location("log_app_for_test", tmp_path / "log_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = make_app(module.wf)
    handle = app.start("logged")

    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _worker(tmp_path, db_url, first_log, killer=True)
    second = None
    try:
        assert first.wait(timeout=60) == 1, first_log.read_text()  # killed by its handler
        second = _worker(tmp_path, db_url, second_log, killer=False)
        result = handle.wait(timeout=60)
        assert result.outcomes == {"flaky": "succeeded", "slow": "degraded", "crash": "succeeded"}
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    assert second.returncode == 0, second_log.read_text()

    one, two = _lines(first_log), _lines(second_log)
    for lines in (one, two):
        assert lines
        workers = {e.get("worker") for e in lines}
        assert len(workers) == 1 and None not in workers, workers  # every line names its worker
        for e in lines:
            assert {"time", "level", "message", "logger"} <= e.keys(), e
            if "step" in e:
                assert e["execution_id"] == str(handle.id)
                assert {"map_index", "attempt"} <= e.keys(), e
    assert one[0]["worker"] != two[0]["worker"]
    assert any("konduit worker: logged" in e["message"] for e in one)  # the banner too

    both = one + two
    # The first worker retried flaky and degraded slow, once each, and nobody else did.
    assert _count(one, "retrying in", "flaky") == 1 and _count(two, "retrying in", "flaky") == 0
    assert _count(one, "degraded to its fallback", "slow") == 1
    assert _count(two, "degraded to its fallback", "slow") == 0
    # The second reclaimed crash once; that reclaim was a retry (its attempt counted).
    assert _count(two, "reclaimed task", "crash") == 1 and _count(one, "reclaimed task", "crash") == 0
    assert _count(both, "retrying in", "crash") == 1
    assert sum("reclaimed" in e["message"] for e in both) == 2  # the reclaim and its retry
    # The handler's own lines carry its attempt.
    hello = [e for e in one if e["message"] == "hello from flaky"]
    assert [(e["logger"], e["step"], e["attempt"], e["map_index"]) for e in hello] == [
        ("user-code", "flaky", 1, 0), ("user-code", "flaky", 2, 0)]


def test_text_stays_the_default_and_a_bad_format_is_one_clear_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*KONDUIT, "worker", "nope:app", "--log-format", "xml"], capture_output=True, text=True,
        env=_env(), timeout=60, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and "log format must be one of text, json" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_json_formatter_fields(capsys: pytest.CaptureFixture[str]) -> None:
    """Context fields are read on the logging thread, at the time of the call."""
    from konduit.worker.executor import Claimed

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "a %s", ("b",), None)
    logs.ContextFilter().filter(record)
    entry = json.loads(logs.JsonFormatter().format(record))
    assert entry["message"] == "a b" and entry["level"] == "WARNING" and "step" not in entry
    task = Claimed(id=1, execution_id=uuid.uuid4(), step="s", map_index=3, item=None,
                   attempt=2, max_attempts=3, lease_token=None, queue="default",
                   workflow_name="w", workflow_version=1, input=None)
    with logs.attempt_scope(task):
        inside = logging.LogRecord("x", logging.INFO, __file__, 1, "in", (), None)
        logs.ContextFilter().filter(inside)
    entry = json.loads(logs.JsonFormatter().format(inside))
    assert (entry["step"], entry["map_index"], entry["attempt"]) == ("s", 3, 2)
    assert entry["execution_id"] == str(task.execution_id)
