-- Konduit schema, version 22: a definition's shape and its policy (docs/changing-workflows.md).
--
-- A version's shape (steps, edges, joins, maps, wait kinds) is fixed; its policy (retries,
-- deadlines, queue, priority, ...) may be re-registered under the same version. shape_hash is
-- the shape's digest (NULL for a row registered before this migration: the engine computes it
-- from the stored spec); policy_revision counts the policies the version had, each one kept in
-- konduit_workflow_policies with the moment it began to apply, so a task's page shows the
-- policy it was created under.
ALTER TABLE konduit_workflows
    ADD COLUMN shape_hash        text,
    ADD COLUMN policy_revision   integer     NOT NULL DEFAULT 1 CHECK (policy_revision >= 1),
    ADD COLUMN policy_updated_at timestamptz;

CREATE TABLE konduit_workflow_policies (
    name        text        NOT NULL,
    version     integer     NOT NULL,
    revision    integer     NOT NULL CHECK (revision >= 1),
    spec_hash   text        NOT NULL,
    spec        jsonb       NOT NULL,  -- the whole definition: its policy is read from it
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version, revision),
    FOREIGN KEY (name, version) REFERENCES konduit_workflows (name, version) ON DELETE CASCADE
);

-- The revision of its version's policy a task was created with, by the process that created it
-- (which applies the policy it registered): NULL for tasks created before this migration.
ALTER TABLE konduit_tasks ADD COLUMN policy_revision integer CHECK (policy_revision >= 1);

INSERT INTO konduit_workflow_policies (name, version, revision, spec_hash, spec, created_at)
SELECT name, version, 1, spec_hash, spec, created_at FROM konduit_workflows;
