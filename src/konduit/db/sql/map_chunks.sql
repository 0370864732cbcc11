-- name: map_chunk_insert
-- Keep one chunk of a map step's items to be created later (migration 0032), with the facts
-- its tasks take from the fan-in that fired the step: a budget the window cut is a moment,
-- counted from this transaction's start, as the first chunk's tasks count it.
INSERT INTO konduit_map_chunks
    (execution_id, step, generation, first_index, item_count, items, queue, priority,
     max_attempts, deadline_seconds, limited, policy_revision, deadline_uncut_seconds,
     deadline_reserve_seconds, deadline_at)
VALUES (%(execution_id)s, %(step)s, %(generation)s, %(first_index)s, %(item_count)s,
        %(items)s, %(queue)s, %(priority)s, %(max_attempts)s, %(deadline_seconds)s::float8,
        COALESCE(%(limited)s::bool, false), %(policy_revision)s, %(deadline_uncut)s::float8,
        %(deadline_reserve)s::float8,
        CASE WHEN %(deadline_uncut)s::float8 IS NOT NULL
             THEN konduit_now() + make_interval(secs => %(deadline_seconds)s::float8) END)
ON CONFLICT (execution_id, step, generation, first_index) DO NOTHING;

-- name: map_chunk_notify_pending
-- Wake the workers' chunk takers: a fan-in left chunks of items to create (sent at commit).
SELECT pg_notify('konduit_map_chunks', '');

-- name: map_chunk_take_next
-- The oldest chunk no other taker holds, locked, with whether its execution still runs the
-- chunk's generation. The execution row is locked FOR SHARE (waited for, not skipped): an
-- execution that ends (or a completion round of it) holds it FOR NO KEY UPDATE, so the chunk's
-- tasks are created either before the end, which then cancels them, or not at all. An end
-- skips the chunk rows a taker holds; the taker deletes its own once it sees the end.
SELECT c.id, c.execution_id, c.step, c.first_index, c.item_count,
       e.status = 'running' AND e.generation = c.generation AS live
FROM konduit_map_chunks c
JOIN konduit_executions e ON e.id = c.execution_id
ORDER BY c.id
LIMIT 1
FOR UPDATE OF c SKIP LOCKED
FOR SHARE OF e;

-- name: task_insert_map_chunk_taken
-- Create the tasks of a chunk taken (map_chunk_take_next) and delete the chunk, in one
-- statement: committed, the items exist and the chunk does not; rolled back, neither changed.
-- Guarded like task_insert_map_chunk_if_running: only while the execution runs the chunk's
-- generation (a chunk of an execution that ended is deleted and creates nothing), a task that
-- exists already is never made twice. The workflow key is the execution's now: a migration
-- relabels the tasks created so far and moves the execution, the chunks follow it. Wakes the
-- chunk's queue when it made tasks.
WITH chunk AS (
    DELETE FROM konduit_map_chunks WHERE id = %(id)s
    RETURNING *
), made AS (
    INSERT INTO konduit_tasks
        (execution_id, workflow, generation, step, map_index, item, queue, priority,
         max_attempts, deadline_seconds, limited, deadline_uncut_seconds,
         deadline_reserve_seconds, deadline_at, fair_turn, policy_revision)
    SELECT c.execution_id, e.workflow_name || '@' || e.workflow_version, c.generation, c.step,
           c.first_index + u.ord::int - 1, u.item::jsonb, c.queue, c.priority + e.priority,
           c.max_attempts, c.deadline_seconds, c.limited, c.deadline_uncut_seconds,
           c.deadline_reserve_seconds, c.deadline_at,
           -- Turns as task_insert_map_chunk_if_running counts them: the clock as claims moved it.
           konduit_task_turn(k.clock, c.first_index + u.ord - 1),
           c.policy_revision
    FROM chunk c
    JOIN konduit_executions e
      ON e.id = c.execution_id AND e.status = 'running' AND e.generation = c.generation
    -- The clock read once for the chunk, not once per item.
    CROSS JOIN LATERAL (SELECT COALESCE((SELECT q.fair_turn FROM konduit_queue_clocks q
                                         WHERE q.queue = c.queue), 0)) AS k(clock)
    CROSS JOIN LATERAL unnest(string_to_array(c.items, E'\n')) WITH ORDINALITY AS u(item, ord)
    ON CONFLICT (execution_id, step, map_index, generation) DO NOTHING
    RETURNING 1
), counted AS (
    SELECT count(*) AS made FROM made
)
SELECT n.made,
       (SELECT count(pg_notify('konduit_ready', c.queue)) FROM chunk c WHERE n.made > 0) AS woken
FROM counted n;

-- name: map_chunk_delete_for_execution
-- An execution ended: its chunks of items not yet created go (a chunk a taker holds is skipped:
-- that taker sees the end and deletes it).
DELETE FROM konduit_map_chunks
WHERE id IN (SELECT c.id FROM konduit_map_chunks c WHERE c.execution_id = %(execution_id)s
             FOR UPDATE SKIP LOCKED);
