"""What the engine raised and sent: stored alerts, an execution's stall, webhook deliveries."""

from __future__ import annotations

import builtins
from uuid import UUID

from konduit.engine import webhooks
from konduit.engine.alerting import list_alerts
from konduit.engine.stalls import open_stall
from konduit.reads.base import ReadBase
from konduit.records import AlertRecord, WebhookDelivery


class AlertReads(ReadBase):
    """The reads of alerts and webhook deliveries."""

    async def alerts(self, *, include_resolved: bool = False, kind: str | None = None,
                     workflow: str | None = None, limit: int = 100) -> builtins.list[AlertRecord]:
        """Stored alerts, newest first: open ones, or resolved ones too (docs/alerts.md)."""
        return await self.reads.call(lambda db: list_alerts(
            db, include_resolved=include_resolved, kind=kind, workflow=workflow, limit=limit))

    async def stall(self, execution_id: UUID | str) -> AlertRecord | None:
        """The open ``execution_stalled`` alert of an execution (nothing of it can run, and the
        watchdog's fan-in decision could not move it), or None."""
        eid = await self.resolve(execution_id)
        return await self.reads.call(lambda db: open_stall(db, eid))

    async def webhook_deliveries(self, *, status: str | None = None,
                                 execution_id: UUID | str | None = None,
                                 limit: int = 100) -> builtins.list[WebhookDelivery]:
        """Webhook deliveries, newest first (docs/webhooks.md), optionally of one status
        (pending, delivered, failed, refused) or of one execution."""
        eid = None if execution_id is None else await self.resolve(execution_id)
        rows = await self.reads.call(lambda db: webhooks.deliveries(
            db, status=status, execution_id=eid, limit=limit))
        return [WebhookDelivery.from_row(r) for r in rows]
