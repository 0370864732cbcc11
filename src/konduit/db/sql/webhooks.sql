-- Webhooks: subscriptions registered by Apps, and the outbox of deliveries their workers send.

-- name: webhook_subscription_upsert_many
-- Register an App's webhooks (fingerprint, url, events) for every process that ends executions;
-- a webhook registered before takes the events configured now.
INSERT INTO konduit_webhook_subscriptions (id, url, events)
SELECT u.id, u.url, string_to_array(u.events, ',')
FROM unnest(%(ids)s::text[], %(urls)s::text[], %(events)s::text[]) AS u(id, url, events)
ORDER BY u.id
ON CONFLICT (id) DO UPDATE
SET events = EXCLUDED.events, registered_at = konduit_clock_timestamp()
WHERE konduit_webhook_subscriptions.events IS DISTINCT FROM EXCLUDED.events
   OR konduit_webhook_subscriptions.url IS DISTINCT FROM EXCLUDED.url;

-- name: webhook_subscription_delete_many
-- Stop writing deliveries for these webhooks (those written stay, and are still sent).
DELETE FROM konduit_webhook_subscriptions
WHERE id = ANY(%(ids)s::text[]);

-- name: webhook_delivery_insert_for_execution_if_finished
-- The deliveries of an execution this transaction just ended (sent right after
-- execution_finish_if_running, when it said a webhook is registered): one per webhook and event
-- it subscribed to. execution.degraded: it succeeded, and a step ended degraded, timed_out or
-- failed (a branch its join policy tolerated). A finish repeated for the same output version
-- writes nothing new.
INSERT INTO konduit_webhook_deliveries (subscription_id, url, event, execution_id,
                                        output_version, body)
SELECT s.id, s.url, ev.event, e.id, e.output_version,
       jsonb_build_object('execution_id', e.id, 'workflow', e.workflow_name,
                          'version', e.workflow_version, 'status', e.status,
                          'finished_at', e.finished_at)
FROM konduit_executions e
CROSS JOIN konduit_webhook_subscriptions s
CROSS JOIN LATERAL unnest(s.events) AS ev(event)
WHERE e.id = %(id)s AND e.status IN ('succeeded', 'failed', 'timed_out', 'cancelled')
  AND (ev.event = 'execution.finished'
       OR (ev.event = 'execution.degraded' AND e.status = 'succeeded' AND EXISTS (
            SELECT 1 FROM konduit_steps st
            WHERE st.execution_id = %(id)s AND st.status IN ('degraded', 'timed_out', 'failed'))))
ON CONFLICT DO NOTHING;

-- name: webhook_delivery_insert_for_alert_event
-- One delivery per webhook subscribed to this alert event, in the transaction that raised or
-- resolved the alert; none when no webhook subscribed.
INSERT INTO konduit_webhook_deliveries (subscription_id, url, event, alert_id, body)
SELECT s.id, s.url, %(event)s, %(alert_id)s, %(body)s
FROM konduit_webhook_subscriptions s
WHERE %(event)s = ANY(s.events)
ON CONFLICT DO NOTHING;

-- name: webhook_delivery_claim_due
-- Lease up to `limit` due deliveries of the given webhooks: the lease is the next due time, so
-- a sender that dies mid-call leaves its delivery due again once the lease ran out. The first
-- claim of an execution event freezes the steps' outcomes into its body: every attempt sends
-- the same bytes.
WITH due AS (
    SELECT id
    FROM konduit_webhook_deliveries
    WHERE status = 'pending' AND next_attempt_at <= konduit_clock_timestamp()
      AND subscription_id = ANY(%(subscriptions)s::text[])
    ORDER BY next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE konduit_webhook_deliveries d
SET attempts = d.attempts + 1,
    lease_token = gen_random_uuid(),
    worker_id = %(worker_id)s,
    last_attempt_at = konduit_clock_timestamp(),
    next_attempt_at = konduit_clock_timestamp() + make_interval(secs => %(lease_seconds)s),
    body = CASE WHEN d.execution_id IS NOT NULL AND NOT d.body ? 'outcomes'
                THEN d.body || jsonb_build_object('outcomes', (
                    SELECT coalesce(jsonb_object_agg(st.step, st.status ORDER BY st.step),
                                    '{}'::jsonb)
                    FROM konduit_steps st WHERE st.execution_id = d.execution_id))
                ELSE d.body END
FROM due
WHERE d.id = due.id AND d.status = 'pending'
RETURNING d.id, d.subscription_id, d.url, d.event, d.execution_id, d.alert_id, d.body,
          d.attempts, d.lease_token,
          extract(epoch FROM konduit_clock_timestamp() - d.created_at)::float8 AS age_seconds;

-- name: webhook_delivery_record_if_leased
-- The end of one attempt: delivered, failed or refused for good, or pending again after
-- `retry_seconds`. Only the lease holder's record counts (a sender whose lease ran out and
-- whose delivery another worker took changes nothing).
UPDATE konduit_webhook_deliveries
SET status = %(status)s::text,
    last_error = coalesce(%(error)s, last_error),  -- a delivery keeps the error it got past
    last_status_code = %(status_code)s,
    delivered_at = CASE WHEN %(status)s::text = 'delivered' THEN konduit_clock_timestamp() END,
    next_attempt_at = CASE WHEN %(status)s::text = 'pending'
                           THEN konduit_clock_timestamp() + make_interval(secs => %(retry_seconds)s)
                           ELSE next_attempt_at END,
    lease_token = NULL
WHERE id = %(id)s AND lease_token = %(lease_token)s AND status = 'pending'
RETURNING id;

-- name: webhook_delivery_retry_if_ended
-- Send a failed or refused delivery again, now (`konduit webhooks --retry`), with a fresh count
-- of attempts (a delivery older than the age limit is still marked failed after one more).
UPDATE konduit_webhook_deliveries
SET status = 'pending', next_attempt_at = konduit_clock_timestamp(), lease_token = NULL,
    attempts = 0
WHERE id = %(id)s AND status IN ('failed', 'refused')
RETURNING id;

-- name: webhook_delivery_list
-- Deliveries, newest first, optionally of one status.
SELECT id, event, url, status, attempts, last_error, last_status_code, execution_id, alert_id,
       created_at, last_attempt_at, delivered_at,
       CASE WHEN status = 'pending' THEN next_attempt_at END AS next_attempt_at
FROM konduit_webhook_deliveries
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(execution_id)s::uuid IS NULL OR execution_id = %(execution_id)s)
ORDER BY created_at DESC, id
LIMIT %(limit)s;

-- name: webhook_delivery_count_by_status
-- How many deliveries are in each status (for /metrics).
SELECT status, count(*) AS deliveries
FROM konduit_webhook_deliveries
GROUP BY status;

-- name: webhook_delivery_delete_ended_before
-- Retention: deliveries that ended (delivered, failed or refused) before the cutoff, a batch at
-- a time; pending ones are never deleted, however old.
DELETE FROM konduit_webhook_deliveries
WHERE id IN (SELECT id FROM konduit_webhook_deliveries
             WHERE status <> 'pending'
               AND created_at < konduit_now() - make_interval(secs => %(older_than_seconds)s)
             LIMIT %(limit)s);
