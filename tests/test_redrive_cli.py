"""``konduit redrive ID`` and ``konduit cancel|redrive --workflow X --status failed --since 1h
--tag k=v [--dry-run]``: without --app (the registered definition), with counts, and bad
input refused in one line naming the option."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import konduit
from tests.support.workers import running_worker
from tests.test_bulk import payments, start_failed
from tests.test_cli_faces import assert_clean_error, konduit_cli


def test_redrive_one_and_many_from_the_command_line(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    healthy = {"on": False}
    app = make_app(payments(healthy))
    one = app.start("bulk-pay", {"n": 1}).id
    with running_worker(app, concurrency=4), pytest.raises(konduit.ExecutionFailed):
        app.wait(one, timeout=30)
    many = start_failed(app, 25, {"cohort": "c1"})
    healthy["on"] = True

    proc = konduit_cli("redrive", str(one)[-12:], "--json", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"id": str(one), "rerun": ["charge", "notify"]}
    again = konduit_cli("redrive", str(one), "--database-url", db_url)
    assert_clean_error(again, f"execution {one} is running", "can be redriven")

    dry = konduit_cli("redrive", "--workflow", "bulk-pay", "--status", "failed", "--since",
                      "1h", "--tag", "cohort=c1", "--dry-run", "--database-url", db_url)
    assert dry.returncode == 0, dry.stderr
    assert "dry run: 25 of 25 matching execution(s) would be redriven" in dry.stdout
    assert {app.status(e).status for e in many} == {"failed"}
    done = konduit_cli("redrive", "--workflow", "bulk-pay", "--status", "failed", "--since",
                       "1h", "--tag", "cohort=c1", "--batch-size", "10", "--json",
                       "--database-url", db_url)
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert (counts["matched"], counts["done"], counts["batches"], counts["skipped"]) == \
        (25, 25, 3, {})
    assert sorted(counts["ids"]) == sorted(map(str, many))
    with running_worker(app, concurrency=8):
        for eid in [one, *many]:
            assert app.wait(eid, timeout=30).status == "succeeded"

    # cancel by filter: the running ones are cancelled, the finished ones skipped by status.
    running = [app.start("bulk-pay", {"n": i}, tags={"cohort": "c2"}).id for i in range(4)]
    start_failed(app, 2, {"cohort": "c2"})
    cancel = konduit_cli("cancel", "--tag", "cohort=c2", "--reason", "bulk stop",
                         "--database-url", db_url)
    assert cancel.returncode == 0, cancel.stderr
    assert "cancelled 4 of 6 matching execution(s)" in cancel.stdout
    assert "skipped 2: failed" in cancel.stdout
    assert {(app.status(e).status, app.status(e).error) for e in running} == {
        ("cancelled", "bulk stop")}


def test_bad_bulk_commands_are_one_line_naming_the_fault(db_url: str) -> None:
    assert_clean_error(konduit_cli("redrive", "--database-url", db_url),
                       "give an EXECUTION_ID, or a filter")
    assert_clean_error(konduit_cli("cancel", "0190abcd", "--status", "running",
                                   "--database-url", db_url),
                       "not both", "--status")
    assert_clean_error(konduit_cli("redrive", "--since", "yesterday-ish",
                                   "--database-url", db_url), "since")
    assert_clean_error(konduit_cli("redrive", "--tag", "novalue", "--database-url", db_url),
                       "novalue")
    assert_clean_error(konduit_cli("redrive", "--status", "failed", "--wait",
                                   "--database-url", db_url), "--wait waits for one")
