-- name: execution_insert_many_with_roots
-- Start executions in one statement: each execution row, its steps' join state and its root
-- steps' ready tasks (from the step rows of its workflow, the `template_*` arrays), and one
-- wake-up per queue that got tasks. A request whose idempotency key its workflow already used
-- inserts nothing. Returns the ids of the executions created.
-- An execution whose start (run_at, or now + delay) is in the future is created `scheduled`
-- with its root tasks ready from that moment: the claim takes tasks of running executions only,
-- and the maintenance pass starts it then (execution_start_many_if_due, migration 0024). Each
-- task's priority is its step's plus its execution's.
-- An execution with a fair key (Workflow(fair_by=), migration 0027) takes its root tasks' turns
-- from its key's slots instead of the batch's: see `keyed`.
WITH request AS (
    SELECT *
    FROM unnest(%(ids)s::uuid[], %(workflow_names)s::text[], %(workflow_versions)s::int[],
                -- One text, not a jsonb[]: compact JSON never holds a raw newline, and psycopg
                -- escapes the elements of an array one by one in Python.
                string_to_array(%(inputs)s::text, E'\n'), %(input_hashes)s::text[],
                %(idempotency_keys)s::text[], %(steps_pendings)s::int[],
                %(deadline_ats)s::timestamptz[], %(timeout_seconds)s::float8[],
                -- NULL (no element) when tracing is off: unnest pads a shorter array with NULLs.
                %(traceparents)s::text[], %(tracestates)s::text[],
                -- NULL when no start of the batch has tags.
                %(tags)s::text[], %(run_ats)s::timestamptz[], %(delays)s::float8[],
                %(priorities)s::int[],
                -- NULL when no start of the batch has a fair key.
                %(fair_keys)s::text[])
         WITH ORDINALITY AS r(id, workflow_name, workflow_version, input, input_hash,
                              idempotency_key, steps_pending, deadline_at, timeout_seconds,
                              traceparent, tracestate, tags, run_at, delay, priority, fair_key,
                              ord)
), timed AS MATERIALIZED (
    -- One reading of the clock per execution: its start decides its status and its tasks' run_at.
    SELECT r.*, s.start_at, s.start_at > konduit_clock_timestamp() AS later
    FROM request r
    CROSS JOIN LATERAL (SELECT COALESCE(r.run_at, konduit_clock_timestamp()
                                        + make_interval(secs => r.delay)) AS start_at) AS s
), template AS (
    -- Array literals the client builds once per workflow and reuses.
    SELECT *
    FROM unnest(%(template_names)s::text[], %(template_versions)s::int[],
                %(template_workflows)s::text[], %(template_steps)s::text[],
                %(template_statuses)s::text[], %(template_up_totals)s::int[],
                %(template_tasks_totals)s::int[], %(template_tasks_pendings)s::int[],
                %(template_roots)s::bool[], %(template_queues)s::text[],
                %(template_priorities)s::int[], %(template_max_attempts)s::int[],
                %(template_deadline_seconds)s::float8[], %(template_limiteds)s::bool[],
                %(template_policy_revisions)s::int[])
         WITH ORDINALITY
         AS t(name, version, workflow, step, status, up_total, tasks_total, tasks_pending, root,
              queue, priority, max_attempts, deadline_seconds, limited, policy_revision, ord)
), roots AS MATERIALIZED (
    -- Fair turns (migration 0019): the batch is one flow. Its r-th execution's j-th root is
    -- the ((r - 1) * width + j)-th task of it (width: the most roots a workflow of the batch
    -- has; r counted from first_ordinal, where the batch's earlier statements left off), from
    -- its queue's clock on, so an execution started after a batch of 100,000 is claimed a turn
    -- after the batch's head, not after its last execution.
    SELECT r.*, max(r.roots) OVER () AS width
    FROM (SELECT t.*,
                 count(*) OVER (PARTITION BY t.name, t.version ORDER BY t.ord) - 1 AS nth,
                 count(*) OVER (PARTITION BY t.name, t.version) AS roots,
                 COALESCE((SELECT k.fair_turn FROM konduit_queue_clocks k
                           WHERE k.queue = t.queue), 0) AS clock
          FROM template t
          WHERE t.root) AS r
), key_costs AS (
    -- Fair keys (migration 0027): the executions of a key in this statement, in batch order,
    -- take `width` slots each (an eighth of a turn a root) from the key's next slot on, in each
    -- queue their roots are in. A start later takes turns as an unkeyed one does: its turn,
    -- long past when it is due, is no share of its key's now.
    SELECT q.queue, r.fair_key, q.clock, q.width, count(*) * q.width AS cost
    FROM timed r
    JOIN (SELECT DISTINCT name, version, queue, clock, width FROM roots) AS q
        ON q.name = r.workflow_name AND q.version = r.workflow_version
    WHERE r.fair_key IS NOT NULL AND r.later IS NOT TRUE  -- NULL: no start time given
    GROUP BY q.queue, r.fair_key, q.clock, q.width
), keyed AS (
    -- The key takes them from greatest(its next slot, the clock's first): a key with a backlog
    -- goes on after it, a key with none at the turn being claimed. Its row stays locked until
    -- commit, so the starts of one key take its slots one after the other; rows are taken in
    -- one order (queue, key), and before any idempotency key (see `created`), so two starts
    -- never wait for each other the other way round.
    INSERT INTO konduit_fair_keys AS k (queue, fair_key, next_slot)
    SELECT c.queue, c.fair_key, c.clock * 8 + c.cost
    FROM key_costs c
    ORDER BY c.queue, c.fair_key
    ON CONFLICT (queue, fair_key) DO UPDATE
        -- = greatest(next slot, clock x 8) + cost
        SET next_slot = greatest(k.next_slot + (SELECT c.cost FROM key_costs c
                                                WHERE c.queue = k.queue
                                                  AND c.fair_key = k.fair_key),
                                 excluded.next_slot)
    RETURNING k.queue, k.fair_key, k.next_slot
), key_slots AS (
    -- Where each keyed execution's roots begin: its key's first slot plus its rank among the
    -- key's executions of the statement times the width.
    SELECT r.id, k.queue,
           k.next_slot - c.cost
           + (row_number() OVER (PARTITION BY k.queue, r.fair_key ORDER BY r.ord) - 1)
             * c.width AS first_slot
    FROM timed r
    JOIN key_costs c ON c.fair_key = r.fair_key
    JOIN keyed k ON k.queue = c.queue AND k.fair_key = c.fair_key
    WHERE r.later IS NOT TRUE AND EXISTS (SELECT 1 FROM roots t
                  WHERE t.name = r.workflow_name AND t.version = r.workflow_version
                    AND t.queue = c.queue)
), created AS (
    INSERT INTO konduit_executions
        (id, workflow_name, workflow_version, input, input_hash, idempotency_key, steps_pending,
         deadline_at, timeout_at, traceparent, tracestate, tags, run_at, priority, status,
         fair_key)
    SELECT id, workflow_name, workflow_version, input::jsonb, input_hash, idempotency_key,
           steps_pending, deadline_at,
           -- A hard limit counts from the start (greatest ignores a NULL start_at).
           greatest(start_at, konduit_clock_timestamp()) + make_interval(secs => timeout_seconds),
           traceparent, tracestate, tags::jsonb, start_at, COALESCE(priority, 0),
           CASE WHEN later THEN 'scheduled' ELSE 'running' END, fair_key
    FROM timed
    -- The fair keys first (an InitPlan runs before the first row): see `keyed`.
    WHERE (SELECT count(*) FROM keyed) >= 0
      -- A key whose execution moved into the history (migration 0041) stays taken. The start
      -- holds the key's lock (execution_lock_idempotency_keys, a statement before this one), so
      -- a move of it either committed before this statement's snapshot (its history row is
      -- seen here) or waits for this transaction (its hot row is the conflict below).
      AND (idempotency_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM konduit_history_keys h
            WHERE h.workflow_name = timed.workflow_name
              AND h.idempotency_key = timed.idempotency_key))
    -- Keys are taken in one order by every batch: two batches that share keys wait for each
    -- other instead of deadlocking.
    ORDER BY workflow_name, idempotency_key, id
    ON CONFLICT (workflow_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, workflow_name, workflow_version
), steps AS (
    INSERT INTO konduit_steps
        (execution_id, step, status, up_total, up_pending, tasks_total, tasks_pending, fired_at)
    SELECT c.id, t.step, t.status, t.up_total, t.up_total, t.tasks_total, t.tasks_pending,
           CASE WHEN t.status = 'active' THEN konduit_clock_timestamp() END
    FROM created c JOIN template t ON t.name = c.workflow_name AND t.version = c.workflow_version
), tasks AS (
    -- Unordered: the claim orders an execution's tasks by their execution id, and sorting wide
    -- rows here would spill to disk for a big batch.
    INSERT INTO konduit_tasks
        (execution_id, workflow, generation, step, map_index, queue, priority, max_attempts,
        deadline_seconds, limited, fair_turn, run_at, policy_revision)
    SELECT c.id, t.workflow, 1, t.step, 0, t.queue, t.priority + COALESCE(r.priority, 0),
           t.max_attempts,
           t.deadline_seconds, COALESCE(t.limited, false),
           CASE WHEN s.first_slot IS NULL
                THEN konduit_task_turn(t.clock,
                                       (%(first_ordinal)s::bigint + r.ord - 1) * t.width + t.nth)
                ELSE konduit_slot_turn(s.first_slot + t.nth) END,
           greatest(r.start_at, konduit_now()), t.policy_revision
    FROM created c
    JOIN timed r ON r.id = c.id
    JOIN roots t ON t.name = c.workflow_name AND t.version = c.workflow_version
    LEFT JOIN key_slots s ON s.id = c.id AND s.queue = t.queue
), woken AS (
    -- NOTIFY takes a global lock at commit: once per queue, and only when tasks were made.
    SELECT count(pg_notify('konduit_ready', q.queue)) AS queues
    FROM (SELECT DISTINCT t.queue
          FROM template t
          WHERE t.root AND EXISTS (SELECT 1 FROM created c
                                   WHERE c.workflow_name = t.name
                                     AND c.workflow_version = t.version)) AS q
)
SELECT coalesce(array_agg(id), '{}') AS created, (SELECT queues FROM woken) AS woken
FROM created;

-- name: execution_get_by_idempotency_keys
-- The executions some idempotency keys already started (one key per workflow name each), hot
-- or moved into the history (migration 0041; its keys in konduit_history_keys, migration 0043):
-- the history keeps a key taken.
SELECT e.id, e.workflow_name, e.idempotency_key, e.input_hash
FROM unnest(%(workflow_names)s::text[], %(idempotency_keys)s::text[])
     AS k(workflow_name, idempotency_key)
JOIN konduit_executions e
    ON e.workflow_name = k.workflow_name AND e.idempotency_key = k.idempotency_key
UNION ALL
SELECT h.execution_id, h.workflow_name, h.idempotency_key, h.input_hash
FROM unnest(%(workflow_names)s::text[], %(idempotency_keys)s::text[])
     AS k(workflow_name, idempotency_key)
JOIN konduit_history_keys h
    ON h.workflow_name = k.workflow_name AND h.idempotency_key = k.idempotency_key;

-- name: execution_lock_idempotency_keys
-- Hold the idempotency keys a start is about to use against a move into the history
-- (konduit_history_move takes the same lock without waiting, and skips a key held here): a
-- statement of its own, before the insert, so that the insert's snapshot (READ COMMITTED, taken
-- when it begins) sees a move that committed while this one waited for it. Shared: starts of
-- one key do not wait for each other here (the unique index orders them). Locks are taken in
-- one order (by their number), though a shared lock waits only for a move, which never waits.
SELECT count(pg_advisory_xact_lock_shared(h))::int AS locked
FROM (SELECT DISTINCT konduit_history_key_lock(k.workflow_name, k.idempotency_key) AS h
      FROM unnest(%(workflow_names)s::text[], %(idempotency_keys)s::text[])
           AS k(workflow_name, idempotency_key)
      WHERE k.idempotency_key IS NOT NULL
      ORDER BY 1) AS s;

-- name: execution_window_left_many
-- Seconds left until the window (deadline_at) of new executions, by the database's clock: the
-- budgets of their root tasks are cut by it (konduit.core.budgets).
SELECT id, extract(epoch FROM deadline_at - konduit_clock_timestamp())::float8 AS left_seconds
FROM konduit_executions
WHERE id = ANY(%(ids)s::uuid[]) AND deadline_at IS NOT NULL AND generation = 1;

-- name: task_cut_deadline_many_if_unclaimed
-- Cut the budgets of new root tasks by their execution's window: a cut budget is a moment, so
-- the deadline starts now (as task_insert_many does for the tasks of a join). Only a task still
-- unclaimed, with no deadline set yet.
UPDATE konduit_tasks t
SET deadline_seconds = u.seconds,
    deadline_uncut_seconds = u.uncut,
    deadline_reserve_seconds = u.reserve,
    deadline_at = konduit_clock_timestamp() + make_interval(secs => u.seconds)
FROM unnest(%(execution_ids)s::uuid[], %(steps)s::text[], %(seconds)s::float8[],
            %(uncuts)s::float8[], %(reserves)s::float8[])
     AS u(execution_id, step, seconds, uncut, reserve)
WHERE t.execution_id = u.execution_id AND t.step = u.step
  AND t.generation = 1 AND t.map_index = 0
  AND t.status = 'ready' AND t.attempt = 0 AND t.deadline_at IS NULL;

-- name: fair_key_lock_many
-- Lock the fair key rows (migration 0027) a start_many of several statements will take, in one
-- order (queue, key), before its first statement: each statement locks its own keys in that
-- order, but two batches whose later statements take keys the other's earlier ones took would
-- wait for each other the other way round. A row made here (slot 0) means what no row means.
INSERT INTO konduit_fair_keys AS k (queue, fair_key, next_slot)
SELECT u.queue, u.fair_key, 0
FROM unnest(%(queues)s::text[], %(fair_keys)s::text[]) AS u(queue, fair_key)
ORDER BY u.queue, u.fair_key
ON CONFLICT (queue, fair_key) DO UPDATE SET next_slot = k.next_slot;
