-- name: execution_list_before
-- One page of executions for the HTTP API, newest first, strictly after the cursor (created_at, id).
-- The keyset makes pages stable under inserts: a new execution never shifts the next page.
SELECT id, workflow_name, workflow_version, status, error, idempotency_key, created_at,
       finished_at
FROM konduit_executions
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(workflow_name)s::text IS NULL OR workflow_name = %(workflow_name)s)
  AND (%(before_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: execution_status_list_by_ids
-- The status of each of these executions (just started through the HTTP API).
SELECT id, status
FROM konduit_executions
WHERE id = ANY(%(ids)s::uuid[]);

-- name: workflow_list_with_spec
-- Every registered workflow version with its definition (steps, edges, joins).
SELECT name, version, spec_hash, spec, created_at
FROM konduit_workflows
ORDER BY name, version;
