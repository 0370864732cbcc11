-- name: attempt_finish_if_open
-- Close the attempt a lease token identifies with how it ended.
-- sealed: error
UPDATE konduit_attempts
SET finished_at = konduit_clock_timestamp() - make_interval(secs => %(age_seconds)s),
    outcome = %(outcome)s,
    error = %(error)s
WHERE lease_token = %(lease_token)s AND finished_at IS NULL;

-- name: attempt_finish_many_if_open
-- Close the attempts of tasks that just ended, each identified by its lease token, with how they
-- ended; the other open attempt of a hedged task (the one that did not finish first) is closed
-- as outrun, and its worker is told at commit (its lease went with the task's end).
-- sealed: errors
WITH closed AS (
    UPDATE konduit_attempts a
    SET finished_at = konduit_clock_timestamp()
                      - make_interval(secs => CASE WHEN a.lease_token = u.lease_token
                                                   THEN u.age ELSE 0 END),
        outcome = CASE WHEN a.lease_token = u.lease_token THEN u.outcome ELSE 'outrun' END,
        error = CASE WHEN a.lease_token = u.lease_token THEN u.error
                     ELSE 'another attempt of the task finished first' END
    FROM unnest(%(task_ids)s::bigint[], %(lease_tokens)s::uuid[], %(outcomes)s::text[],
                %(errors)s::text[], %(ages)s::float8[]) AS u(task_id, lease_token, outcome, error, age)
    -- One lookup of konduit_attempts_task per task under any plan (LIMIT keeps the subquery from
    -- being flattened; a task has at most two open attempts, its own and its hedge's, among the
    -- handful it ever has). As a plain join, a generic plan built while the table was tiny read
    -- a whole index and hashed it, so each round cost grew with the attempts before it (a
    -- 30,000-item map fell from 1,000 to 270 items/s).
    CROSS JOIN LATERAL (SELECT o.lease_token AS token FROM konduit_attempts o
                        WHERE o.task_id = u.task_id AND o.outcome IS NULL
                        LIMIT 2) AS open_attempt
    -- Re-checked on the row itself (outcome IS NULL is finished_at IS NULL, by the table's
    -- CHECK), found by its key (the lease token: migration 0039). The task id is re-checked
    -- too, so the row is reached through its execution's key (one shard on Citus).
    WHERE a.lease_token = open_attempt.token AND a.task_id = u.task_id AND a.outcome IS NULL
    RETURNING a.lease_token, a.outcome
)
SELECT pg_notify('konduit_outrun', lease_token::text) FROM closed WHERE outcome = 'outrun';

-- name: attempt_finish_open_for_tasks
-- Close the open attempts of tasks that were cancelled.
UPDATE konduit_attempts
SET finished_at = konduit_clock_timestamp(), outcome = %(outcome)s
WHERE task_id = ANY(%(task_ids)s::bigint[]) AND finished_at IS NULL;

-- name: attempt_list_by_execution
-- Every attempt of one execution's tasks, for timelines.
-- plan: custom, as many rows as the execution has attempts (a map: every item).
SELECT a.task_id, t.step, t.map_index, t.generation, a.attempt, a.worker_id, a.started_at,
       a.finished_at, a.outcome, a.error, a.hedge
FROM konduit_attempts_of(%(execution_id)s::uuid) a
JOIN konduit_tasks_of(%(execution_id)s::uuid) t ON t.id = a.task_id
WHERE t.execution_id = %(execution_id)s
ORDER BY a.started_at, a.id;

-- name: step_duration_quantile
-- A quantile of one step's successful attempt durations over a recent window (adaptive
-- deadlines), over its max_samples most recent successful tasks, of the hot tables and of the
-- history (an execution moved with history_after= still counts: a nightly pipeline's history
-- is mostly there). Each side is an index range scan (konduit_tasks_succeeded_by_step, and its
-- copy in the history, migration 0045) of bounded size however long the history; a day of the
-- history that ended before the window cannot hold a task that finished in it (an execution
-- finishes after its tasks), so its partitions are pruned, and an attempt is looked up in its
-- task's own day.
WITH recent AS (
    SELECT *
    FROM ((
        SELECT t.id, t.finished_at, NULL::timestamptz AS history_finished_at
        FROM konduit_tasks t
        WHERE split_part(t.workflow, '@', 1) = %(workflow_name)s
          AND t.step = %(step)s
          AND t.status = 'succeeded'
          -- konduit_now(), not konduit_clock_timestamp(): a stable bound is an index condition,
          -- so the scan stops at the window's start instead of filtering the step's older
          -- successes one by one.
          AND t.finished_at > konduit_now() - make_interval(secs => %(window_seconds)s)
        ORDER BY t.finished_at DESC
        LIMIT %(max_samples)s
    ) UNION ALL (
        SELECT t.id, t.finished_at, t.history_finished_at
        FROM konduit_history_tasks t
        WHERE split_part(t.workflow, '@', 1) = %(workflow_name)s
          AND t.step = %(step)s
          AND t.status = 'succeeded'
          AND t.finished_at > konduit_now() - make_interval(secs => %(window_seconds)s)
          AND t.history_finished_at > konduit_now() - make_interval(secs => %(window_seconds)s)
        ORDER BY t.finished_at DESC
        LIMIT %(max_samples)s
    )) AS both_sides
    ORDER BY finished_at DESC
    LIMIT %(max_samples)s
), durations AS (
    SELECT a.started_at, a.finished_at
    FROM recent r
    JOIN konduit_attempts a ON a.task_id = r.id
    WHERE r.history_finished_at IS NULL
      AND a.outcome = 'succeeded'
    UNION ALL
    SELECT a.started_at, a.finished_at
    FROM recent r
    JOIN konduit_history_attempts a
      ON a.task_id = r.id AND a.history_finished_at = r.history_finished_at
    WHERE a.outcome = 'succeeded'
)
SELECT percentile_cont(%(quantile)s) WITHIN GROUP (
           ORDER BY extract(epoch FROM d.finished_at - d.started_at)) AS seconds,
       count(*) AS samples
FROM durations d
WHERE d.finished_at > konduit_clock_timestamp() - make_interval(secs => %(window_seconds)s);

-- name: attempt_log_insert_many_if_closed
-- Keep what handlers logged during attempts whose end this transaction recorded; an attempt
-- still open (its end was not recorded: lease lost) keeps nothing, and a redelivery adds nothing.
INSERT INTO konduit_attempt_logs (lease_token, records, dropped)
SELECT u.lease_token, u.records::jsonb, u.dropped
FROM unnest(%(lease_tokens)s::uuid[], %(records)s::text[], %(droppeds)s::integer[])
    AS u(lease_token, records, dropped)
JOIN konduit_attempts a ON a.lease_token = u.lease_token AND a.outcome IS NOT NULL
ON CONFLICT (lease_token) DO NOTHING;

-- name: attempt_log_list_by_execution
-- What the handlers of one execution logged, attempt by attempt, oldest first, at most limit
-- attempts (NULL: all).
-- plan: custom, as many rows as the execution has attempts that logged (a map: every item).
SELECT t.step, t.map_index, t.generation, a.attempt, a.started_at, a.outcome, l.records,
       l.dropped
FROM konduit_tasks_of(%(execution_id)s::uuid) t
JOIN konduit_attempts_of(%(execution_id)s::uuid) a ON a.task_id = t.id
JOIN konduit_attempt_logs_of(%(execution_id)s::uuid) l ON l.lease_token = a.lease_token
WHERE t.execution_id = %(execution_id)s
ORDER BY a.started_at, a.id
LIMIT %(limit)s;
