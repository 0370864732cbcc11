-- name: workflow_list_with_spec
-- Every registered workflow version with its definition (steps, edges, joins).
SELECT name, version, spec_hash, spec, created_at
FROM konduit_workflows
ORDER BY name, version;
