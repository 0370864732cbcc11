-- name: attempt_finish
-- Close one attempt with how it ended.
UPDATE konduit_attempts
SET finished_at = clock_timestamp() - make_interval(secs => %(age_seconds)s),
    outcome = %(outcome)s,
    error = %(error)s
WHERE task_id = %(task_id)s AND attempt = %(attempt)s AND finished_at IS NULL;

-- name: attempt_finish_open_for_tasks
-- Close the open attempts of tasks that were cancelled or reclaimed.
UPDATE konduit_attempts a
SET finished_at = clock_timestamp(), outcome = %(outcome)s
FROM unnest(%(task_ids)s::bigint[], %(attempts)s::int[]) AS u(task_id, attempt)
WHERE a.task_id = u.task_id AND a.attempt = u.attempt AND a.finished_at IS NULL;

-- name: attempt_list_by_execution
-- Every attempt of one execution's tasks, for timelines.
SELECT a.task_id, t.step, t.map_index, a.attempt, a.worker_id, a.started_at, a.finished_at,
       a.outcome, a.error
FROM konduit_attempts a
JOIN konduit_tasks t ON t.id = a.task_id
WHERE t.execution_id = %(execution_id)s
ORDER BY a.started_at;

-- name: attempt_mark_lost
-- An attempt whose worker lost its lease: say so instead of retry/failed.
UPDATE konduit_attempts
SET outcome = 'lost'
WHERE task_id = %(task_id)s AND attempt = %(attempt)s;
