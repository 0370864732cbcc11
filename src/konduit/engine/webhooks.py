"""The webhook outbox in the database: subscriptions, alert deliveries, listing, retry, prune.

Deliveries of finished executions are written in the transaction that ends the execution:
``execution_finish_if_running`` returns whether any webhook is registered, and only then does
:func:`konduit.engine.finish.finish_execution` send ``webhook_delivery_insert_for_execution_if_finished``
after it. The outbox row commits with the terminal state or not at all, and with no webhook
registered the finish sends no extra statement.
Alert deliveries are written here, by :func:`alert_event`, in the transaction that raised or
resolved the alert. Workers send them (:mod:`konduit.worker.webhook_sender`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from konduit.core.model import DeliveryStatus
from konduit.core.values import MAX_BIGINT
from konduit.core.webhooks import Webhook
from konduit.db.database import Database, Row, Tx
from konduit.errors import KonduitError, blamed
from konduit.records import AlertRecord

STATUSES = tuple(s.value for s in DeliveryStatus)


async def register(db: Database | Tx, webhooks: Sequence[Webhook]) -> None:
    """Store the App's webhooks, so that every transaction ending an execution (in whichever
    process) writes their deliveries. Idempotent; run at App and worker start."""
    if not webhooks:
        return
    hooks = sorted(webhooks, key=lambda w: w.subscription_id)
    await db.run(
        "webhook_subscription_upsert_many",
        ids=[w.subscription_id for w in hooks],
        urls=[w.url for w in hooks],
        events=[",".join(w.events) for w in hooks],
    )


async def unregister(db: Database, webhooks: Sequence[Webhook]) -> int:
    """Stop writing deliveries for these webhooks (a receiver removed from the App's
    configuration); deliveries already written are still sent by workers that know it."""
    return await db.run("webhook_subscription_delete_many",
                        ids=[w.subscription_id for w in webhooks])


async def alert_event(tx: Tx, event: str, alert: AlertRecord) -> None:
    """Write the deliveries of an alert event (``alert.raised`` / ``alert.resolved``) through
    ``tx``: one statement, which writes nothing when no webhook subscribed."""
    body = {
        "alert_id": alert.id, "kind": alert.kind, "subject": alert.subject,
        "workflow": alert.workflow, "severity": alert.severity, "message": alert.message,
        "details": dict(alert.details),
        "raised_at": alert.raised_at.isoformat(),
        "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
    }
    await tx.run("webhook_delivery_insert_for_alert_event", event=event, alert_id=alert.id,
                 body=Jsonb(body))


async def deliveries(db: Database, *, status: str | None = None,
                     execution_id: UUID | None = None, limit: int = 100) -> list[Row]:
    """Deliveries, newest first: id, event, url, status, attempts, last_error,
    last_status_code, execution_id, alert_id, created_at, last_attempt_at, delivered_at,
    next_attempt_at (pending ones only)."""
    if status is not None and status not in STATUSES:
        raise blamed(KonduitError(f"unknown delivery status {status!r}; choose from "
                                  f"{', '.join(STATUSES)}"), "status")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BIGINT:
        raise blamed(KonduitError(f"limit must be a whole number from 1 to {MAX_BIGINT}, got "
                                  f"{limit!r:.40}"), "limit")
    return await db.all("webhook_delivery_list", status=status, execution_id=execution_id,
                        limit=limit)


async def retry(db: Database, delivery_id: UUID | str) -> bool:
    """Make a failed or refused delivery due now; False when it is not one (pending, delivered
    or unknown)."""
    try:
        key = delivery_id if isinstance(delivery_id, UUID) else UUID(str(delivery_id))
    except ValueError:
        raise KonduitError(f"{delivery_id!r} is not a delivery id") from None
    return await db.one("webhook_delivery_retry_if_ended", id=key) is not None


async def counts(db: Database) -> dict[str, int]:
    """Deliveries by status (every status present, zero when none)."""
    found = {r["status"]: int(r["deliveries"])
             for r in await db.all("webhook_delivery_count_by_status")}
    return {s: found.get(s, 0) for s in STATUSES}


async def prune(db: Database, older_than_seconds: float, *, batch_size: int = 500) -> int:
    """Delete deliveries that ended (delivered, failed, refused) and were created more than
    ``older_than_seconds`` ago, in batches; pending ones stay. Returns how many."""
    deleted = 0
    while True:
        n = await db.run("webhook_delivery_delete_ended_before",
                         older_than_seconds=older_than_seconds, limit=batch_size)
        deleted += n
        if n < batch_size:
            return deleted


def delivery_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A delivery row as JSON-ready values (ids and times as strings), for the CLI and pages."""
    return {k: (str(v) if isinstance(v, UUID) else v.isoformat() if hasattr(v, "isoformat")
                else v) for k, v in row.items()}
