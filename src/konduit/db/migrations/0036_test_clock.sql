-- Konduit schema, version 36: one clock for every statement.
--
-- Every statement that means "the current time" reads it through one of three functions, named
-- after the PostgreSQL function each one stands for: konduit_now() (now(): the transaction's
-- start), konduit_statement_timestamp() (statement_timestamp()) and konduit_clock_timestamp()
-- (clock_timestamp()). Each is a one-line SQL function of the volatility of the function it
-- calls, which the planner inlines: a plan with konduit_now() is the plan with now() (EXPLAIN
-- shows now()), so production pays nothing for them.
--
-- They exist so that a test can move time: konduit.testing's virtual clock, in a test database
-- only, replaces the three with versions that add an offset kept in a table of its own, and
-- moves the offset forward (docs/testing.md). PostgreSQL invalidates the cached plans that
-- inlined a function when the function is replaced.
--
-- The guard functions that read the time read it through them too, and so do the column
-- defaults that record when a row was made (konduit_lease_rescuable keeps comparing the
-- server's start with the real clock). Workers of the previous release keep calling now() and
-- clock_timestamp(), which outside a test is the same time.
CREATE OR REPLACE FUNCTION konduit_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT now() $$;

CREATE OR REPLACE FUNCTION konduit_statement_timestamp() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT statement_timestamp() $$;

CREATE OR REPLACE FUNCTION konduit_clock_timestamp() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT clock_timestamp() $$;

CREATE OR REPLACE FUNCTION konduit_deadline_after(deadline_at timestamp with time zone, seconds double precision)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT deadline_at IS NULL
        OR deadline_at > konduit_clock_timestamp() + make_interval(secs => seconds)
$$;

CREATE OR REPLACE FUNCTION konduit_deadline_ahead(deadline_at timestamp with time zone)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT deadline_at IS NULL OR deadline_at > konduit_clock_timestamp()
$$;

CREATE OR REPLACE FUNCTION konduit_fallback_settled(fallback_started_at timestamp with time zone, settle_seconds double precision)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT settle_seconds IS NULL OR fallback_started_at IS NULL
        OR fallback_started_at < konduit_clock_timestamp() - make_interval(secs => settle_seconds)
$$;

CREATE OR REPLACE FUNCTION konduit_lease_holder_alive(holder text, lease_expires_at timestamp with time zone)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (
        SELECT 1 FROM konduit_workers w
        WHERE w.id = holder AND w.stopped_at IS NULL
          AND w.last_heartbeat_at > konduit_clock_timestamp() - make_interval(secs => w.lease_seconds)
          AND lease_expires_at > konduit_clock_timestamp() - make_interval(secs => w.lease_seconds))
$$;

CREATE OR REPLACE FUNCTION konduit_lease_lapsed(holder text, lease_expires_at timestamp with time zone)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT lease_expires_at < konduit_clock_timestamp()
       AND NOT konduit_lease_holder_alive(holder, lease_expires_at)
$$;

CREATE OR REPLACE FUNCTION konduit_task_expirable(status text, deadline_at timestamp with time zone, holder text, hedge_holder text, grace_seconds double precision)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT deadline_at < konduit_clock_timestamp()
       AND (status <> 'running'
            OR deadline_at < konduit_clock_timestamp() - make_interval(secs => grace_seconds)
            OR (konduit_worker_session_gone(holder)
                AND (hedge_holder IS NULL OR konduit_worker_session_gone(hedge_holder))))
$$;

ALTER TABLE konduit_workflows
    ALTER COLUMN created_at SET DEFAULT konduit_now();

ALTER TABLE konduit_executions
    ALTER COLUMN created_at SET DEFAULT konduit_now();

ALTER TABLE konduit_tasks
    ALTER COLUMN run_at SET DEFAULT konduit_now(),
    ALTER COLUMN created_at SET DEFAULT konduit_now();

ALTER TABLE konduit_attempts
    ALTER COLUMN started_at SET DEFAULT konduit_now();

ALTER TABLE konduit_outputs
    ALTER COLUMN created_at SET DEFAULT konduit_now();

ALTER TABLE konduit_execution_outputs
    ALTER COLUMN created_at SET DEFAULT konduit_now();

ALTER TABLE konduit_workers
    ALTER COLUMN started_at SET DEFAULT konduit_now(),
    ALTER COLUMN last_heartbeat_at SET DEFAULT konduit_now();

ALTER TABLE konduit_schedules
    ALTER COLUMN created_at SET DEFAULT konduit_now(),
    ALTER COLUMN updated_at SET DEFAULT konduit_now();

ALTER TABLE konduit_alerts
    ALTER COLUMN raised_at SET DEFAULT konduit_clock_timestamp(),
    ALTER COLUMN last_seen_at SET DEFAULT konduit_clock_timestamp();

ALTER TABLE konduit_flow_limits
    ALTER COLUMN updated_at SET DEFAULT konduit_now();

ALTER TABLE konduit_webhook_subscriptions
    ALTER COLUMN registered_at SET DEFAULT konduit_clock_timestamp();

ALTER TABLE konduit_webhook_deliveries
    ALTER COLUMN next_attempt_at SET DEFAULT konduit_clock_timestamp(),
    ALTER COLUMN created_at SET DEFAULT konduit_clock_timestamp();

ALTER TABLE konduit_events
    ALTER COLUMN created_at SET DEFAULT konduit_now();

ALTER TABLE konduit_workflow_policies
    ALTER COLUMN created_at SET DEFAULT konduit_now();

ALTER TABLE konduit_flow_keys
    ALTER COLUMN updated_at SET DEFAULT konduit_now();

ALTER TABLE konduit_run_slots
    ALTER COLUMN updated_at SET DEFAULT konduit_now();

ALTER TABLE konduit_event_triggers
    ALTER COLUMN created_at SET DEFAULT konduit_now();

ALTER TABLE konduit_trigger_events
    ALTER COLUMN created_at SET DEFAULT konduit_clock_timestamp();

ALTER TABLE konduit_trigger_groups
    ALTER COLUMN opened_at SET DEFAULT konduit_clock_timestamp();

ALTER TABLE konduit_map_chunks
    ALTER COLUMN created_at SET DEFAULT konduit_now();
