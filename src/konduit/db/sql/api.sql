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
