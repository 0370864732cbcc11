-- Konduit schema, version 8: hedged attempts.
-- A task of a step with `hedge=` may run a second attempt beside a straggling one. The task row
-- keeps its primary lease (lease_token, lease_expires_at, worker_id); the hedge is a second lease
-- on the same row. Whichever attempt completes first ends the task through the lease fence, which
-- accepts either token; the other's lease is gone with it.

ALTER TABLE konduit_tasks
    ADD COLUMN hedge_token       uuid,
    ADD COLUMN hedge_expires_at  timestamptz,
    ADD COLUMN hedge_worker_id   text,
    -- The attempt number that was hedged: at most one hedge per attempt, even after the hedge
    -- ended (dropped, or promoted to the primary lease).
    ADD COLUMN hedged_attempt    integer,
    -- A hedge is a lease beside a primary lease of a running task, never alone, never the same.
    ADD CONSTRAINT konduit_tasks_hedge_lease CHECK (
        (hedge_token IS NULL) = (hedge_expires_at IS NULL)
        AND (hedge_token IS NULL OR (status = 'running' AND lease_token IS NOT NULL
                                     AND hedge_token <> lease_token
                                     AND hedged_attempt = attempt)));

ALTER TABLE konduit_attempts
    ADD COLUMN hedge boolean NOT NULL DEFAULT false;

-- Two new ways an attempt of a hedged task ends without deciding it:
--   outrun  - the other attempt ended the task first (its lease was fenced off);
--   dropped - it ended (raised, was handed back, or its worker vanished) while the other
--             attempt ran on, so the survivor decides the task.
ALTER TABLE konduit_attempts DROP CONSTRAINT konduit_attempts_outcome_check;
ALTER TABLE konduit_attempts ADD CONSTRAINT konduit_attempts_outcome_check
    CHECK (outcome IN ('succeeded', 'degraded', 'timed_out', 'failed', 'cancelled', 'retry',
                       'lost', 'released', 'outrun', 'dropped'));

-- At most one open primary attempt and one open hedge per task (was: one open attempt).
DROP INDEX konduit_attempts_open;
CREATE UNIQUE INDEX konduit_attempts_open ON konduit_attempts (task_id, hedge)
    WHERE finished_at IS NULL;

-- Hedge rescue: tasks whose hedge lease ran out.
CREATE INDEX konduit_tasks_hedged ON konduit_tasks (hedge_expires_at)
    WHERE hedge_token IS NOT NULL;
