-- Konduit schema, version 31: the queue_unserved alert.
--
-- A ready task on a queue that no live worker serving its workflow version takes used to wait
-- in silence: the stall watchdog counts a ready task as progress. The alert that names such a
-- queue (docs/alerts.md) is a new kind; the list names every kind, so that whichever migration
-- rewrites this constraint last keeps the others'.
ALTER TABLE konduit_alerts DROP CONSTRAINT konduit_alerts_kind_check;
ALTER TABLE konduit_alerts ADD CONSTRAINT konduit_alerts_kind_check
    CHECK (kind IN ('window_at_risk', 'fan_in_wait', 'no_success', 'execution_stalled',
                    'version_unserved', 'degraded_budget', 'queue_unserved'));
