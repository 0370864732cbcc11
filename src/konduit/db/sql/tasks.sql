-- name: task_insert_many
-- Create the ready tasks of steps whose join fired; a task that exists already is never made twice.
INSERT INTO konduit_tasks
    (execution_id, workflow, generation, step, map_index, item, queue, priority, max_attempts,
     deadline_seconds)
SELECT %(execution_id)s, %(workflow)s, %(generation)s, u.step, u.map_index, u.item, u.queue, u.priority,
       u.max_attempts, u.deadline_seconds
FROM unnest(%(steps)s::text[], %(map_indexes)s::int[], %(items)s::jsonb[], %(queues)s::text[],
            %(priorities)s::int[], %(max_attempts)s::int[], %(deadline_seconds)s::float8[])
     AS u(step, map_index, item, queue, priority, max_attempts, deadline_seconds)
ON CONFLICT (execution_id, step, map_index, generation) DO NOTHING;

-- name: task_notify_ready
-- Wake idle workers of a queue; delivered when the transaction commits.
SELECT pg_notify('konduit_ready', %(queue)s);

-- name: task_claim_batch
-- Lease up to `limit` ready tasks of the given queues, skipping rows other workers hold.
WITH picked AS (
    SELECT id
    FROM konduit_tasks
    WHERE status = 'ready' AND queue = ANY(%(queues)s::text[]) AND run_at <= clock_timestamp()
      AND workflow = ANY(%(workflows)s::text[])
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE konduit_tasks t
    SET status = 'running',
        attempt = t.attempt + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
        worker_id = %(worker_id)s,
        started_at = COALESCE(t.started_at, clock_timestamp()),
        -- The budget runs from the first claim and covers every retry of the task.
        deadline_at = COALESCE(t.deadline_at,
                               clock_timestamp() + make_interval(secs => t.deadline_seconds))
    FROM picked
    WHERE t.id = picked.id
    RETURNING t.id, t.execution_id, t.step, t.map_index, t.item, t.attempt, t.max_attempts,
              t.lease_token, t.queue, t.deadline_at, t.generation
), attempts AS (
    INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token)
    SELECT id, attempt, %(worker_id)s, lease_token FROM claimed
)
SELECT c.id, c.execution_id, c.step, c.map_index, c.item, c.attempt, c.max_attempts,
       c.lease_token, c.queue, c.generation, e.workflow_name, e.workflow_version, e.input,
       extract(epoch FROM c.deadline_at - clock_timestamp())::float8 AS deadline_remaining
FROM claimed c
JOIN konduit_executions e ON e.id = c.execution_id;

-- name: task_complete_many_if_leased
-- Record several tasks' outcomes at once, each only while the caller still holds its lease.
UPDATE konduit_tasks t
SET status = u.outcome,
    output_hash = u.output_hash,
    error = u.error,
    routes = CASE WHEN u.routes IS NULL THEN NULL
                  ELSE ARRAY(SELECT jsonb_array_elements_text(u.routes)) END,
    lease_token = NULL,
    lease_expires_at = NULL,
    finished_at = clock_timestamp() - make_interval(secs => u.age)
FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[], %(outcomes)s::text[],
            %(output_hashes)s::text[], %(errors)s::text[], %(routes)s::jsonb[],
            %(ages)s::float8[])
     AS u(id, lease_token, outcome, output_hash, error, routes, age)
WHERE t.id = u.id AND t.lease_token = u.lease_token AND t.status = 'running'
RETURNING t.id, t.finished_at;

-- name: task_retry_if_leased
-- Return a failed attempt's task to ready after a backoff, only while the caller holds its lease.
UPDATE konduit_tasks
SET status = 'ready',
    run_at = clock_timestamp() + make_interval(secs => %(delay_seconds)s),
    error = %(error)s,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(lease_token)s AND status = 'running'
RETURNING id, queue;

-- name: task_release_if_leased
-- Hand a task back unrun (graceful shutdown): ready at once, and the attempt does not count.
UPDATE konduit_tasks
SET status = 'ready',
    run_at = clock_timestamp(),
    attempt = attempt - 1,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(lease_token)s AND status = 'running'
RETURNING id, queue;

-- name: task_list_expired_leases
-- Running tasks whose lease ran out (their worker died or hung), oldest first.
SELECT id, execution_id, lease_token
FROM konduit_tasks
WHERE status = 'running' AND lease_expires_at < clock_timestamp()
ORDER BY lease_expires_at
LIMIT %(limit)s;

-- name: task_cancel_unfinished
-- End the ready and running tasks of a stopped execution; running workers lose their lease.
UPDATE konduit_tasks
SET status = 'cancelled',
    error = %(reason)s,
    lease_token = NULL,
    lease_expires_at = NULL,
    finished_at = clock_timestamp()
WHERE execution_id = %(execution_id)s AND status IN ('ready', 'running')
RETURNING id;

-- name: task_list_by_execution
-- Every task of one execution, in DAG-independent order, for status pages.
SELECT id, step, map_index, generation, status, attempt, max_attempts, worker_id, error,
       routes, deadline_seconds, deadline_at, created_at, started_at, finished_at, run_at
FROM konduit_tasks
WHERE execution_id = %(execution_id)s
ORDER BY id;

-- name: task_list_dead
-- Dead-lettered tasks (retries exhausted or non-retryable), newest first.
SELECT t.id, t.execution_id, e.workflow_name, t.step, t.map_index, t.attempt, t.error,
       t.finished_at
FROM konduit_tasks t
JOIN konduit_executions e ON e.id = t.execution_id
WHERE t.status = 'failed'
ORDER BY t.finished_at DESC
LIMIT %(limit)s;

-- name: task_get_for_reclaim
-- A running task with an expired lease, with what reclaiming it needs.
SELECT t.id, t.execution_id, t.step, t.map_index, t.item, t.attempt, t.max_attempts,
       t.lease_token, t.queue, t.generation, t.worker_id, e.workflow_name, e.workflow_version,
       e.input
FROM konduit_tasks t
JOIN konduit_executions e ON e.id = t.execution_id
WHERE t.id = %(id)s AND t.lease_token = %(lease_token)s AND t.status = 'running'
  AND t.lease_expires_at < clock_timestamp();

-- name: task_list_past_deadline
-- Running tasks past their deadline by more than a grace (their worker died or hung).
SELECT t.id, t.execution_id, t.step, t.map_index, t.item, t.attempt, t.max_attempts,
       t.lease_token, t.queue, t.generation, e.workflow_name, e.workflow_version, e.input,
       0.0::float8 AS deadline_remaining
FROM konduit_tasks t
JOIN konduit_executions e ON e.id = t.execution_id
WHERE t.status = 'running' AND t.deadline_at < clock_timestamp() - make_interval(secs => %(grace_seconds)s)
ORDER BY t.deadline_at
LIMIT %(limit)s;

-- name: task_list_routes_latest
-- The routing choice of each step's latest task (a repair rebuilds join state from it).
SELECT DISTINCT ON (step) step, routes
FROM konduit_tasks
WHERE execution_id = %(execution_id)s
ORDER BY step, generation DESC, map_index;
