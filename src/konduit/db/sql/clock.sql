-- name: clock_virtual_install
-- A test database's virtual clock (konduit.testing, docs/testing.md): the offset table, and konduit_now() and its siblings (migration 0036) replaced by versions that add the offset. For test databases only.
-- The replaced functions are no longer inlined (they read a table): a test pays a function call
-- per use, production nothing. Replacing a function invalidates every cached plan that inlined
-- it, on every connection, so connections opened before see the offset too.
CREATE TABLE IF NOT EXISTS konduit_test_clock (
    one    boolean   PRIMARY KEY DEFAULT true CHECK (one),
    shift  interval  NOT NULL DEFAULT interval '0'
);
INSERT INTO konduit_test_clock (one) VALUES (true) ON CONFLICT (one) DO NOTHING;
CREATE OR REPLACE FUNCTION konduit_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT now() + (SELECT shift FROM konduit_test_clock) $$;
CREATE OR REPLACE FUNCTION konduit_statement_timestamp() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT statement_timestamp() + (SELECT shift FROM konduit_test_clock) $$;
CREATE OR REPLACE FUNCTION konduit_clock_timestamp() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT clock_timestamp() + (SELECT shift FROM konduit_test_clock) $$;

-- name: clock_virtual_remove
-- The real clock again in a test database: konduit_now() and its siblings as migration 0036 defines them, and no offset table.
CREATE OR REPLACE FUNCTION konduit_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT now() $$;
CREATE OR REPLACE FUNCTION konduit_statement_timestamp() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT statement_timestamp() $$;
CREATE OR REPLACE FUNCTION konduit_clock_timestamp() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT clock_timestamp() $$;
DROP TABLE IF EXISTS konduit_test_clock;

-- name: clock_advance_by
-- Move a test database's virtual clock forward; what only proves a process alive (leases, heartbeats, the leaders' terms) moves with it, as if renewed meanwhile.
-- A running handler keeps its lease and its worker stays alive across the jump: only the time
-- of the workflow (deadlines, timers, back-offs, schedules, repairs) comes due.
WITH moved AS (
    UPDATE konduit_test_clock SET shift = shift + make_interval(secs => %(seconds)s)
    RETURNING shift
), leases AS (
    UPDATE konduit_tasks
    SET lease_expires_at = lease_expires_at + make_interval(secs => %(seconds)s),
        hedge_expires_at = hedge_expires_at + make_interval(secs => %(seconds)s)
    WHERE status = 'running'
    RETURNING 1
), workers AS (
    UPDATE konduit_workers
    SET last_heartbeat_at = last_heartbeat_at + make_interval(secs => %(seconds)s)
    WHERE stopped_at IS NULL
    RETURNING 1
), leaders AS (
    UPDATE konduit_leaders
    SET renewed_at = renewed_at + make_interval(secs => %(seconds)s),
        expires_at = expires_at + make_interval(secs => %(seconds)s)
    RETURNING 1
)
SELECT extract(epoch FROM shift)::float8 AS offset_seconds FROM moved;

-- name: clock_next_due_if_idle
-- For a virtual clock's skip: whether anything can happen now (a task running or ready to claim, an execution due to start, something due less than overdue_seconds ago that no pass took yet), and if not the earliest moment something comes due (NULL: nothing).
-- plan: custom (a test database; one look per skip)
-- The moments: a deadline (task or execution window), an execution's timeout, a durable wait's
-- timer or time limit, a back-off or a later start (run_at), an automatic repair, a batch of
-- events closing. Schedule ticks are computed from each schedule's timing, in Python. Overdue
-- moments stop counting as work after overdue_seconds, so one that no pass ever takes (a repair
-- past its window) cannot stop the clock for good.
WITH now AS (
    SELECT konduit_clock_timestamp() AS now,
           konduit_clock_timestamp() - make_interval(secs => %(overdue_seconds)s) AS since
)
SELECT EXISTS (SELECT 1 FROM konduit_tasks, now
               WHERE status = 'running'
                  OR (status = 'ready' AND run_at <= now.now AND NOT limited)
                  OR (status IN ('ready', 'waiting') AND deadline_at <= now.now
                      AND deadline_at > now.since)
                  OR (status = 'waiting' AND wait_until <= now.now AND wait_until > now.since))
    OR EXISTS (SELECT 1 FROM konduit_executions, now
               WHERE (status = 'scheduled' AND run_at <= now.now)
                  OR (status IN ('running', 'pending') AND deadline_at <= now.now
                      AND deadline_at > now.since)
                  OR (status = 'running' AND timeout_at <= now.now AND timeout_at > now.since)
                  OR (auto_repair_at IS NULL AND auto_repair_due_at <= now.now
                      AND auto_repair_due_at > now.since))
    OR EXISTS (SELECT 1 FROM konduit_trigger_groups, now
               WHERE due_at <= now.now AND due_at > now.since) AS busy,
       least(
           (SELECT min(deadline_at) FROM konduit_tasks, now
            WHERE status IN ('ready', 'waiting') AND deadline_at > now.now),
           (SELECT min(wait_until) FROM konduit_tasks, now
            WHERE status = 'waiting' AND wait_until > now.now),
           (SELECT min(run_at) FROM konduit_tasks, now
            WHERE status = 'ready' AND run_at > now.now),
           (SELECT min(deadline_at) FROM konduit_executions, now
            WHERE status IN ('running', 'pending') AND deadline_at > now.now),
           (SELECT min(timeout_at) FROM konduit_executions, now
            WHERE status = 'running' AND timeout_at > now.now),
           (SELECT min(run_at) FROM konduit_executions, now
            WHERE status = 'scheduled' AND run_at > now.now),
           (SELECT min(auto_repair_due_at) FROM konduit_executions, now
            WHERE auto_repair_at IS NULL AND auto_repair_due_at > now.now),
           (SELECT min(due_at) FROM konduit_trigger_groups, now WHERE due_at > now.now)
       ) AS next_due,
       (SELECT now FROM now) AS now;
