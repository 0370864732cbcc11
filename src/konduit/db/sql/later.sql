-- name: execution_start_many_if_due
-- Start the scheduled executions whose time came (start(run_at=/delay=), migration 0024): each
-- becomes running, so the claim takes its root tasks, which were made ready from that moment;
-- wakes the workers of their queues. Oldest first, skipping rows another pass holds; the
-- status and the time are re-checked in the UPDATE itself, so a cancel that committed first
-- wins.
WITH due AS (
    SELECT id
    FROM konduit_executions
    WHERE status = 'scheduled' AND run_at <= clock_timestamp()
    ORDER BY run_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), started AS (
    UPDATE konduit_executions e
    SET status = 'running'
    FROM due
    WHERE e.id = due.id AND e.status = 'scheduled' AND e.run_at <= clock_timestamp()
    RETURNING e.id
), woken AS (
    SELECT count(pg_notify('konduit_ready', q.queue)) AS queues
    FROM (SELECT DISTINCT t.queue
          FROM konduit_tasks t JOIN started s ON s.id = t.execution_id
          WHERE t.status = 'ready') AS q
)
SELECT coalesce(array_agg(id), '{}') AS started, (SELECT queues FROM woken) AS woken
FROM started;

