"""The worker's listener and its webhook sender under faults: whatever a call inside the loop
raises (``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``, a ``BaseException`` of its
own, a plain error) ends that call only. The loop is not ended, nor is the event loop it runs
on (asyncio re-raises a ``KeyboardInterrupt`` or ``SystemExit`` that escapes a task out of
``run_forever``: in a worker, that is the worker). The fault is logged, or recorded with the
delivery, and a later notification or delivery still goes through. The loop's own cancellation
still ends it, also when it comes as another error, as a driver turns a cancelled statement
into one (the re-raise).

Each loop runs alone on a loop of the test's, on a real database; the faults are injected
where the loop calls out: a notification's callback, the connection it listens on, the HTTP
call, the claim and the record of a delivery. Waits are on events and rows, with bounds far
above the machine's noise: a bound only turns a wedged loop into a failure instead of a hang.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import pytest

import konduit
from konduit.core.webhooks import DELIVERY_HEADER
from konduit.db.connect import open_database
from konduit.db.database import Database
from konduit.engine.alerting import AlertChange, alert_changed
from konduit.engine.webhooks import register
from konduit.errors import DatabaseUnavailable
from konduit.records import AlertRecord
from konduit.worker.listener import listen
from konduit.worker.webhook_http import Response
from konduit.worker.webhook_sender import WebhookSender

pytestmark = [pytest.mark.storage]

T = TypeVar("T")

BOUND = 30.0
"""Seconds a wait may take before the loop is called wedged: far above any noise."""


class Hostile(BaseException):
    """A BaseException of the code's own, neither an Exception nor an interrupt."""


RAISED: dict[str, Callable[[], BaseException]] = {
    "KeyboardInterrupt": lambda: KeyboardInterrupt("injected"),
    "SystemExit": lambda: SystemExit(3),
    "GeneratorExit": lambda: GeneratorExit("injected"),
    "Hostile": lambda: Hostile("injected"),
    "RuntimeError": lambda: RuntimeError("injected"),
}


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main())`` on a thread of its own. What escapes the event loop itself (a
    ``KeyboardInterrupt`` out of ``run_forever``) fails the test, instead of ending the test
    session as a Ctrl-C would."""
    out: dict[str, Any] = {}

    def go() -> None:
        try:
            out["value"] = asyncio.run(main())
        except BaseException as exc:  # what ended the loop is the point
            out["error"] = exc

    thread = threading.Thread(target=go, name="loop-faults", daemon=True)
    thread.start()
    thread.join(BOUND * 4)
    assert not thread.is_alive(), "the test's event loop did not end"
    error = out.get("error")
    if isinstance(error, Exception):
        raise error
    if error is not None:
        raise AssertionError(f"{type(error).__name__} escaped a task and ended the event loop "
                             "(in a worker: the worker)") from error
    return out["value"]  # type: ignore[no-any-return]


async def until_set(event: asyncio.Event, loop_task: asyncio.Task[Any], what: str) -> None:
    """Wait for ``event``; fail at once if ``loop_task`` (the loop under test) ended instead."""
    waiting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiting, loop_task}, timeout=BOUND,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    if loop_task.done():
        raise AssertionError(f"the loop ended, waiting for {what}: "
                             f"{'cancelled' if loop_task.cancelled() else loop_task.exception()!r}")
    assert event.is_set(), f"timed out after {BOUND} s waiting for {what}"


async def stop(loop_task: asyncio.Task[Any]) -> None:
    """Cancel the loop: it must end, and as cancelled (no error of its own)."""
    loop_task.cancel()
    done, _ = await asyncio.wait({loop_task}, timeout=BOUND)
    assert done, "the loop did not end when cancelled"
    assert loop_task.cancelled(), loop_task.exception()


async def notify(db_url: str, *notes: tuple[str, str]) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        for channel, payload in notes:
            await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def held(method: str, query: str, entered: threading.Event) -> Callable[..., Awaitable[Any]]:
    """A ``Database.<method>`` whose call of ``query`` is held in a real statement (60 s
    long); cancelled, it fails as the driver fails a statement whose connection was closed
    under it: DatabaseUnavailable, not CancelledError."""
    original = getattr(Database, method)

    async def patched(self: Database, name: str, /, **params: Any) -> Any:
        if name == query:
            await hold_in_a_statement(self, entered)
        return await original(self, name, **params)

    return patched


async def hold_in_a_statement(db: Database, entered: threading.Event) -> None:
    entered.set()
    try:
        async with db.connection() as conn:
            await conn.execute("SELECT pg_sleep(60)")
    except asyncio.CancelledError as exc:
        raise DatabaseUnavailable("database unavailable: the connection was closed under "
                                  "the statement") from exc


def logged(caplog: pytest.LogCaptureFixture, logger: str, needle: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and needle in r.getMessage()]


# -- the listener ---------------------------------------------------------------------------------

class Listening:
    """A listener on ``db`` (queue ``q``) whose callbacks the test watches: ``listening`` is set
    each time it has connected and listens (its ``deadline()`` re-read is called then)."""

    def __init__(self, db: Database, stopped: Callable[[str], None]):
        self.listening = asyncio.Event()
        self.ready = asyncio.Event()
        self.connections = 0

        def deadline() -> None:
            self.connections += 1
            self.listening.set()

        self.task = asyncio.create_task(listen(
            db, queues={"q"}, hedged=False, ready=self.ready.set, stopped=stopped,
            outrun=lambda token: None, deadline=deadline), name="konduit-listen")


@pytest.mark.parametrize("raised", list(RAISED))
def test_what_a_notifications_callback_raises_ends_that_call_only(
        db_url: str, caplog: pytest.LogCaptureFixture, raised: str) -> None:
    """The callback of a ``konduit_stopped`` notification raises: the next notification, sent
    right after it, is acted on, on the same connection (none is lost to a reconnect)."""
    caplog.set_level(logging.ERROR, logger="konduit.worker.listener")
    calls: list[str] = []

    def stopped(execution_id: str) -> None:
        calls.append(execution_id)
        raise RAISED[raised]()

    async def main() -> int:
        db = await open_database(db_url, max_size=1)
        try:
            listener = Listening(db, stopped)
            try:
                await until_set(listener.listening, listener.task, "the listener to listen")
                await notify(db_url, ("konduit_stopped", "e-1"), ("konduit_ready", "q"))
                await until_set(listener.ready, listener.task, "the ready notification")
                assert calls == ["e-1"]
                return listener.connections
            finally:
                await stop(listener.task)
        finally:
            await db.close()

    assert run(main) == 1  # listened on, not reconnected
    (record,) = logged(caplog, "konduit.worker.listener", "konduit_stopped notification")
    assert raised in record.getMessage() and record.exc_info is not None


@pytest.mark.parametrize("raised", list(RAISED))
def test_what_connecting_raises_is_logged_and_the_listener_listens_again(
        db_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
        raised: str) -> None:
    """The listener's connection fails to open with anything (the environment's code: the
    driver, DNS, TLS): it connects again a second later and acts on what comes then."""
    caplog.set_level(logging.DEBUG, logger="konduit.worker.listener")
    original = Database.listen_connection
    attempts = [0]

    async def failing_once(self: Database) -> Any:
        attempts[0] += 1
        if attempts[0] == 1:
            raise RAISED[raised]()
        return await original(self)

    monkeypatch.setattr(Database, "listen_connection", failing_once)

    async def main() -> None:
        db = await open_database(db_url, max_size=1)
        try:
            listener = Listening(db, lambda execution_id: None)
            try:
                await until_set(listener.listening, listener.task, "the listener to listen")
                await notify(db_url, ("konduit_ready", "q"))
                await until_set(listener.ready, listener.task, "the ready notification")
            finally:
                await stop(listener.task)
        finally:
            await db.close()

    run(main)
    assert attempts[0] == 2
    said = logged(caplog, "konduit.worker.listener", "polling until it is back")
    assert len(said) == 1
    if raised == "RuntimeError":
        assert said[0].levelno == logging.DEBUG and "injected" in said[0].getMessage()
    else:
        assert said[0].levelno == logging.ERROR and raised in said[0].getMessage()
        assert said[0].exc_info is not None


def test_a_listener_stopped_while_connecting_ends(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its stop comes as the connection is being made, and reaches it as another error (the
    driver's, for a connection closed under it): the listener ends, it does not log a lost
    connection and connect again (the worker would wait for it forever)."""
    entered = threading.Event()
    connecting = [0]

    async def held_connecting(self: Database) -> Any:
        connecting[0] += 1
        await hold_in_a_statement(self, entered)
        raise AssertionError("the held statement returned")

    monkeypatch.setattr(Database, "listen_connection", held_connecting)

    async def main() -> None:
        db = await open_database(db_url, max_size=2)
        try:
            listener = Listening(db, lambda execution_id: None)
            while not entered.is_set():
                await asyncio.sleep(0.02)
            listener.task.cancel()
            done, _ = await asyncio.wait({listener.task}, timeout=BOUND)
            assert done, f"the listener did not end when stopped ({connecting[0]} connections)"
            assert listener.task.cancelled() or isinstance(listener.task.exception(),
                                                           DatabaseUnavailable)
        finally:
            await db.close()

    run(main)
    assert connecting[0] == 1


# -- the webhook sender ---------------------------------------------------------------------------

SECRET = "s3cret-for-tests"
HOOK = konduit.Webhook("https://hooks.example.com/k", events=("alert.raised",), secret=SECRET,
                       timeout=0.1)  # a delivery whose record failed is leased 5.3 s


async def raise_alert(db: Database, alert_id: int) -> None:
    """One more delivery in the outbox (an alert.raised event)."""
    now = datetime.now(UTC)
    alert = AlertRecord(id=alert_id, kind="no_success", subject="hooked", workflow="hooked",
                        severity="warning", message="no success", details={},
                        raised_at=now, last_seen_at=now)
    async with db.transaction() as tx:
        await alert_changed(tx, AlertChange("raised", alert))


async def delivery(db: Database, alert_id: int) -> dict[str, Any] | None:
    async with db.connection() as conn:
        found = await conn.execute(
            "SELECT status, attempts, last_error FROM konduit_webhook_deliveries "
            "WHERE (body->>'alert_id')::int = %s", (alert_id,))
        return await found.fetchone()


async def delivered(db: Database, alert_id: int, sender: asyncio.Task[None]) -> dict[str, Any]:
    """The delivery of the alert once delivered; fails at once if the sender ended."""
    for _ in range(int(BOUND / 0.05)):
        assert not sender.done(), (
            f"the sender ended: {'cancelled' if sender.cancelled() else sender.exception()!r}")
        row = await delivery(db, alert_id)
        if row is not None and row["status"] == "delivered":
            return row
        await asyncio.sleep(0.05)
    raise AssertionError(f"alert {alert_id}'s delivery never delivered: {row}")


class Posts:
    """The sender's HTTP call (run on its threads): the deliveries it was given, in order; it
    raises what ``fault`` makes on the first, answers 200 to the others."""

    def __init__(self, fault: Callable[[], BaseException] | None = None):
        self.fault = fault
        self.sent: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, hook: konduit.Webhook, body: bytes, headers: dict[str, str]) -> Response:
        with self.lock:
            self.sent.append(headers[DELIVERY_HEADER])
            first = len(self.sent) == 1
        if first and self.fault is not None:
            raise self.fault()
        return Response(200, "OK")


def sending(db_url: str, posts: Posts,
            test: Callable[[Database, asyncio.Task[None]], Awaitable[T]]) -> T:
    """Run ``test(db, sender task)`` beside a webhook sender of :data:`HOOK` that polls every
    50 ms; the sender must end when cancelled."""
    async def main() -> T:
        db = await open_database(db_url, max_size=3)
        try:
            await register(db, [HOOK])
            sender = WebhookSender(db, [HOOK], worker_id="loop-faults", poll_interval=0.05,
                                   post=posts)
            task = asyncio.create_task(sender.run(), name="konduit-webhooks")
            try:
                return await test(db, task)
            finally:
                await stop(task)
        finally:
            await db.close()

    return run(main)


@pytest.mark.parametrize("raised", list(RAISED))
def test_what_the_http_call_raises_is_a_failed_attempt_recorded_and_retried(
        db_url: str, raised: str) -> None:
    posts = Posts(RAISED[raised])

    async def test(db: Database, sender: asyncio.Task[None]) -> tuple[Any, Any]:
        await raise_alert(db, 1)
        first = await delivered(db, 1, sender)  # retried after its backoff (about 2 s)
        await raise_alert(db, 2)
        return first, await delivered(db, 2, sender)

    first, second = sending(db_url, posts, test)
    assert first["attempts"] == 2 and first["last_error"].startswith(raised)
    assert (second["attempts"], second["last_error"]) == (1, None)
    assert len(posts.sent) == 3 and posts.sent[0] == posts.sent[1]  # the same delivery again


@pytest.mark.parametrize("raised", list(RAISED))
def test_what_a_round_raises_ends_that_round_only(
        db_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
        raised: str) -> None:
    """The claim of due deliveries raises: that round is lost, the next one claims."""
    caplog.set_level(logging.ERROR, logger="konduit.worker.webhook_sender")
    original = Database.all
    claims = [0]

    async def failing_once(self: Database, name: str, /, **params: Any) -> Any:
        if name == "webhook_delivery_claim_due":
            claims[0] += 1
            if claims[0] == 1:
                raise RAISED[raised]()
        return await original(self, name, **params)

    monkeypatch.setattr(Database, "all", failing_once)

    async def test(db: Database, sender: asyncio.Task[None]) -> Any:
        await raise_alert(db, 1)
        return await delivered(db, 1, sender)

    row = sending(db_url, Posts(), test)
    assert claims[0] >= 2 and row["attempts"] == 1
    (record,) = logged(caplog, "konduit.worker.webhook_sender", "webhook round failed")
    assert raised in record.getMessage() and record.exc_info is not None


def test_rounds_that_keep_failing_back_off_and_a_good_round_resets_it(
        db_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every claim fails for a while: the sender's wait after each failed round doubles from
    its poll interval up to ROUND_BACKOFF_MAX, the first failure is logged with its traceback
    and the next ones counted, one line each; after a good round the next run of failures
    starts from the poll interval again. Counted by round, each wait recorded as it is asked
    for (and not slept), so no clock decides it."""
    import konduit.worker.webhook_sender as sending_module

    caplog.set_level(logging.INFO, logger="konduit.worker.webhook_sender")
    monkeypatch.setattr(sending_module, "ROUND_BACKOFF_MAX", 0.4)
    original = Database.all
    claims: list[str] = []  # each round's claim: "failed" or "ok"
    failing = [7]  # claims left to fail
    waits: list[float] = []
    second_run = asyncio.Event()

    async def failing_claims(self: Database, name: str, /, **params: Any) -> Any:
        if name == "webhook_delivery_claim_due":
            if failing[0] > 0:
                failing[0] -= 1
                claims.append("failed")
                raise RuntimeError("injected")
            claims.append("ok")
        return await original(self, name, **params)

    async def back_off(self: WebhookSender, seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 10:
            second_run.set()
        await asyncio.sleep(0)

    monkeypatch.setattr(Database, "all", failing_claims)
    monkeypatch.setattr(WebhookSender, "_back_off", back_off)

    async def test(db: Database, sender: asyncio.Task[None]) -> Any:
        await raise_alert(db, 1)
        row = await delivered(db, 1, sender)
        failing[0] = 3  # a second run of failures, after good rounds
        await until_set(second_run, sender, "the second run of failed rounds")
        return row

    row = sending(db_url, Posts(), test)
    assert row["attempts"] == 1
    # 0.05 s poll interval: doubled after each failed round in a row, at most 0.4 s; a good
    # round in between, and the next run starts over.
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.4, 0.4, 0.4, 0.05, 0.1, 0.2], waits
    first_ok = claims.index("ok")
    assert claims[:first_ok] == ["failed"] * 7
    assert claims.count("failed") == 10
    failures = logged(caplog, "konduit.worker.webhook_sender", "webhook round failed")
    assert len(failures) == 10  # one line a failed round, never more
    assert failures[0].exc_info is not None and "RuntimeError escaped it" in \
        failures[0].getMessage()
    assert all(r.exc_info is None for r in failures[1:7] + failures[8:])
    assert "failed again, 7 in a row: RuntimeError: injected; next round in 0.4 s" in \
        failures[6].getMessage()
    assert failures[7].exc_info is not None  # a new run: its first failure in full
    (recovered, *_) = logged(caplog, "konduit.worker.webhook_sender", "claim again after")
    assert "after 7 failed round(s)" in recovered.getMessage()


@pytest.mark.parametrize("raised", list(RAISED))
def test_what_recording_a_delivery_raises_ends_that_attempt_only(
        db_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
        raised: str) -> None:
    """The record of a sent delivery raises: logged, the delivery's lease runs out and it is
    sent again; the sender goes on meanwhile."""
    caplog.set_level(logging.WARNING, logger="konduit.worker.webhook_sender")
    original = Database.one
    records = [0]

    async def failing_once(self: Database, name: str, /, **params: Any) -> Any:
        if name == "webhook_delivery_record_if_leased":
            records[0] += 1
            if records[0] == 1:
                raise RAISED[raised]()
        return await original(self, name, **params)

    monkeypatch.setattr(Database, "one", failing_once)
    posts = Posts()

    async def test(db: Database, sender: asyncio.Task[None]) -> tuple[Any, Any]:
        await raise_alert(db, 1)
        while records[0] == 0:
            await asyncio.sleep(0.02)
        await raise_alert(db, 2)
        second = await delivered(db, 2, sender)  # while the first one's lease runs
        return await delivered(db, 1, sender), second

    first, second = sending(db_url, posts, test)
    assert first["attempts"] == 2 and second["attempts"] == 1
    assert posts.sent.count(posts.sent[0]) == 2
    (record,) = logged(caplog, "konduit.worker.webhook_sender", "once its lease runs out")
    assert raised in record.getMessage() and record.exc_info is not None


def test_a_sender_stopped_inside_a_rounds_database_call_ends(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its stop reaches the claim as another error (DatabaseUnavailable): the sender ends; it
    does not log a failed round and claim again (the worker would wait for it forever)."""
    entered = threading.Event()
    monkeypatch.setattr(Database, "all", held("all", "webhook_delivery_claim_due", entered))

    async def main() -> None:
        db = await open_database(db_url, max_size=3)
        try:
            sender = WebhookSender(db, [HOOK], worker_id="loop-faults", poll_interval=0.05,
                                   post=Posts())
            task = asyncio.create_task(sender.run(), name="konduit-webhooks")
            while not entered.is_set():
                await asyncio.sleep(0.02)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=BOUND)
            assert done, "the sender did not end when stopped"
            assert task.cancelled() or isinstance(task.exception(), DatabaseUnavailable)
        finally:
            await db.close()

    run(main)
