-- Konduit schema, version 6: stored alerts.
-- Every worker evaluates the alert rules (window at risk, fan-in wait, no recent success) and
-- writes what it finds here; the partial unique index makes "one open alert per (kind, subject)"
-- a fact of the schema, so racing workers upsert into the same row instead of raising twice.
CREATE TABLE konduit_alerts (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind          text        NOT NULL
        CHECK (kind IN ('window_at_risk', 'fan_in_wait', 'no_success')),
    subject       text        NOT NULL CHECK (subject <> ''),  -- execution id, workflow/join, workflow
    workflow      text        NOT NULL,
    severity      text        NOT NULL CHECK (severity IN ('warning', 'critical')),
    message       text        NOT NULL,
    details       jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(details) = 'object'),
    raised_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_at  timestamptz NOT NULL DEFAULT clock_timestamp(),  -- last evaluation that found it
    resolved_at   timestamptz,
    CHECK (last_seen_at >= raised_at),
    CHECK (resolved_at IS NULL OR resolved_at >= raised_at)
);

CREATE UNIQUE INDEX konduit_alerts_open ON konduit_alerts (kind, subject) WHERE resolved_at IS NULL;
CREATE INDEX konduit_alerts_raised ON konduit_alerts (raised_at DESC);

-- The window-at-risk rule reads the running executions that have a window, every few seconds.
CREATE INDEX konduit_executions_window ON konduit_executions (deadline_at)
    WHERE status = 'running' AND deadline_at IS NOT NULL;
