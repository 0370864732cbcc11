-- The worker's batched round trips: outcomes of many executions recorded in one transaction
-- (konduit.engine.completer.record_many), and the tasks of one claim started under one lease
-- check (konduit.worker.worker). Each statement takes its rows in id order: DESIGN's global lock
-- order is executions in id order, then tasks in id order, then outputs.

-- name: execution_lock_many_in_id_order
-- Serialize the fan-in decisions of several executions at once, locking their rows in id order
-- (window_left_seconds: as in execution_lock).
SELECT id, workflow_name, workflow_version, status, steps_pending, generation,
       CASE WHEN generation = 1
            THEN extract(epoch FROM deadline_at - konduit_clock_timestamp())::float8 END AS window_left_seconds
FROM konduit_executions
WHERE id = ANY(%(ids)s::uuid[])
ORDER BY id
FOR NO KEY UPDATE;

-- name: output_insert_many_across_executions_if_absent
-- Store payloads of tasks of several executions content-addressed; the same payload twice is a no-op.
INSERT INTO konduit_outputs (execution_id, step, map_index, content_hash, payload, source)
SELECT u.execution_id, u.step, u.map_index, u.content_hash, u.payload::jsonb, u.source
FROM unnest(%(execution_ids)s::uuid[], %(steps)s::text[], %(map_indexes)s::int[],
            %(content_hashes)s::text[], %(payloads)s::text[], %(sources)s::text[])
     AS u(execution_id, step, map_index, content_hash, payload, source)
ORDER BY u.execution_id, u.step, u.map_index
ON CONFLICT DO NOTHING;

-- name: task_hold_many_if_leased
-- Before handlers start: which of these tasks do our leases (or hedge leases) still hold? FOR
-- SHARE, in id order, holds off a cancel until the handlers have started.
-- plan: pinned, it runs at every round (or start) and, taking arrays, was re-planned at every run.
-- The ids are one array searched in the primary key, which yields them in id order (the lock
-- order): joined to an unnest instead, the pinned plan (sorts disabled) walked the whole
-- primary key in id order to avoid sorting a handful of rows, every row of a big history. A
-- lease token is one attempt's: the task's own among ours is the task's lease.
SELECT t.id
FROM konduit_tasks t
WHERE t.id = ANY(%(ids)s::bigint[])
  AND konduit_lease_or_hedge_held_any(t.status, t.lease_token, t.hedge_token,
                                      %(lease_tokens)s::uuid[])
ORDER BY t.id
FOR SHARE OF t;

-- name: step_get_many_across_executions
-- Join state of the steps a round of outcomes touches, of several locked executions at once:
-- each (execution, step) pair addressed by its own key.
-- plan: pinned, it runs at every round (or start) and, taking arrays, was re-planned at every run.
SELECT s.execution_id, s.step, s.status, s.up_pending, s.up_ok, s.up_failed,
       s.up_required_failed, s.up_skipped, s.tasks_total, s.tasks_pending, s.tasks_ok,
       s.tasks_degraded, s.tasks_failed, s.first_upstream_at
FROM unnest(%(execution_ids)s::uuid[], %(steps)s::text[]) AS k(execution_id, step)
JOIN konduit_steps s ON s.execution_id = k.execution_id AND s.step = k.step;

-- name: step_update_many_across_executions
-- Apply the fan-in decisions of a round to the steps they changed, of several executions, in
-- (execution, step) order; fired and ended steps get their timestamps.
-- plan: pinned, it runs at every round (or start) and, taking arrays, was re-planned at every run.
{{steps_updated_from_decisions}};

-- name: step_update_many_across_executions_with_steps_pending
-- step_update_many_across_executions and
-- execution_set_steps_pending_many_if_running_and_changed in one statement: a round whose
-- decisions ended steps writes its step rows and its executions' counts of steps not ended
-- together. The execution rows are the round's own (locked first); the count is written only
-- while the execution runs, and only where it changed.
-- plan: pinned, it runs at every round (or start) and, taking arrays, was re-planned at every run.
WITH written AS (
    {{steps_updated_from_decisions}}
)
UPDATE konduit_executions e
SET steps_pending = c.steps_pending
FROM unnest(%(ids)s::uuid[], %(steps_pendings)s::int[]) AS c(id, steps_pending)
WHERE e.id = c.id AND e.status = 'running' AND e.steps_pending IS DISTINCT FROM c.steps_pending;

-- name: execution_set_steps_pending_many_if_running_and_changed
-- Record how many steps of running executions (one, or a round's several) have not ended; an
-- unchanged count writes no new row version (the execution row is the hottest of a fan-out).
UPDATE konduit_executions e
SET steps_pending = u.steps_pending
FROM unnest(%(ids)s::uuid[], %(steps_pendings)s::int[]) AS u(id, steps_pending)
WHERE e.id = u.id AND e.status = 'running' AND e.steps_pending IS DISTINCT FROM u.steps_pending;

-- fragment: steps_updated_from_decisions
-- The round's fan-in decisions written to the steps they changed, of several executions, in
-- (execution, step) order; fired and ended steps get their timestamps.
UPDATE konduit_steps s
SET {{step_counters_set}},
    first_upstream_at = u.first_upstream_at,
    last_upstream_at = COALESCE(u.last_upstream_at, s.last_upstream_at),
    straggler = COALESCE(u.straggler, s.straggler),
    fired_at = CASE WHEN u.fired THEN konduit_clock_timestamp() ELSE s.fired_at END,
    ended_at = CASE WHEN u.ended THEN konduit_clock_timestamp() ELSE s.ended_at END
FROM unnest(%(execution_ids)s::uuid[], %(steps)s::text[], %(statuses)s::text[],
            %(up_pendings)s::int[], %(up_oks)s::int[], %(up_faileds)s::int[],
            %(up_required_faileds)s::int[], %(up_skippeds)s::int[], %(tasks_totals)s::int[],
            %(tasks_pendings)s::int[], %(tasks_oks)s::int[], %(tasks_degradeds)s::int[],
            %(tasks_faileds)s::int[], %(first_upstream_ats)s::timestamptz[],
            %(last_upstream_ats)s::timestamptz[], %(stragglers)s::text[], %(fireds)s::bool[],
            %(endeds)s::bool[])
     AS u(execution_id, step, status, up_pending, up_ok, up_failed, up_required_failed,
          up_skipped, tasks_total, tasks_pending, tasks_ok, tasks_degraded, tasks_failed,
          first_upstream_at, last_upstream_at, straggler, fired, ended)
WHERE s.execution_id = u.execution_id AND s.step = u.step
