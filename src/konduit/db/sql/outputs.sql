-- fragment: latest_task_output_of_steps
-- The outcome and current payload of the task of each of some steps of one execution, none a
-- map: its latest generation (a repair adds one), its payload as JSON text (a big one, what a
-- map fans out over, is decoded off the loop).
SELECT DISTINCT ON (t.step) t.step, t.map_index, t.status, o.payload::text AS payload
FROM konduit_tasks t
LEFT JOIN konduit_outputs o
    ON o.execution_id = t.execution_id AND o.step = t.step AND o.map_index = t.map_index
   AND o.content_hash = t.output_hash
WHERE t.execution_id = %(execution_id)s AND t.step = ANY(%(steps)s::text[])
ORDER BY t.step, t.generation DESC

-- name: output_insert_late_if_attempt_ended_by_deadline
-- Keep a result that arrived after its attempt was ended by the deadline or by a reclaim, for
-- inspection only: it never replaces what the join consumed.
INSERT INTO konduit_outputs (execution_id, step, map_index, content_hash, payload, source)
SELECT t.execution_id, t.step, t.map_index, %(content_hash)s, %(payload)s::jsonb, 'late'
FROM konduit_attempts a
JOIN konduit_tasks t ON t.id = a.task_id
WHERE a.lease_token = %(lease_token)s AND a.outcome IN ('timed_out', 'degraded', 'lost')
ON CONFLICT DO NOTHING;

-- name: output_list_by_execution
-- Every stored payload of one execution, with where it came from and whether it is current.
-- plan: custom, as many rows as the execution has outputs (a map: every item).
SELECT o.step, o.map_index, o.content_hash, o.payload, o.source, o.created_at,
       EXISTS (SELECT 1 FROM konduit_tasks_of(%(execution_id)s::uuid) t
               WHERE t.execution_id = o.execution_id AND t.step = o.step
                 AND t.map_index = o.map_index AND t.output_hash = o.content_hash
                 AND t.generation = (SELECT max(generation) FROM konduit_tasks_of(%(execution_id)s::uuid) t2
                                     WHERE t2.execution_id = o.execution_id AND t2.step = o.step))
           AS current
FROM konduit_outputs_of(%(execution_id)s::uuid) o
WHERE o.execution_id = %(execution_id)s
ORDER BY o.step, o.map_index, o.created_at;

-- name: output_get_for_steps
-- Outcome and current payload of the task of each of some steps none of which is a map: its
-- latest generation (a repair adds one). One task a generation, so a few rows a step under any
-- plan. Payloads as JSON text, so a big one (what a map fans out over) is decoded off the loop.
-- plan: pinned, it runs at every round (or start) and, taking arrays, was re-planned at every run.
{{latest_task_output_of_steps}};

-- name: output_get_for_steps_with_outcomes
-- A task's upstream in one statement, none of its steps a map: how each step ended (its step
-- row, as step_get_outcomes reads it) beside the outcome and current payload of its task's
-- latest generation (as output_get_for_steps reads them). A row a step that has a step row or a
-- task, the other side's columns NULL where it has none; a few rows a step under any plan.
-- plan: pinned, it runs at every round (or start) and, taking arrays, was re-planned at every run.
WITH outcomes AS (
    SELECT step, status
    FROM konduit_steps
    WHERE execution_id = %(execution_id)s AND step = ANY(%(steps)s::text[])
), latest AS (
    {{latest_task_output_of_steps}}
)
SELECT coalesce(l.step, s.step) AS step, s.status AS step_status, l.map_index, l.status,
       l.payload
FROM outcomes s
FULL JOIN latest l ON l.step = s.step
ORDER BY 1;

-- name: output_get_for_steps_wide
-- Outcome and current payload of each task of some steps, one of them a map or more (latest
-- generation), in item order; payloads as JSON text, decoded off the event loop.
-- plan: custom, its row count is the map's width (one item or a million): a generic plan built
-- while the tables were tiny (nested loops over sequential scans) takes minutes at 10,000 items.
WITH latest AS (
    SELECT step, max(generation) AS generation
    FROM konduit_tasks
    WHERE execution_id = %(execution_id)s AND step = ANY(%(steps)s::text[])
    GROUP BY step
)
SELECT t.step, t.map_index, t.status, o.payload::text AS payload
FROM konduit_tasks t
JOIN latest l ON l.step = t.step AND l.generation = t.generation
LEFT JOIN konduit_outputs o
    ON o.execution_id = t.execution_id AND o.step = t.step AND o.map_index = t.map_index
   AND o.content_hash = t.output_hash
WHERE t.execution_id = %(execution_id)s
ORDER BY t.step, t.map_index;
