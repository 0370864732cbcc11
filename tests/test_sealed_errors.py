"""Error texts and attempt logs under a payload codec (docs/payload-codecs.md), on a real
database and a real worker: a handler's exception message, its traceback and what it logged
carry its payloads' data (``ValueError(f"bad customer {email}")``), so under an encrypting codec
none of it is left in plaintext anywhere in the database, while every door (the App's reads,
``konduit status``, the HTTP API, the dashboard's page) shows it opened with the key and as
"encrypted (key k1)" without it."""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest

import konduit
from konduit.codecs import Encrypted
from konduit.db.sealing import PayloadIO

pytestmark = [pytest.mark.storage]

MARK = "leaky-customer-4b1d@example.com"
K1 = os.urandom(32)


def flow() -> konduit.Workflow:
    wf = konduit.Workflow("sealed-errors", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base=0.05))
    def charge(ctx: konduit.Context) -> Any:
        email = ctx.input["email"]
        logging.getLogger("shop").warning("charging %s", email)
        ctx.log(f"card of {email} declined")
        raise ValueError(f"bad customer {email}")

    @wf.step(after=[charge])
    def receipt(ctx: konduit.Context) -> Any:
        return ctx.upstream["charge"]

    return wf


def _failed(app: konduit.App, worker: Callable[..., Any]) -> konduit.ExecutionResult:
    with worker(app):
        handle = app.start("sealed-errors", input={"email": MARK})
        with pytest.raises(konduit.ExecutionFailed) as failed:
            handle.wait(timeout=60)
    return failed.value.result


def plaintext_rows(db_url: str, needle: str) -> dict[str, int]:
    """The konduit tables (every column of every row, as text) that hold ``needle``."""
    found = {}
    with psycopg.connect(db_url) as conn:
        tables = [t for (t,) in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') "
            "AND c.relname LIKE 'konduit%%' AND NOT c.relispartition")]
        for table in tables:
            (n,) = conn.execute(f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s",
                                (f"%{needle}%",)).fetchone() or (0,)
            if n:
                found[table] = n
    return found


def _cli_status(db_url: str, eid: str, keys: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KONDUIT_")}
    env["COLUMNS"] = "200"
    if keys is not None:
        env["KONDUIT_CODEC_KEYS"] = keys
    proc = subprocess.run([sys.executable, "-m", "konduit.cli", "status", eid, "--database-url",
                           db_url], capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _reads(app: konduit.App, eid: str) -> str:
    """Every error text and log line the App's reads give for ``eid``, as one text."""
    status = app.status(eid)
    texts = [status.error or ""]
    texts += [t.error or "" for t in app.tasks(eid)]
    texts += [d.error or "" for d in app.dead_letters() if str(d.execution_id) == eid]
    texts += [r.get("message", "") for log in app.attempt_logs(eid) for r in log.records]
    return "\n".join(texts)


def test_error_texts_and_logs_are_sealed_and_shown_opened_at_every_door(
        make_app: Callable[..., konduit.App], worker: Callable[..., Any], db_url: str) -> None:
    from konduit.web import create_app, database_client
    from tests.support.browser import serving

    app = make_app(flow(), codec=Encrypted(keys={"k1": K1}))
    result = _failed(app, worker)

    # Nothing in the database holds the marker: not the attempts' errors, the task's, the
    # execution's ("upstream 'charge' ended failed: ..."), nor the attempt logs.
    assert plaintext_rows(db_url, MARK) == {}
    assert plaintext_rows(db_url, "bad customer") == {}
    with psycopg.connect(db_url) as conn:
        errors = [e for (e,) in conn.execute(
            "SELECT error FROM konduit_attempts WHERE error IS NOT NULL")]
        logs = conn.execute("SELECT count(*) FROM konduit_attempt_logs").fetchone()
    assert len(errors) == 2 and all(e.startswith('{"$konduit":"sealed"') for e in errors)
    assert logs == (2,)

    # Opened through every door of a process with the key...
    assert f"bad customer {MARK}" in (result.error or "")
    shown = _reads(app, str(result.id))
    assert shown.count(f"bad customer {MARK}") >= 3  # execution, task, dead letter
    assert f"charging {MARK}" in shown and f"card of {MARK} declined" in shown
    assert "$konduit" not in shown and "encrypted" not in shown
    keys = "k1:" + base64.b64encode(K1).decode()
    assert f"bad customer {MARK}" in _cli_status(db_url, str(result.id), keys)

    # ... and as "encrypted (key k1)" in one without it, never the envelope.
    keyless = konduit.App([], database_url=db_url, codec=None)
    keyless.payload_io = PayloadIO()  # no codec, whatever the environment says
    try:
        hidden = _reads(keyless, str(result.id))
        assert MARK not in hidden and "$konduit" not in hidden
        assert hidden.count("encrypted (key k1)") >= 5  # errors and both attempts' logs
        cli = _cli_status(db_url, str(result.id), None)
        # (the output, a payload, is shown as its envelope's JSON by the CLI, as before)
        assert MARK not in cli and "error: encrypted (key k1)" in cli

        for face, opened in ((app, True), (keyless, False)):
            with serving(create_app(database_client(db_url, face), face)) as base, \
                    httpx.Client(base_url=base, timeout=30) as http:
                body = http.get(f"/api/v1/executions/{result.id}").json()
                page = http.get(f"/executions/{result.id}").text
                logs_body = http.get(f"/api/v1/executions/{result.id}/logs")
            # (the API shows a payload it cannot open as its envelope, as before: its input)
            if opened:
                assert f"bad customer {MARK}" in body["error"]
                assert f"bad customer {MARK}" in page and "encrypted (key" not in page
            else:
                assert body["error"] == "encrypted (key k1)"
                assert MARK not in str(body) and '{"$konduit"' not in str(body)
                assert MARK not in page and "$konduit" not in page
                assert "encrypted (key k1)" in page
            assert logs_body.status_code == 200
            assert (MARK in logs_body.text) is opened
            assert ("encrypted (key k1)" in logs_body.text) is not opened
    finally:
        keyless.close()


def test_without_a_codec_error_texts_stay_plain(
        make_app: Callable[..., konduit.App], worker: Callable[..., Any], db_url: str) -> None:
    """The control: without a codec the texts are stored as they are (and the scan above finds
    them), so the scan is able to fail."""
    app = make_app(flow(), codec=None)
    app.payload_io = PayloadIO()
    result = _failed(app, worker)
    found = plaintext_rows(db_url, MARK)
    assert {"konduit_attempts", "konduit_tasks", "konduit_executions",
            "konduit_attempt_logs"} <= set(found), found
    assert f"bad customer {MARK}" in (result.error or "")


def test_a_text_that_only_looks_like_an_envelope_is_read_as_it_is() -> None:
    io = PayloadIO(Encrypted(keys={"k1": K1}))
    sealed = io.seal_text(f"bad customer {MARK}")
    assert MARK not in sealed and io.open_text(sealed) == f"bad customer {MARK}"
    assert io.open_text('{"$konduit":"sealed", not json') == '{"$konduit":"sealed", not json'
    assert io.open_text("plain") == "plain"
    keyless = PayloadIO().open_text(sealed)
    assert keyless == "encrypted (key k1)"
    # Written back by a process without the key, it stays the envelope it was.
    assert io.seal_text(keyless) == sealed
    assert PayloadIO().seal_text("plain") == "plain"


def test_every_statement_that_writes_an_error_text_seals_it() -> None:
    """A statement that sets an error column from a parameter names it on its ``-- sealed:``
    line: one that did not would store a handler's message in plaintext under a codec."""
    import re

    from konduit.db.queries import all_queries

    written = re.compile(r"\b(?:error|auto_repair_error)\s*=\s*%\((\w+)\)s|%\((errors)\)s")
    unsealed = {}
    for name, query in all_queries().items():
        params = {a or b for a, b in written.findall(query.sql)}
        if params - query.sealed_texts:
            unsealed[name] = sorted(params - query.sealed_texts)
    assert unsealed == {}
    assert len([q for q in all_queries().values() if q.sealed_texts]) >= 14
