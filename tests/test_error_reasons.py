"""Failures say why: the execution's error carries the cause, an old schema names the fix."""

from __future__ import annotations

import pytest

import konduit
from konduit.db.migrate import migrations
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage


def test_failed_execution_error_names_the_step_and_the_exception(make_app):
    wf = konduit.Workflow("card", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=1))
    def charge(ctx):
        raise RuntimeError("card declined: insufficient funds")

    @wf.step(after=[charge])
    def receipt(ctx):
        return "sent"

    app = make_app(wf)
    handle = app.start("card")
    with running_worker(app, concurrency=2), pytest.raises(konduit.ExecutionFailed) as info:
        handle.wait(timeout=15)
    error = info.value.result.error or ""
    assert "'charge' ended failed" in error
    assert "card declined: insufficient funds" in error


def test_start_against_an_unmigrated_server_names_the_command(empty_db_url):
    wf = konduit.Workflow("x", version=1)
    wf.step(name="only")(lambda ctx: 1)
    app = konduit.App([wf], database_url=empty_db_url)
    try:
        with pytest.raises(konduit.SchemaOutdated, match="konduit db migrate"):
            app.start("x")
        assert app.migrate() == [f"{m.version:04d}_{m.name}" for m in migrations()]
        assert app.start("x").id is not None
    finally:
        app.close()
