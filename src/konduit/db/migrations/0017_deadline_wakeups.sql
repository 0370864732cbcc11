-- Konduit schema, version 17: deadlines and automatic repairs to the moment.

-- The backend pid of a worker's own session (its heartbeat connection, straight to PostgreSQL),
-- recorded at every beat. When the worker process dies its socket closes and PostgreSQL ends
-- that backend within milliseconds, long before the heartbeat goes stale: the deadline sweep
-- reads "this task's worker is dead" from the session being gone and ends the task at its
-- deadline instead of granting the grace a live worker gets to end it itself. NULL (no beat
-- yet, or the heartbeat goes through a transaction pooler) means "unknown": the grace applies.
ALTER TABLE konduit_workers ADD COLUMN session_pid integer;

-- True when the worker is known to be gone: it recorded a session and that backend no longer
-- exists. Either mistake is safe: a reused pid makes a dead worker look alive (the sweep waits
-- the grace, as before), and a live worker whose heartbeat connection just broke looks dead
-- until its next beat (the sweep ends its task past the deadline, which the worker was ending
-- itself; the expire statement and the lease fence let exactly one of them record it).
-- STABLE, called in the WHERE of the statement that writes, like konduit_lease_holder_alive.
CREATE FUNCTION konduit_worker_session_gone(holder text)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (
        SELECT 1 FROM konduit_workers w
        WHERE w.id = holder AND w.session_pid IS NOT NULL
          -- The one backend's entry, not the whole pg_stat_activity (executable by anyone).
          AND NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(w.session_pid)))
$$;

-- The one definition of "the deadline sweep may end this task now", called by the sweep's list
-- and, in its own WHERE, by the expire statement. A ready or waiting task has no worker to wait
-- for: it ends at its deadline. A running task gets the grace only while its worker may still
-- end it itself (the worker cancels it locally at the deadline and records the outcome with its
-- fallback): a worker known dead (its session gone; with a hedge, both) ends nothing, so waiting
-- for it would only make the join late by the grace.
CREATE FUNCTION konduit_task_expirable(status text, deadline_at timestamptz, holder text,
                                       hedge_holder text, grace_seconds float8)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT deadline_at < clock_timestamp()
       AND (status <> 'running'
            OR deadline_at < clock_timestamp() - make_interval(secs => grace_seconds)
            OR (konduit_worker_session_gone(holder)
                AND (hedge_holder IS NULL OR konduit_worker_session_gone(hedge_holder))))
$$;

-- The automatic repair is armed like a timer: the finishing transaction of a degraded execution
-- of a workflow with repair_within= sets when it is due (finished_at + repair_delay), and the
-- maintenance loop sleeps until the earliest one (through this index) instead of looking every
-- 30 s. Taking the repair (auto_repair_at) drops the row from the index.
ALTER TABLE konduit_executions ADD COLUMN auto_repair_due_at timestamptz;
CREATE INDEX konduit_executions_auto_repair_due ON konduit_executions (auto_repair_due_at)
    WHERE auto_repair_at IS NULL AND auto_repair_due_at IS NOT NULL;

-- Executions that finished degraded before this migration and are still waiting for theirs.
UPDATE konduit_executions e
SET auto_repair_due_at = e.finished_at + make_interval(secs => (w.spec->'repair'->>'delay')::float8)
FROM konduit_workflows w, konduit_execution_outputs o
WHERE w.name = e.workflow_name AND w.version = e.workflow_version AND w.spec ? 'repair'
  AND o.execution_id = e.id AND o.version = e.output_version AND o.degraded <> '{}'
  AND e.status = 'succeeded' AND e.auto_repair_at IS NULL AND e.finished_at IS NOT NULL;

-- The degraded_budget alert (Workflow(degraded_budget="2%")). The list names every kind of the
-- alert kinds added together (execution_stalled, version_unserved, degraded_budget), so
-- that whichever migration rewrites this constraint last keeps the others' kinds.
ALTER TABLE konduit_alerts DROP CONSTRAINT konduit_alerts_kind_check;
ALTER TABLE konduit_alerts ADD CONSTRAINT konduit_alerts_kind_check
    CHECK (kind IN ('window_at_risk', 'fan_in_wait', 'no_success', 'execution_stalled',
                    'version_unserved', 'degraded_budget'));

