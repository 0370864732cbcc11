-- name: task_insert_map_chunk_if_running
-- Create one chunk of a map step's ready tasks while its execution runs (items: one JSON text
-- per line, indexes counted from first_index); a task that exists already is never made twice.
INSERT INTO konduit_tasks
    (execution_id, workflow, generation, step, map_index, item, queue, priority, max_attempts,
     deadline_seconds)
SELECT e.id, %(workflow)s::text, %(generation)s::int, %(step)s::text,
       %(first_index)s::int + u.ord::int - 1, u.item::jsonb, %(queue)s::text, %(priority)s::int,
       %(max_attempts)s::int, %(deadline_seconds)s::float8
FROM konduit_executions e
CROSS JOIN unnest(string_to_array(%(items)s::text, E'\n')) WITH ORDINALITY AS u(item, ord)
WHERE e.id = %(execution_id)s AND e.status = 'running'
ON CONFLICT (execution_id, step, map_index, generation) DO NOTHING;

-- name: output_get_text_for_steps
-- What a map step fans out over: outcome and current payload, as JSON text to be decoded off the
-- event loop, of each task of its upstream steps (latest generation), in item order.
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
