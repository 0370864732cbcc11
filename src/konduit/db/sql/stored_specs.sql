-- fragment: workflow_head_columns
-- What tells a code-less client whether its cached definition is still the registered one,
-- without the spec: the row's version (xmin: any re-registration that changed it, its input
-- schema included) and the flow limits in force, which change without touching the row.
w.name, w.version, w.spec_hash, w.xmin::text AS row_version,
(SELECT coalesce(jsonb_agg(jsonb_build_array(f.step, f.concurrency, f.rate_count,
                                             f.rate_seconds) ORDER BY f.step), '[]'::jsonb)
 FROM konduit_flow_limits f
 WHERE f.workflow = w.name || '@' || w.version
   AND (f.concurrency IS NOT NULL OR f.rate_count IS NOT NULL)) AS limits

-- name: workflow_get_newest_head
-- The newest registered version of a workflow, for a start by name without a version.
SELECT {{workflow_head_columns}}
FROM konduit_workflows w
WHERE w.name = %(name)s
ORDER BY w.version DESC
LIMIT 1;

-- name: workflow_get_head
-- One registered workflow version, for a start (or repair) of that version.
SELECT {{workflow_head_columns}}
FROM konduit_workflows w
WHERE w.name = %(name)s AND w.version = %(version)s;

-- name: workflow_get_with_input_schema
-- One registered workflow version whole: the spec a code-less client starts it from, and the
-- JSON Schema its input is checked against.
SELECT name, version, spec_hash, spec, input_schema, start_keys
FROM konduit_workflows
WHERE name = %(name)s AND version = %(version)s;

-- name: workflow_list_names
-- The names of every registered workflow, for the message of a start by an unknown name.
SELECT DISTINCT name
FROM konduit_workflows
ORDER BY name;

-- name: workflow_set_input_schema_if_same_hash
-- Store (or clear) the declared input's JSON Schema and the start-time keys (migration 0030)
-- of a workflow version at registration: the latest registration of the same definition sets
-- them, as it sets flow limits; a different definition under the version is refused by the
-- caller and left as it is. A row already so is not rewritten (its xmin, which code-less
-- clients compare, stays).
UPDATE konduit_workflows
SET input_schema = %(input_schema)s, start_keys = %(start_keys)s
WHERE name = %(name)s AND version = %(version)s AND spec_hash = %(spec_hash)s
  AND (input_schema IS DISTINCT FROM %(input_schema)s
       OR start_keys IS DISTINCT FROM %(start_keys)s);
