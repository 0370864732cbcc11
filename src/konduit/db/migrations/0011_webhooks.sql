-- Konduit schema, version 11: signed webhooks with an outbox (docs/webhooks.md).
--
-- Webhooks are configured in code (App(webhooks=[...])), but whether an event is due must be
-- known inside the transaction that commits it, whichever process commits it (a worker, a
-- `konduit cancel`, the timeout sweep). So an App registers its webhooks here at start; the
-- statement that ends an execution says whether this table has a row, and only then does the
-- finish insert one delivery per subscribed webhook, from this table, in the same transaction:
-- with no row here that costs no statement and no round trip.
CREATE TABLE konduit_webhook_subscriptions (
    -- A fingerprint of (url, secret): the secret itself never reaches the database, and only a
    -- process configured with the same secret can sign (and so claim) its deliveries.
    id            text        PRIMARY KEY CHECK (id ~ '^[0-9a-f]{32}$'),
    url           text        NOT NULL CHECK (url ~ '^https?://'),
    events        text[]      NOT NULL CHECK (cardinality(events) >= 1 AND events <@ ARRAY[
        'execution.finished', 'execution.degraded', 'alert.raised', 'alert.resolved']::text[]),
    registered_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The outbox: one row per (webhook, event), delivered at least once.
CREATE TABLE konduit_webhook_deliveries (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),  -- Konduit-Delivery
    subscription_id  text        NOT NULL,  -- no foreign key: a delivery outlives its webhook
    url              text        NOT NULL,
    event            text        NOT NULL CHECK (event IN (
        'execution.finished', 'execution.degraded', 'alert.raised', 'alert.resolved')),
    -- The subject: an execution (with the output version it finished with: a repaired execution
    -- finishes again, a new event) or an alert.
    execution_id     uuid,
    output_version   integer,
    alert_id         bigint,
    -- The payload's fields (event and delivery_id are added when sent). For an execution event
    -- the finish stores what it knows; the step outcomes are added by the first
    -- attempt (after the commit, when every step has its final state), then never change.
    body             jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(body) = 'object'),
    status           text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivered', 'failed', 'refused')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- When it is due: the next try of a pending delivery, or the end of the lease of the
    -- attempt in flight (a killed sender's delivery is due again then, for another worker).
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    lease_token      uuid,
    worker_id        text,
    last_error       text,
    last_status_code integer,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_attempt_at  timestamptz,
    delivered_at     timestamptz,
    CHECK ((execution_id IS NULL) <> (alert_id IS NULL)),
    CHECK ((status = 'delivered') = (delivered_at IS NOT NULL))
);

-- One delivery per event and webhook, whatever retries or races happen upstream.
CREATE UNIQUE INDEX konduit_webhook_deliveries_execution_event
    ON konduit_webhook_deliveries (subscription_id, event, execution_id, output_version)
    WHERE execution_id IS NOT NULL;
CREATE UNIQUE INDEX konduit_webhook_deliveries_alert_event
    ON konduit_webhook_deliveries (subscription_id, event, alert_id)
    WHERE alert_id IS NOT NULL;
-- The senders' claim: pending deliveries by due time.
CREATE INDEX konduit_webhook_deliveries_due ON konduit_webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';
-- Listing, newest first, and pruning by age.
CREATE INDEX konduit_webhook_deliveries_created ON konduit_webhook_deliveries (created_at DESC);
