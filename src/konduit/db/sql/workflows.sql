-- name: workflow_insert_if_absent
-- Register a workflow version; an existing (name, version) is left as it is (see
-- workflow_update_policy_same_shape for a policy-only change).
WITH inserted AS (
    INSERT INTO konduit_workflows (name, version, spec_hash, spec, shape_hash)
    VALUES (%(name)s, %(version)s, %(spec_hash)s, %(spec)s, %(shape_hash)s)
    ON CONFLICT (name, version) DO NOTHING
    RETURNING name, version, spec_hash, spec, created_at
)
INSERT INTO konduit_workflow_policies (name, version, revision, spec_hash, spec, created_at)
SELECT name, version, 1, spec_hash, spec, created_at FROM inserted;

-- name: workflow_get
-- The registered spec hash of one workflow version.
SELECT name, version, spec_hash, spec, created_at
FROM konduit_workflows
WHERE name = %(name)s AND version = %(version)s;

-- name: workflow_get_for_update
-- One workflow version's registration, locked: a policy change and a concurrent registration of
-- the same version take turns.
SELECT name, version, spec_hash, spec, shape_hash, policy_revision
FROM konduit_workflows
WHERE name = %(name)s AND version = %(version)s
FOR UPDATE;

-- name: workflow_update_policy_same_shape
-- Re-register a version under a new policy: only while the stored definition is still the one
-- read (spec_hash) and has the same shape (shape_hash, or NULL before migration 0022, which the
-- caller compared from the spec); the revision counts up and the old policy stays in history.
WITH updated AS (
    UPDATE konduit_workflows
    SET spec_hash = %(spec_hash)s, spec = %(spec)s, shape_hash = %(shape_hash)s,
        policy_revision = policy_revision + 1, policy_updated_at = konduit_now()
    WHERE name = %(name)s AND version = %(version)s
      AND spec_hash = %(old_spec_hash)s
      AND (shape_hash = %(shape_hash)s OR shape_hash IS NULL)
    RETURNING name, version, spec_hash, spec, policy_revision, policy_updated_at
)
INSERT INTO konduit_workflow_policies (name, version, revision, spec_hash, spec, created_at)
SELECT name, version, policy_revision, spec_hash, spec, policy_updated_at FROM updated
RETURNING revision;

-- name: workflow_list
-- Every registered workflow version.
SELECT name, version, spec_hash, created_at
FROM konduit_workflows
ORDER BY name, version;
