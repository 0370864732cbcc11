"""The webhook sender every worker of an App with webhooks runs beside its maintenance loop.

A round claims due deliveries of the webhooks this worker knows the secrets of, with FOR UPDATE
SKIP LOCKED and a lease (the delivery's next due time, pushed past the longest the call may
take): two workers never send the same delivery at once, and one whose worker was killed mid-call
is due again when the lease runs out, for any worker, with the same ``Konduit-Delivery`` id
(at-least-once: receivers deduplicate on it). The HTTP calls run on threads of their own, so a
slow receiver holds one of those threads, never the worker's event loop. The end of each attempt
is recorded under its lease: delivered on a 2xx; else retried with backoff (2 s, doubling, at most
an hour) until :data:`~konduit.core.webhooks.MAX_ATTEMPTS` attempts or
:data:`~konduit.core.webhooks.MAX_AGE`, then failed; refused at once, with nothing sent, when
the host resolves to an internal address.

Nothing ends the sender but its own cancellation (the worker's stop). What the HTTP call
raises, ``BaseException`` included, is a failed attempt, recorded and retried like any other;
what else a delivery or a round raises is logged, the delivery's lease runs out and it is sent
again. After a failed round the sender waits before claiming again, twice as long after each
failed round in a row (its poll interval first, at most :data:`ROUND_BACKOFF_MAX`), and as
usual again after a good one: a fault that repeats every round (a query the schema refuses, a
bug) is logged once in full (a bug with its traceback), then in one line a round, each saying
how many failed in a row, rather than every second.

A ``KeyboardInterrupt`` or ``SystemExit`` set on a future the loop awaits, or let out of one of
its tasks, would end the worker's event loop itself (asyncio re-raises them out of
``run_forever``): the call's come back as :class:`~konduit.errors.UserCodeInterrupted`
(:func:`konduit.threads.interrupted`), and the loop's tasks keep the rest.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from konduit.aio import cancelling, wait_event
from konduit.core.model import DeliveryStatus
from konduit.core.webhooks import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    Webhook,
    encode_body,
    gives_up,
    retry_delay,
    signature,
)
from konduit.db.database import Database, Row
from konduit.errors import DatabaseError, DatabaseUnavailable, KonduitError, UserCodeInterrupted
from konduit.threads import interrupted
from konduit.worker import webhook_http

log = logging.getLogger(__name__)

POLL_INTERVAL = 1.0
"""Seconds between two claims when nothing was due (a first retry is due 2 s after a failure)."""
ROUND_BACKOFF_MAX = 30.0
"""Seconds at most between two claims while every round fails (the poll interval doubled after
each failed round in a row, up to this)."""
CONCURRENCY = 8
"""Deliveries one worker sends at once (threads)."""

Post = Callable[[Webhook, bytes, dict[str, str]], webhook_http.Response]


def lease_seconds(hook: Webhook) -> float:
    """How long a claimed delivery stays out of other senders' reach: longer than one call may
    take (resolve, connect, send and read, each bounded by the hook's timeout)."""
    return 3 * hook.timeout + 5.0


class WebhookSender:
    """Sends the deliveries of ``webhooks`` (this App's; others' deliveries are left to the
    workers that hold their secrets)."""

    def __init__(self, db: Database, webhooks: Sequence[Webhook], *, worker_id: str,
                 poll_interval: float = POLL_INTERVAL, concurrency: int = CONCURRENCY,
                 post: Post | None = None):
        self.db = db
        self.hooks = {w.subscription_id: w for w in webhooks}
        self.worker_id = worker_id
        self.poll_interval = poll_interval
        self.concurrency = concurrency
        self.post: Post = post or webhook_http.post
        self.lease = max((lease_seconds(w) for w in webhooks), default=35.0)
        self._threads = ThreadPoolExecutor(max_workers=concurrency,
                                           thread_name_prefix="konduit-webhook")
        self._inflight: set[asyncio.Task[None]] = set()
        self._done = asyncio.Event()

    async def run(self) -> None:
        """Claim and send until cancelled. A call in flight when the worker stops is abandoned:
        its lease runs out and the delivery is sent again (by this App's next worker)."""
        failed = 0  # rounds failed in a row
        try:
            while True:
                try:
                    claimed = await self.round()
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:
                    if cancelling():
                        raise  # the stop, not a failed round
                    failed += 1
                    pause = self.backoff(failed)
                    _log_failed_round(exc, failed, pause)
                    await self._back_off(pause)
                    continue
                if failed:
                    log.info("webhook rounds claim again after %d failed round(s) in a row",
                             failed)
                    failed = 0
                if claimed == 0 or len(self._inflight) >= self.concurrency:
                    self._done.clear()
                    await wait_event(self._done, self.poll_interval)
        finally:
            for task in list(self._inflight):
                task.cancel()
            self._threads.shutdown(wait=False, cancel_futures=True)

    def backoff(self, failed: int) -> float:
        """Seconds to wait after the ``failed``-th failed round in a row: the poll interval,
        doubled after each further one, at most :data:`ROUND_BACKOFF_MAX` (or the poll interval
        when that is longer)."""
        return min(self.poll_interval * 2.0 ** min(failed - 1, 32),
                   max(ROUND_BACKOFF_MAX, self.poll_interval))

    async def _back_off(self, seconds: float) -> None:
        """The wait after a failed round: a plain sleep (a delivery ending meanwhile does not
        cut it short, as it does the wait between good rounds)."""
        await asyncio.sleep(seconds)

    async def round(self) -> int:
        """Claim what is due (up to the free threads) and start sending it; returns how many."""
        free = self.concurrency - len(self._inflight)
        if free <= 0 or not self.hooks:
            return 0
        rows = await self.db.all(
            "webhook_delivery_claim_due", subscriptions=list(self.hooks), limit=free,
            lease_seconds=self.lease, worker_id=self.worker_id,
        )
        for row in rows:
            task = asyncio.create_task(self._deliver(row), name=f"konduit-webhook-{row['id']}")
            self._inflight.add(task)
            task.add_done_callback(self._finished)
        return len(rows)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._done.set()
        if not task.cancelled() and task.exception() is not None:
            log.warning("webhook delivery failed to record: %s", task.exception())

    async def _deliver(self, row: Row) -> None:
        """Send one claimed delivery and record its attempt. What fails here beyond the call
        (recording it, a bug) ends this delivery's attempt only: its lease runs out and it is
        sent again."""
        try:
            await self._send(row)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if cancelling():
                raise  # the stop
            level = logging.WARNING if isinstance(exc, Exception) else logging.ERROR
            log.log(level, "webhook delivery %s: %s: %s; sent again once its lease runs out",
                    row["id"], type(exc).__name__, exc,
                    exc_info=None if isinstance(exc, DatabaseError) else exc)

    async def _send(self, row: Row) -> None:
        hook = self.hooks[row["subscription_id"]]
        delivery_id = str(row["id"])
        body = encode_body(row["event"], delivery_id, row["body"])
        headers = {
            SIGNATURE_HEADER: signature(hook.secret, int(time.time()), body),
            DELIVERY_HEADER: delivery_id,
            EVENT_HEADER: row["event"],
        }
        loop = asyncio.get_running_loop()
        status_code: int | None = None
        try:
            answer = await loop.run_in_executor(self._threads, _call, self.post, hook, body,
                                                headers)
        except webhook_http.Refused as exc:
            log.warning("webhook delivery %s to %s refused: %s", delivery_id, hook.host, exc)
            await self._record(row, DeliveryStatus.REFUSED, f"refused: {exc}", None)
            return
        except (OSError, http.client.HTTPException, ValueError) as exc:
            error = _describe(exc)
        except Exception as exc:  # anything else the call raised: a failed attempt too
            error = _describe(exc)
            log.warning("webhook delivery %s to %s: the call raised %s", delivery_id, hook.host,
                        error, exc_info=exc)
        else:
            status_code = answer.status
            if 200 <= answer.status < 300:
                await self._record(row, DeliveryStatus.DELIVERED, None, answer.status)
                return
            error = f"HTTP {answer.status} {answer.reason}".strip()
        delay = retry_delay(row["attempts"])
        if gives_up(row["attempts"], row["age_seconds"], delay):
            log.warning("webhook delivery %s to %s failed for good after %s attempt(s): %s",
                        delivery_id, hook.host, row["attempts"], error)
            await self._record(row, DeliveryStatus.FAILED, error, status_code)
        else:
            log.info("webhook delivery %s to %s failed (attempt %s), retrying in %.0f s: %s",
                     delivery_id, hook.host, row["attempts"], delay, error)
            await self._record(row, DeliveryStatus.PENDING, error, status_code, retry_seconds=delay)

    async def _record(self, row: Row, status: DeliveryStatus, error: str | None, status_code: int | None,
                      *, retry_seconds: float = 0.0) -> None:
        params: dict[str, Any] = {
            "id": row["id"], "lease_token": row["lease_token"], "status": status,
            "error": None if error is None else error[:1000], "status_code": status_code,
            "retry_seconds": retry_seconds,
        }
        if await self.db.one("webhook_delivery_record_if_leased", **params) is None:
            log.info("webhook delivery %s: lease ran out before its attempt was recorded",
                     row["id"])


def _log_failed_round(exc: BaseException, failed: int, pause: float) -> None:
    """The first failed round of a run of them with its traceback (a bug's), the next ones in
    one line each, counted; as the wait between rounds doubles, so does the time between lines.
    A database that does not answer is said at debug level (the worker reports the outage)."""
    if isinstance(exc, DatabaseError | KonduitError):
        level = logging.DEBUG if isinstance(exc, DatabaseUnavailable) else logging.WARNING
        trace = None
    else:  # a bug, KeyboardInterrupt...: this round only (module docstring)
        level, trace = logging.ERROR, exc
    if failed == 1:
        if trace is None:
            log.log(level, "webhook round failed: %s; next round in %.3g s", exc, pause)
        else:
            log.log(level, "webhook round failed: %s escaped it; the sender runs on, next "
                    "round in %.3g s", type(exc).__name__, pause, exc_info=trace)
    else:
        log.log(level, "webhook round failed again, %d in a row: %s: %s; next round in %.3g s",
                failed, type(exc).__name__, exc, pause)


def _call(post: Post, hook: Webhook, body: bytes, headers: dict[str, str]) -> webhook_http.Response:
    """``post(hook, body, headers)`` on a sender thread; what it raises that is no
    ``Exception`` comes back as :class:`~konduit.errors.UserCodeInterrupted` (see the module's
    docstring)."""
    try:
        return post(hook, body, headers)
    except Exception:
        raise
    except BaseException as exc:
        raise interrupted(exc) from exc


def _describe(exc: BaseException) -> str:
    """The error kept with a failed attempt: ``Type: message`` (the interrupt itself, for a
    :class:`~konduit.errors.UserCodeInterrupted`)."""
    if isinstance(exc, UserCodeInterrupted) and exc.__cause__ is not None:
        exc = exc.__cause__
    try:
        text = str(exc)
    except Exception:
        text = "(unprintable)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
