-- name: workflow_insert_if_absent
-- Register a workflow version; an existing (name, version) is left as it is.
INSERT INTO konduit_workflows (name, version, spec_hash, spec)
VALUES (%(name)s, %(version)s, %(spec_hash)s, %(spec)s)
ON CONFLICT (name, version) DO NOTHING;

-- name: workflow_get
-- The registered spec hash of one workflow version.
SELECT name, version, spec_hash, spec, created_at
FROM konduit_workflows
WHERE name = %(name)s AND version = %(version)s;

-- name: workflow_list
-- Every registered workflow version.
SELECT name, version, spec_hash, created_at
FROM konduit_workflows
ORDER BY name, version;
