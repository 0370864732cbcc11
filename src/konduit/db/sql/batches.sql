-- The worker's batched round trips: outcomes of many executions recorded in one transaction
-- (konduit.engine.completer.record_many), and the tasks of one claim started under one lease
-- check (konduit.worker.worker). Each statement takes its rows in id order: DESIGN's global lock
-- order is executions in id order, then tasks in id order, then outputs.

-- name: execution_lock_many_in_id_order
-- Serialize the fan-in decisions of several executions at once, locking their rows in id order.
SELECT id, workflow_name, workflow_version, status, steps_pending, generation
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
SELECT t.id
FROM konduit_tasks t
JOIN unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[]) AS u(id, lease_token)
  ON t.id = u.id AND u.lease_token = ANY(ARRAY[t.lease_token, t.hedge_token])
WHERE t.status = 'running'
ORDER BY t.id
FOR SHARE OF t;
