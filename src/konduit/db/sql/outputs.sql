-- name: output_insert_if_absent
-- Store a payload content-addressed; the same payload twice is a no-op.
INSERT INTO konduit_outputs (execution_id, step, map_index, content_hash, payload)
VALUES (%(execution_id)s, %(step)s, %(map_index)s, %(content_hash)s, %(payload)s)
ON CONFLICT DO NOTHING;

-- name: output_get_for_steps
-- The recorded outcome and current payload of every task of some steps, in item order.
SELECT t.step, t.map_index, t.status, o.payload
FROM konduit_tasks t
LEFT JOIN konduit_outputs o
    ON o.execution_id = t.execution_id AND o.step = t.step AND o.map_index = t.map_index
   AND o.content_hash = t.output_hash
WHERE t.execution_id = %(execution_id)s AND t.step = ANY(%(steps)s::text[])
ORDER BY t.step, t.map_index;
