-- fragment: execution_in_list_page
-- An execution (of the hot table or of the history: the same columns) of the list's page:
-- optionally of one status and one workflow, older than the cursor (created_at, id) of the
-- previous page's last row.
(%(status)s::text IS NULL OR status = %(status)s)
AND (%(workflow_name)s::text IS NULL OR workflow_name = %(workflow_name)s)
AND (%(before_at)s::timestamptz IS NULL
     OR (created_at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))

-- name: execution_list_older_than_cursor
-- A page of executions, newest first (execution_in_list_page): keyset paging, stable while new
-- executions arrive. The hot table and the history (migration 0041) alike, in one statement
-- (one snapshot: an execution a move takes meanwhile is listed once); each side a page of its
-- own, merged.
SELECT *
FROM ((
    SELECT id, workflow_name, workflow_version, status, error, idempotency_key, created_at,
           finished_at
    FROM konduit_executions
    WHERE {{execution_in_list_page}}
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
) UNION ALL (
    SELECT id, workflow_name, workflow_version, status, error, idempotency_key, created_at,
           finished_at
    FROM konduit_history_executions
    WHERE {{execution_in_list_page}}
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
)) AS found
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: step_list_degraded_or_failed_for_executions
-- The degraded and failed steps of a page of executions, for the marks on the executions list.
SELECT execution_id, step, status
FROM konduit_steps
WHERE execution_id = ANY(%(ids)s::uuid[])
  AND status IN ('degraded', 'failed', 'timed_out');

-- name: execution_status_many
-- The status of each of a page's executions, for the live status cells of the executions list.
SELECT id, status, error, created_at, finished_at,
       extract(epoch FROM COALESCE(finished_at, konduit_clock_timestamp()) - created_at)::float8 AS took
FROM konduit_executions
WHERE id = ANY(%(ids)s::uuid[]);

-- name: task_list_dead_older_than_cursor
-- A page of dead-lettered tasks no repair re-ran, newest first, older than the cursor
-- (finished_at, id) of the previous page's last row, with their execution's status.
SELECT t.id, t.execution_id, e.workflow_name, e.status AS execution_status, t.step, t.map_index,
       t.attempt, t.error, t.finished_at
FROM konduit_tasks t
JOIN konduit_executions e ON e.id = t.execution_id
WHERE {{task_dead_letter}}
  AND (%(before_at)s::timestamptz IS NULL
       OR (t.finished_at, t.id) < (%(before_at)s::timestamptz, %(before_id)s::bigint))
ORDER BY t.finished_at DESC, t.id DESC
LIMIT %(limit)s;

-- name: task_count_ready_by_queue
-- Queue depth: ready tasks per queue and workflow, how many of them are due (not waiting out a
-- backoff), and how long the oldest due one has waited to be claimed.
SELECT queue, split_part(workflow, '@', 1) AS workflow,
       count(*) AS ready,
       count(*) FILTER (WHERE run_at <= konduit_clock_timestamp()) AS due,
       min(run_at) FILTER (WHERE run_at <= konduit_clock_timestamp()) AS oldest_due_at,
       extract(epoch FROM konduit_clock_timestamp()
               - min(run_at) FILTER (WHERE run_at <= konduit_clock_timestamp()))::float8 AS oldest_age
FROM konduit_tasks
WHERE status = 'ready'
GROUP BY queue, split_part(workflow, '@', 1)
ORDER BY queue, workflow;

-- name: execution_count_running
-- How many executions are running now (the status strip).
SELECT count(*) AS running FROM konduit_executions WHERE status = 'running';

-- name: worker_list_recent_with_liveness
-- Every worker heard from within `since_seconds`: alive (not stopped and heard from within its
-- lease), stopped (shut down cleanly) or dead (silent past its lease without stopping);
-- `leader`: it holds the maintenance lease of its deployment.
SELECT id, hostname, pid, concurrency, queues, workflows, isolation, running, abandoned,
       started_at, last_heartbeat_at, stopped_at, lease_seconds,
       extract(epoch FROM konduit_clock_timestamp() - last_heartbeat_at)::float8 AS heartbeat_age,
       EXISTS (SELECT 1 FROM konduit_leaders l WHERE l.worker_id = konduit_workers.id
                 AND l.expires_at > konduit_clock_timestamp()) AS leader,
       CASE WHEN stopped_at IS NOT NULL THEN 'stopped'
            WHEN last_heartbeat_at > konduit_clock_timestamp() - make_interval(secs => lease_seconds)
            THEN 'alive'
            ELSE 'dead' END AS state
FROM konduit_workers
WHERE last_heartbeat_at > konduit_clock_timestamp() - make_interval(secs => %(since_seconds)s)
ORDER BY stopped_at IS NOT NULL, hostname, started_at;

-- name: attempt_list_open_with_worker
-- The attempts running now (hedges included), with the worker running each, for the workers page:
-- found through the running tasks (konduit_tasks_running) and their leases, so the read does not
-- grow with the history of finished attempts.
SELECT a.worker_id, t.id AS task_id, t.execution_id, t.step, t.map_index, a.attempt, a.hedge,
       a.started_at,
       extract(epoch FROM konduit_clock_timestamp() - a.started_at)::float8 AS running_for
FROM konduit_tasks t
JOIN konduit_attempts a ON a.lease_token = t.lease_token OR a.lease_token = t.hedge_token
WHERE t.status = 'running' AND a.outcome IS NULL
ORDER BY a.worker_id, a.started_at
LIMIT %(limit)s;

-- name: attempt_list_by_execution_except_steps
-- Every attempt of one execution's tasks except those of the given (map) steps, which the
-- execution page shows as one summary row each.
SELECT a.task_id, t.step, t.map_index, t.generation, a.attempt, a.worker_id, a.started_at,
       a.finished_at, a.outcome, a.error, a.hedge
FROM konduit_attempts_of(%(execution_id)s::uuid) a
JOIN konduit_tasks_of(%(execution_id)s::uuid) t ON t.id = a.task_id
WHERE t.execution_id = %(execution_id)s
  AND NOT (t.step = ANY(%(steps)s::text[]))
ORDER BY a.started_at, a.id;

-- name: task_summarize_by_step
-- One row per step and generation of the given steps of an execution: how many tasks in each
-- status, their tries, and the spread of the finished ones' durations, for collapsed map steps;
-- `creating`: its items still waiting in chunks to be created (migration 0032).
SELECT step, generation, count(*) AS tasks, sum(attempt) AS tries,
       (SELECT coalesce(sum(c.item_count), 0) FROM konduit_map_chunks_of(%(execution_id)s::uuid) c
        WHERE c.execution_id = %(execution_id)s AND c.step = t.step
          AND c.generation = t.generation)::bigint AS creating,
       count(*) FILTER (WHERE status = 'ready') AS ready,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'degraded') AS degraded,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'timed_out') AS timed_out,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE status = 'skipped') AS skipped,
       min(started_at) AS first_started_at, max(finished_at) AS last_finished_at,
       percentile_cont(0.5) WITHIN GROUP (
           ORDER BY extract(epoch FROM finished_at - started_at)) AS p50,
       percentile_cont(0.95) WITHIN GROUP (
           ORDER BY extract(epoch FROM finished_at - started_at)) AS p95,
       max(extract(epoch FROM finished_at - started_at))::float8 AS longest
FROM konduit_tasks_of(%(execution_id)s::uuid) t
WHERE execution_id = %(execution_id)s AND step = ANY(%(steps)s::text[])
GROUP BY step, generation
ORDER BY step, generation;

-- name: task_list_by_step_page
-- A page of one step's tasks (a map step's items) in item order, optionally of one status, from
-- the given map index on, with how long each took.
SELECT id, map_index, generation, status, attempt, max_attempts, worker_id, item, error,
       started_at, finished_at,
       extract(epoch FROM COALESCE(finished_at, konduit_clock_timestamp()) - started_at)::float8 AS took
FROM konduit_tasks_of(%(execution_id)s::uuid)
WHERE execution_id = %(execution_id)s AND step = %(step)s
  AND generation = (SELECT max(generation) FROM konduit_tasks_of(%(execution_id)s::uuid)
                    WHERE execution_id = %(execution_id)s AND step = %(step)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND map_index >= %(from_index)s
ORDER BY map_index
LIMIT %(limit)s;

-- name: attempt_list_failed_by_execution
-- The attempts of one execution that ended with an error (failed, retried, timed out, lost...),
-- with the full error text, at most `per_step` per step, for the tracebacks on its page.
SELECT task_id, step, map_index, generation, attempt, outcome, error, worker_id, started_at,
       finished_at, failed_in_step
FROM (
    SELECT a.task_id, t.step, t.map_index, t.generation, a.attempt, a.outcome, a.error,
           a.worker_id, a.started_at, a.finished_at,
           row_number() OVER (PARTITION BY t.step ORDER BY a.started_at, a.id) AS nth,
           count(*) OVER (PARTITION BY t.step) AS failed_in_step
    FROM konduit_attempts_of(%(execution_id)s::uuid) a
    JOIN konduit_tasks_of(%(execution_id)s::uuid) t ON t.id = a.task_id
    WHERE t.execution_id = %(execution_id)s AND a.error IS NOT NULL
) failed
WHERE nth <= %(per_step)s
ORDER BY started_at, step, map_index, attempt;

-- name: task_list_budgets_by_execution
-- Each step's time budget in an execution's latest generation (a map step: its items' longest),
-- and, when the execution's window cut it, the step's own budget and the reserve kept free.
SELECT DISTINCT ON (step) step, deadline_seconds, deadline_uncut_seconds, deadline_reserve_seconds
FROM konduit_tasks_of(%(execution_id)s::uuid)
WHERE execution_id = %(execution_id)s AND deadline_seconds IS NOT NULL
ORDER BY step, generation DESC, deadline_seconds DESC;
