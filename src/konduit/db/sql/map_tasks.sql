-- name: task_insert_map_chunk_if_running
-- Create one chunk of a map step's ready tasks while its execution runs (items: one JSON text
-- per line, indexes counted from first_index); a task that exists already is never made twice.
-- Item i takes fair turn clock + i / 8 (migration 0019): the map gets its share of the queue, and
-- an execution started while it runs is claimed a turn later, not after its last item. The
-- clock is read once per chunk (an InitPlan); a later chunk reads it as far as claims moved it.
INSERT INTO konduit_tasks
    (execution_id, workflow, generation, step, map_index, item, queue, priority, max_attempts,
     deadline_seconds, limited, deadline_uncut_seconds, deadline_reserve_seconds, deadline_at,
     fair_turn, policy_revision)
SELECT e.id, %(workflow)s::text, %(generation)s::int, %(step)s::text,
       %(first_index)s::int + u.ord::int - 1, u.item::jsonb, %(queue)s::text,
       %(priority)s::int + e.priority,  -- the step's plus its execution's (migration 0024)
       %(max_attempts)s::int, %(deadline_seconds)s::float8, COALESCE(%(limited)s::bool, false),
       %(deadline_uncut)s::float8, %(deadline_reserve)s::float8,
       -- A budget the window cut is a moment (see task_insert_many), the same for every item
       -- of every chunk: counted from the transaction's start.
       CASE WHEN %(deadline_uncut)s::float8 IS NOT NULL
            THEN konduit_now() + make_interval(secs => %(deadline_seconds)s::float8) END,
       konduit_task_turn(COALESCE((SELECT k.fair_turn FROM konduit_queue_clocks k
                                   WHERE k.queue = %(queue)s::text), 0),
                         %(first_index)s::int + u.ord - 1),
       %(policy_revision)s::int
FROM konduit_executions e
CROSS JOIN unnest(string_to_array(%(items)s::text, E'\n')) WITH ORDINALITY AS u(item, ord)
WHERE e.id = %(execution_id)s AND e.status = 'running'
ON CONFLICT (execution_id, step, map_index, generation) DO NOTHING;
