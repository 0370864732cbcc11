-- name: execution_move_to_history_if_still_finished
-- Move the next batch of executions that finished before the cutoff (oldest first, after the
-- last one moved) into the history (migration 0041), never a pending or running one, nor one
-- holding a dead letter (task_dead_letter: it stays where a repair finds it), nor a child its
-- parent still waits for (konduit_execution_awaited, migration 0046). The batch is
-- locked SKIP LOCKED (a prune, a repair or another move holding a row is not waited for), and
-- konduit_history_move re-checks, on the locked rows, that each is still finished and that no
-- start holds its idempotency key.
WITH picked AS (
    SELECT e.id
    FROM konduit_executions e
    WHERE {{execution_finished_before_cutoff}}
      AND (%(after_finished_at)s::timestamptz IS NULL
           OR (e.finished_at, e.id) > (%(after_finished_at)s::timestamptz, %(after_id)s::uuid))
      AND NOT EXISTS (
            SELECT 1 FROM konduit_tasks t
            WHERE t.execution_id = e.id AND ({{task_dead_letter}}))
    ORDER BY e.finished_at, e.id
    LIMIT %(batch_size)s
    FOR UPDATE OF e SKIP LOCKED
)
SELECT m.id, m.finished_at
FROM konduit_history_move(ARRAY(SELECT id FROM picked)) m;

-- name: history_day_list_ended_before
-- The days of history (UTC) that ended before the cutoff: every execution in them finished
-- before it.
SELECT d AS day
FROM konduit_history_days() d
WHERE ((d + 1)::timestamp AT TIME ZONE 'UTC')
      <= konduit_now() - make_interval(secs => %(older_than_seconds)s)
ORDER BY d;

-- name: history_execution_list_ids_of_day
-- The executions one day of history holds (their payloads in a payload store go with them).
SELECT id
FROM konduit_history_executions
WHERE history_finished_at >= (%(day)s::date::timestamp AT TIME ZONE 'UTC')
  AND history_finished_at < ((%(day)s::date + 1)::timestamp AT TIME ZONE 'UTC');

-- name: history_day_drop
-- Drop one day of history, every table's partition of it; returns the executions it held.
SELECT konduit_history_drop_day(%(day)s::date) AS executions;
