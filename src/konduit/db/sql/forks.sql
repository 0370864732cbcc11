-- name: execution_set_forked_if_running
-- A fork just created (in this transaction): where it came from, and how many of its steps
-- have not ended (the copied ones have). Returns its generation and status.
UPDATE konduit_executions
SET forked_from = %(origin_id)s, forked_at_step = %(from_step)s, steps_pending = %(steps_pending)s
WHERE id = %(id)s AND status IN ('pending', 'running')
RETURNING generation, status;

-- name: step_copy_ended_from_origin
-- A fork: its copied steps take the state they ended with in the origin (status, counters and
-- times), read from the origin's step rows (in the hot table or the history).
UPDATE konduit_steps s
SET status = o.status, up_pending = o.up_pending, up_ok = o.up_ok, up_failed = o.up_failed,
    up_required_failed = o.up_required_failed, up_skipped = o.up_skipped,
    tasks_total = o.tasks_total, tasks_pending = o.tasks_pending, tasks_ok = o.tasks_ok,
    tasks_degraded = o.tasks_degraded, tasks_failed = o.tasks_failed,
    first_upstream_at = o.first_upstream_at, last_upstream_at = o.last_upstream_at,
    straggler = o.straggler, fired_at = o.fired_at, ended_at = o.ended_at
FROM konduit_steps_of(%(origin_id)s::uuid) o
WHERE s.execution_id = %(id)s AND o.execution_id = %(origin_id)s AND o.step = s.step
  AND s.step = ANY(%(steps)s::text[]);

-- name: task_copy_ended_from_origin
-- A fork: a task for each task of the origin's copied steps (the latest generation of each
-- item; every item of a map step), ended as it ended there, as the fork's first generation
-- (the origin read in the hot table or the history).
-- plan: custom, as many rows as the copied steps have tasks (a map: every item).
INSERT INTO konduit_tasks
    (execution_id, workflow, step, map_index, generation, item, status, queue, priority, run_at,
     attempt, max_attempts, deadline_seconds, routes, output_hash, error, created_at,
     started_at, finished_at, limited, policy_revision, limit_key)
SELECT %(id)s, t.workflow, t.step, t.map_index, 1, t.item, t.status, t.queue, t.priority,
       t.run_at, t.attempt, t.max_attempts, t.deadline_seconds, t.routes, t.output_hash, t.error,
       t.created_at, t.started_at, t.finished_at, t.limited, t.policy_revision, t.limit_key
FROM (SELECT DISTINCT ON (step, map_index) *
      FROM konduit_tasks_of(%(origin_id)s::uuid)
      WHERE execution_id = %(origin_id)s AND step = ANY(%(steps)s::text[])
      ORDER BY step, map_index, generation DESC) AS t
ORDER BY t.step, t.map_index;

-- name: output_copy_from_origin
-- A fork: the current payload of each task its copied steps took from the origin
-- (task_copy_ended_from_origin), under the same content hash (the origin's in the hot table or
-- the history).
-- plan: custom, as many rows as the copied steps have tasks (a map: every item).
INSERT INTO konduit_outputs (execution_id, step, map_index, content_hash, payload, source)
SELECT t.execution_id, o.step, o.map_index, o.content_hash, o.payload, o.source
FROM konduit_tasks t
JOIN konduit_outputs_of(%(origin_id)s::uuid) o
    ON o.execution_id = %(origin_id)s AND o.step = t.step AND o.map_index = t.map_index
   AND o.content_hash = t.output_hash
WHERE t.execution_id = %(id)s AND t.step = ANY(%(steps)s::text[])
ON CONFLICT DO NOTHING;

-- name: execution_list_forks
-- The forks of one execution, oldest first, with the step each was forked from: in the hot
-- tables or the history (a fork begins after its origin, so only the history's days from the
-- one before the origin's id was made: konduit_executions_since, migration 0047).
SELECT id, status, forked_at_step, created_at
FROM konduit_executions_since(konduit_history_from(%(id)s::uuid))
WHERE forked_from = %(id)s
ORDER BY created_at, id
LIMIT %(limit)s;

-- name: execution_get_fork_origin
-- Where a fork came from: its origin's id and the step (the origin's status is read where the
-- origin is, on its own: execution_get_with_history). No row for an execution that is not a
-- fork.
SELECT forked_from, forked_at_step
FROM konduit_executions_of(%(id)s::uuid)
WHERE id = %(id)s AND forked_from IS NOT NULL;

-- name: output_list_stored_by_execution
-- The payloads of one execution that a payload store keeps, as their envelopes' JSON text (a
-- fork's copies of its origin's, whose objects it then copies under its own name).
-- plan: custom, as many rows as the execution has outputs kept in the store.
SELECT step, map_index, content_hash, payload::text AS envelope
FROM konduit_outputs
WHERE execution_id = %(execution_id)s AND payload ->> '$konduit' = 'stored';

-- name: output_set_envelope
-- Point one output at its own copy of a stored payload.
UPDATE konduit_outputs
SET payload = %(envelope)s::jsonb
WHERE execution_id = %(execution_id)s AND step = %(step)s AND map_index = %(map_index)s
  AND content_hash = %(content_hash)s;
