-- name: workflow_get_newest_head
-- The newest registered version of a workflow and its spec hash (not the spec): whether a
-- code-less client's cached definition is still the registered one.
SELECT name, version, spec_hash
FROM konduit_workflows
WHERE name = %(name)s
ORDER BY version DESC
LIMIT 1;

-- name: workflow_get_head
-- One registered workflow version's spec hash (not the spec), for the same check.
SELECT name, version, spec_hash
FROM konduit_workflows
WHERE name = %(name)s AND version = %(version)s;

-- name: workflow_get_with_input_schema
-- One registered workflow version whole: the spec a code-less client starts it from, and the
-- JSON Schema its input is checked against.
SELECT name, version, spec_hash, spec, input_schema
FROM konduit_workflows
WHERE name = %(name)s AND version = %(version)s;

-- name: workflow_list_names
-- The names of every registered workflow, for the message of a start by an unknown name.
SELECT DISTINCT name
FROM konduit_workflows
ORDER BY name;

-- name: workflow_set_input_schema_if_same_hash
-- Store (or clear) the declared input's JSON Schema of a workflow version at registration: the
-- latest registration of the same definition sets it, as it sets flow limits; a different
-- definition under the version is refused by the caller and left as it is.
UPDATE konduit_workflows
SET input_schema = %(input_schema)s
WHERE name = %(name)s AND version = %(version)s AND spec_hash = %(spec_hash)s
  AND input_schema IS DISTINCT FROM %(input_schema)s;

-- name: flow_limit_list_set_for_workflow
-- The steps of one workflow version with a flow limit in force: a code-less start marks their
-- root tasks limited, so the claim enforces the limit as for a start by the App.
SELECT step, concurrency, rate_count, rate_seconds
FROM konduit_flow_limits
WHERE workflow = %(workflow)s AND (concurrency IS NOT NULL OR rate_count IS NOT NULL);
