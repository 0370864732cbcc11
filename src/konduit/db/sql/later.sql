-- name: execution_start_many_if_due
-- Start the scheduled executions whose time came (start(run_at=/delay=), migration 0024): each
-- becomes running, so the claim takes its root tasks, which were made ready from that moment;
-- wakes the workers of their queues. One under Workflow(max_running=) becomes `pending`
-- instead, its ready tasks set aside as execution_hold_many_over_max_running sets them: the
-- slots of its key decide when it runs (execution_start_pending_in_run_slots, which the same
-- maintenance pass runs next), never this statement, which cannot count them after a lock.
-- Oldest first, skipping rows another pass holds; the status and the time are re-checked in
-- the UPDATE itself, so a cancel that committed first wins.
WITH due AS (
    SELECT id
    FROM konduit_executions
    WHERE status = 'scheduled' AND run_at <= konduit_clock_timestamp()
    ORDER BY run_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), started AS (
    UPDATE konduit_executions e
    -- A key whose row is gone (none is retired while a scheduled execution names it) could
    -- never start a pending execution: without one, it starts as before.
    SET status = CASE WHEN EXISTS (SELECT 1 FROM konduit_run_slots s
                                   WHERE s.workflow_name = e.workflow_name AND s.key = e.run_key)
                      THEN 'pending' ELSE 'running' END,
        queued_at = konduit_now()  -- it begins waiting for a slot now, not at its start call
    FROM due
    WHERE e.id = due.id AND e.status = 'scheduled' AND e.run_at <= konduit_clock_timestamp()
    RETURNING e.id, e.status
), set_aside AS (
    UPDATE konduit_tasks t
    SET limited = true, limit_key = NULL, deadline_at = NULL
    FROM started s
    WHERE s.status = 'pending' AND t.execution_id = s.id AND t.status = 'ready'
      AND t.attempt = 0
), woken AS (
    SELECT count(pg_notify('konduit_ready', q.queue)) AS queues
    FROM (SELECT DISTINCT t.queue
          FROM konduit_tasks t JOIN started s ON s.id = t.execution_id
          WHERE s.status = 'running' AND t.status = 'ready') AS q
)
SELECT coalesce(array_agg(id) FILTER (WHERE status = 'running'), '{}') AS started,
       coalesce(array_agg(id) FILTER (WHERE status = 'pending'), '{}') AS pending,
       (SELECT queues FROM woken) AS woken
FROM started;
