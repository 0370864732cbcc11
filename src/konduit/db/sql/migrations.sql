-- name: step_list_for_migration
-- Every step row of one execution with when it ended and whether any task of it exists (in any
-- generation: map items, waits and fallbacks are tasks too): the past a migration keeps.
SELECT s.step, s.status, s.ended_at,
       EXISTS (SELECT 1 FROM konduit_tasks t
               WHERE t.execution_id = s.execution_id AND t.step = s.step) AS has_tasks
FROM konduit_steps s
WHERE s.execution_id = %(execution_id)s
ORDER BY s.step;

-- name: task_relabel_unfinished_in_id_order
-- A migration moves the ready, running and waiting tasks of an execution to the target version,
-- so that only workers serving it claim them. Rows are locked in id order, the order every
-- multi-row task write takes. Returns each running task, saying whether the live worker (and
-- hedge worker) holding it serves the target (NULL: the worker is unknown or stopped), and one
-- row per queue that has ready tasks now (step NULL): a map's million items return a few rows.
-- plan: custom, as many rows as the execution has unfinished tasks (a map: every item).
WITH moving AS (
    SELECT id FROM konduit_tasks
    WHERE execution_id = %(execution_id)s AND status IN ('ready', 'running', 'waiting')
    ORDER BY id
    FOR NO KEY UPDATE
), moved AS (
    UPDATE konduit_tasks t
    SET workflow = %(workflow)s
    FROM moving
    WHERE t.id = moving.id AND t.status IN ('ready', 'running', 'waiting')
    RETURNING t.step, t.status, t.queue, t.worker_id, t.hedge_worker_id
)
SELECT m.step, m.status, m.queue, m.worker_id, m.hedge_worker_id,
    (SELECT %(workflow)s = ANY (w.workflows) FROM konduit_workers w
     WHERE w.id = m.worker_id AND w.stopped_at IS NULL) AS worker_serves,
    (SELECT %(workflow)s = ANY (w.workflows) FROM konduit_workers w
     WHERE w.id = m.hedge_worker_id AND w.stopped_at IS NULL) AS hedge_worker_serves
FROM moved m
WHERE m.status = 'running'
UNION ALL
SELECT DISTINCT NULL, 'ready', m.queue, NULL, NULL, NULL::bool, NULL::bool
FROM moved m
WHERE m.status = 'ready';

-- name: step_delete_many_if_waiting
-- A migration drops the steps of the old version that never started (still waiting).
DELETE FROM konduit_steps
WHERE execution_id = %(execution_id)s AND step = ANY (%(steps)s::text[]) AND status = 'waiting';

-- name: step_upsert_many_if_unstarted
-- A migration writes the rebuilt join state of every step of the target version that has not
-- started: a new step gets its row, an existing one is rewritten only while it still waits.
-- Active rows fire now (their tasks are created in the same transaction); skipped ones end now.
INSERT INTO konduit_steps AS s
    (execution_id, step, status, up_total, up_pending, up_ok, up_failed, up_required_failed,
     up_skipped, tasks_total, tasks_pending, tasks_ok, tasks_degraded, tasks_failed,
     first_upstream_at, fired_at, ended_at)
SELECT %(execution_id)s, u.step, u.status, u.up_total, u.up_pending, u.up_ok, u.up_failed,
       u.up_required_failed, u.up_skipped, u.tasks_total, u.tasks_pending, u.tasks_ok,
       u.tasks_degraded, u.tasks_failed, u.first_upstream_at,
       CASE WHEN u.status = 'active' THEN clock_timestamp() END,
       CASE WHEN u.status NOT IN ('waiting', 'active') THEN clock_timestamp() END
FROM unnest(%(steps)s::text[], %(statuses)s::text[], %(up_totals)s::int[], %(up_pendings)s::int[],
            %(up_oks)s::int[], %(up_faileds)s::int[], %(up_required_faileds)s::int[],
            %(up_skippeds)s::int[], %(tasks_totals)s::int[], %(tasks_pendings)s::int[],
            %(tasks_oks)s::int[], %(tasks_degradeds)s::int[], %(tasks_faileds)s::int[],
            %(first_upstream_ats)s::timestamptz[])
     AS u(step, status, up_total, up_pending, up_ok, up_failed, up_required_failed, up_skipped,
          tasks_total, tasks_pending, tasks_ok, tasks_degraded, tasks_failed, first_upstream_at)
ON CONFLICT (execution_id, step) DO UPDATE
SET status = EXCLUDED.status, up_total = EXCLUDED.up_total, up_pending = EXCLUDED.up_pending,
    up_ok = EXCLUDED.up_ok, up_failed = EXCLUDED.up_failed,
    up_required_failed = EXCLUDED.up_required_failed, up_skipped = EXCLUDED.up_skipped,
    tasks_total = EXCLUDED.tasks_total, tasks_pending = EXCLUDED.tasks_pending,
    tasks_ok = EXCLUDED.tasks_ok, tasks_degraded = EXCLUDED.tasks_degraded,
    tasks_failed = EXCLUDED.tasks_failed, first_upstream_at = EXCLUDED.first_upstream_at,
    last_upstream_at = NULL, straggler = NULL,
    fired_at = EXCLUDED.fired_at, ended_at = EXCLUDED.ended_at
WHERE s.status = 'waiting';

-- name: execution_migrate_if_running_at_version
-- Move a running execution to another version of its workflow with its new count of unended
-- steps; only while it still runs at the version the migration planned from.
UPDATE konduit_executions
SET workflow_version = %(to_version)s, steps_pending = %(steps_pending)s
WHERE id = %(id)s AND status = 'running' AND workflow_version = %(from_version)s
RETURNING id;

-- name: execution_list_running_of_version
-- The running executions of one workflow version, oldest first (`konduit migrate-executions --workflow`).
-- plan: custom, as many rows as that version has running executions.
SELECT id
FROM konduit_executions
WHERE status = 'running' AND workflow_name = %(workflow_name)s
  AND workflow_version = %(workflow_version)s
ORDER BY created_at, id;

-- name: task_list_routes_latest_of_steps
-- The routing choice of the latest task of each of these (plain) steps: a migration counts an
-- edge a step routed away from as skipped. Each step's latest task is one index probe.
SELECT u.step, r.routes
FROM unnest(%(steps)s::text[]) AS u(step)
CROSS JOIN LATERAL (
    SELECT t.routes FROM konduit_tasks t
    WHERE t.execution_id = %(execution_id)s AND t.step = u.step
    ORDER BY t.generation DESC, t.map_index
    LIMIT 1
) r;
