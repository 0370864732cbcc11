-- fragment: execution_finished_before_cutoff
-- An execution `e` that finished (succeeded, failed, timed out or was cancelled) more than
-- older_than_seconds ago: what a prune deletes and a move into the history takes (both keep
-- the dead letters out on their own terms). Never a child its parent still waits for
-- (konduit_execution_awaited, migration 0046): the waits pass that wakes the parent, should
-- its prompt wake be missed, reads the child's end from the hot tables.
e.finished_at < konduit_now() - make_interval(secs => %(older_than_seconds)s)
  AND e.status IN ('succeeded', 'failed', 'timed_out', 'cancelled')
  AND NOT konduit_execution_awaited(e.id)

-- name: execution_delete_finished_batch_if_still_finished
-- Delete the next batch of executions that finished before the cutoff (oldest first, after the
-- last one deleted), never a pending or running one, nor one holding a dead letter
-- (task_dead_letter, as the dashboard lists them) unless asked.
-- Every row hanging off an execution (steps, tasks, attempts, outputs, output versions, streams
-- and their records) goes with it by ON DELETE CASCADE. The batch is locked SKIP LOCKED, so a
-- concurrent prune takes other rows and a repair that holds an execution is not waited for; the
-- DELETE re-checks the whole condition on the rows it deletes.
WITH doomed AS (
    SELECT e.id
    FROM konduit_executions e
    WHERE {{execution_finished_before_cutoff}}
      AND (%(after_finished_at)s::timestamptz IS NULL
           OR (e.finished_at, e.id) > (%(after_finished_at)s::timestamptz, %(after_id)s::uuid))
      AND (%(include_dead_letters)s::boolean OR NOT EXISTS (
            SELECT 1 FROM konduit_tasks t
            WHERE t.execution_id = e.id AND ({{task_dead_letter}})))
    ORDER BY e.finished_at, e.id
    LIMIT %(batch_size)s
    FOR UPDATE OF e SKIP LOCKED
)
DELETE FROM konduit_executions e
USING doomed d
WHERE e.id = d.id
  AND {{execution_finished_before_cutoff}}
  AND (%(include_dead_letters)s::boolean OR NOT EXISTS (
        SELECT 1 FROM konduit_tasks t
        WHERE t.execution_id = e.id AND ({{task_dead_letter}})))
RETURNING e.id, e.finished_at;

-- name: execution_count_prunable
-- How many executions finished before the cutoff, and how many of them hold a dead letter (a
-- failed task no repair has re-run: task_dead_letter, the dashboard's definition), which prune
-- keeps unless told otherwise. With the executions of the days of history (migration 0041)
-- that ended before the cutoff, which prune drops whole (none holds a dead letter).
SELECT count(*) + (SELECT count(*) FROM konduit_history_executions h
                   WHERE h.history_finished_at < (
                         SELECT max((d + 1)::timestamp AT TIME ZONE 'UTC')
                         FROM konduit_history_days() d
                         WHERE ((d + 1)::timestamp AT TIME ZONE 'UTC')
                               <= konduit_now() - make_interval(secs => %(older_than_seconds)s)))
         AS finished,
       count(*) FILTER (WHERE EXISTS (
            SELECT 1 FROM konduit_tasks t
            WHERE t.execution_id = e.id AND ({{task_dead_letter}}))) AS dead_letters
FROM konduit_executions e
WHERE {{execution_finished_before_cutoff}};

-- name: worker_delete_silent_before
-- Forget workers last heard from before the cutoff, and at least an hour ago: a live worker
-- beats every few seconds, so a short cutoff never forgets one that runs.
DELETE FROM konduit_workers
WHERE last_heartbeat_at < konduit_now() - greatest(make_interval(secs => %(older_than_seconds)s),
                                           interval '1 hour');

-- name: fair_key_delete_stale
-- Forget up to `limit` fair key rows (migration 0027) whose next slot is not ahead of their
-- queue's clock: a start of such a key takes the clock's turn either way. Rows a start holds
-- are skipped; the DELETE re-checks the clock (it only moves on).
WITH stale AS (
    SELECT k.queue, k.fair_key
    FROM konduit_queue_clocks c
    CROSS JOIN LATERAL (
        SELECT k.queue, k.fair_key FROM konduit_fair_keys k
        WHERE k.queue = c.queue AND k.next_slot <= c.fair_turn * 8
        LIMIT %(limit)s
        FOR UPDATE OF k SKIP LOCKED) AS k
    LIMIT %(limit)s
)
DELETE FROM konduit_fair_keys k
USING stale s
WHERE k.queue = s.queue AND k.fair_key = s.fair_key
  AND k.next_slot <= (SELECT c.fair_turn * 8 FROM konduit_queue_clocks c WHERE c.queue = k.queue);
