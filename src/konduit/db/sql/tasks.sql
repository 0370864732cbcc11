-- Every statement that sets a task's status (its lifecycle: engine/transitions.py), and the
-- task statements beside them. Fragments first: the pieces several statements share.

-- fragment: claimed_row
-- The columns of a task attempt the runtime holds (core.model.TaskAttempt.from_row reads every
-- one), over the task row `t` (a claimed CTE or konduit_tasks) and its execution `e`. Each
-- statement adds what it knows of the attempt as it reads it: deadline_remaining, hedged and
-- fallback_age (test_queries_fitness checks every statement that includes this returns them).
t.id, t.execution_id, t.step, t.map_index, t.item, t.attempt, t.max_attempts,
t.lease_token, t.queue, t.generation, t.policy_revision,
{{claimed_execution}}

-- fragment: claimed_execution
-- The columns of its execution `e` a task attempt carries: in claimed_row, and in the claims'
-- lookup of each claimed task's execution (one list, so a column added reaches every claim).
e.workflow_name, e.workflow_version, e.input, e.scheduled_at

-- fragment: task_dead_letter
-- The task `t` is a dead letter: it failed (retries exhausted or non-retryable) and no repair
-- re-ran its step, i.e. no newer generation of the step started (the failed task stays in the
-- execution's history). A repair created but never started (cancelled first) re-ran nothing.
-- The dead letters' list, the dashboard's page of them and retention (which keeps an execution
-- holding one) share it.
t.status = 'failed'
AND NOT EXISTS (SELECT 1 FROM konduit_tasks n
                WHERE n.execution_id = t.execution_id AND n.step = t.step
                  AND n.generation > t.generation AND n.started_at IS NOT NULL)

-- fragment: lease_cleared
-- The SET list that takes a task's (primary) lease away.
lease_token = NULL,
lease_expires_at = NULL

-- fragment: hedge_cleared
-- The SET list that takes a task's hedge lease away (docs/hedging.md).
hedge_token = NULL,
hedge_expires_at = NULL,
hedge_worker_id = NULL

-- fragment: execution_running
-- The task's execution still runs: re-checked by every claim, not trusted from when the task
-- was made ready (a cancel commits its tasks' status in the same transaction, but a claim must
-- never outrun it). A lookup by primary key per candidate, whatever the statistics say (a
-- semi-join may scan every running execution for every candidate when they are stale).
(SELECT e.status = 'running' FROM konduit_executions e WHERE e.id = t.execution_id)

-- fragment: ready_tasks_of_queue_and_workflow
-- A claim's unlimited candidates: one index scan per (queue `q`, workflow version `w`) on
-- konduit_tasks_ready, in its order, stopping after `limit` rows.
SELECT t.id, t.priority, t.fair_turn, t.execution_id, t.workflow, t.step, false AS limited
FROM konduit_tasks t
WHERE t.status = 'ready' AND t.queue = q.name AND t.workflow = w.name
  -- A limited step's tasks are claimed only under its flow row's lock
  -- (task_claim_batch_flow_limited); false for every other task.
  AND NOT t.limited
  AND t.run_at <= konduit_clock_timestamp()
  AND {{execution_running}}
ORDER BY t.priority, t.fair_turn, t.execution_id, t.id
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

-- fragment: task_row_unheld
-- A rescue takes no row another transaction holds: it may be the holder's own (a join's start
-- reading a wide upstream holds its task), which then extends the lease itself. (A lock
-- clause, so not a function: a SQL function with one is never inlined.)
t.id = (SELECT id FROM konduit_tasks WHERE id = %(id)s FOR NO KEY UPDATE SKIP LOCKED)

-- fragment: queue_clocks_moved
-- The CTEs that end a claim: each queue's clock moves to the latest fair turn the `claimed`
-- CTE took (migration 0019). A clock another claim holds is skipped, never waited for: that
-- claim moves it.
reached AS (
    SELECT queue, max(fair_turn) AS fair_turn FROM claimed GROUP BY queue
), clock_held AS (
    SELECT qc.queue, r.fair_turn
    FROM konduit_queue_clocks qc JOIN reached r ON r.queue = qc.queue
    WHERE qc.fair_turn < r.fair_turn
    FOR UPDATE OF qc SKIP LOCKED
), clock_moved AS (
    UPDATE konduit_queue_clocks qc SET fair_turn = greatest(qc.fair_turn, h.fair_turn)
    FROM clock_held h WHERE qc.queue = h.queue
)

-- name: task_insert_many
-- Create the ready tasks of steps whose join fired; a task that exists already is never made twice.
-- A budget the execution's window cut (deadline_uncut set) is a moment: its deadline starts now.
-- They take their fair turns from their queue's clock on, 8 a turn (migration 0019).
-- A task's priority is its step's plus its execution's (start(priority=), migration 0024).
-- plan: pinned, it runs at every round (or start) and, taking arrays, was re-planned at every run.
INSERT INTO konduit_tasks
    (execution_id, workflow, generation, step, map_index, item, queue, priority, max_attempts,
     deadline_seconds, limited, deadline_uncut_seconds, deadline_reserve_seconds, deadline_at,
     fair_turn, policy_revision)
SELECT %(execution_id)s, %(workflow)s, %(generation)s, u.step, u.map_index, u.item, u.queue,
       u.priority + COALESCE((SELECT e.priority FROM konduit_executions e
                              WHERE e.id = %(execution_id)s), 0),
       u.max_attempts, u.deadline_seconds, COALESCE(u.limited, false), u.uncut, u.reserve,
       CASE WHEN u.uncut IS NOT NULL
            THEN konduit_clock_timestamp() + make_interval(secs => u.deadline_seconds) END,
       konduit_task_turn(COALESCE((SELECT k.fair_turn FROM konduit_queue_clocks k
                                   WHERE k.queue = u.queue), 0), u.nth - 1),
       %(policy_revision)s::int
FROM unnest(%(steps)s::text[], %(map_indexes)s::int[], %(items)s::jsonb[], %(queues)s::text[],
            %(priorities)s::int[], %(max_attempts)s::int[], %(deadline_seconds)s::float8[],
            %(limiteds)s::bool[], %(deadline_uncuts)s::float8[], %(deadline_reserves)s::float8[])
     WITH ORDINALITY
     AS u(step, map_index, item, queue, priority, max_attempts, deadline_seconds, limited,
          uncut, reserve, nth)
ON CONFLICT (execution_id, step, map_index, generation) DO NOTHING;

-- name: task_notify_ready
-- Wake idle workers of a queue; delivered when the transaction commits.
SELECT pg_notify('konduit_ready', %(queue)s);

-- name: task_notify_ready_if_unclaimed
-- Wake idle workers of a queue only if a task a completion round made ready there (its
-- (execution, step) pairs; not map items) is still ready after the round's own claim: it runs
-- after that claim in the same transaction, so it sees what the claim took, and the claim's
-- rows need not come back before it is sent (they come back with the COMMIT).
SELECT pg_notify('konduit_ready', %(queue)s)
WHERE EXISTS (
    SELECT 1
    FROM unnest(%(execution_ids)s::uuid[], %(steps)s::text[]) AS u(execution_id, step)
    JOIN konduit_tasks t ON t.execution_id = u.execution_id AND t.step = u.step
    WHERE t.status = 'ready'
);

-- name: task_claim_plan_pinned
-- Sent before task_claim_batch in its transaction: for the rest of it, the planner takes index
-- paths and nested loops only, no JIT, and a prepared statement runs its kept (generic) plan.
-- The claim is prepared; the plan PostgreSQL keeps of it, made under these settings, reads the
-- ready index and looks rows up by key whatever the table sizes were when it was made (one made
-- while the tables were tiny would otherwise sort or scan a map's million-row backlog on every
-- claim), and it is used every time (left to choose, PostgreSQL went on planning the claim at
-- every run, its generic plan's estimate being above the custom ones'). JIT: before PostgreSQL
-- 18 a disabled path type counts as a huge cost, which would compile every claim.
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_sort', 'off', true), set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true), set_config('enable_material', 'off', true),
       set_config('jit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true);

-- name: task_claim_plan_unpinned
-- The session's planner settings back for the rest of the transaction (what RESET would give),
-- after task_claim_plan_pinned: sent before a `plan: custom` statement in a pinned transaction.
SELECT set_config(name, reset_val, true) FROM pg_settings
WHERE name = ANY('{enable_seqscan,enable_bitmapscan,enable_sort,enable_hashjoin,enable_mergejoin,enable_material,jit,plan_cache_mode}'::text[]);

-- name: task_claim_batch
-- Lease up to `limit` ready tasks of the given queues and workflow versions, skipping rows other
-- workers hold: within a priority by fair turn (an execution's share: migration 0019), then the
-- older execution; the queues take turns; the queue's clock moves to the latest turn taken.
-- Its cost is bounded by the claim (`limit` rows per queue and workflow version read, in index
-- order) under any plan made under task_claim_plan_pinned, which runs before it in its
-- transaction: each LATERAL below is parameterized by its queue and workflow, so it can only run
-- once per pair, and its ORDER BY ... LIMIT is the order of konduit_tasks_ready under the
-- equalities that lead it; the claimed rows are updated by key (`= ANY`, so no join order can
-- put the table first). Ready work the worker does not serve is never read.
-- plan: pinned, prepared (planning it was a third of its server time) under task_claim_plan_pinned.
WITH picked AS (
    SELECT c.id
    FROM (SELECT name, min(pos) AS pos
          FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS u(name, pos)
          GROUP BY name) AS q
    CROSS JOIN LATERAL (
        -- Turns: every queue's 1st task, in the order the queues are given, then every queue's
        -- 2nd, ... so a queue with one ready execution is served in this claim however deep
        -- another queue's backlog is, and a queue's unused share goes to the others. A claim
        -- smaller than the number of queues serves the first ones: the worker rotates them.
        SELECT l.id, row_number() OVER (ORDER BY l.priority, l.fair_turn, l.execution_id, l.id)
                         AS turn
        FROM (SELECT DISTINCT name FROM unnest(%(workflows)s::text[]) AS w(name)) AS w
        CROSS JOIN LATERAL (
            {{ready_tasks_of_queue_and_workflow}}
        ) AS l
    ) AS c
    ORDER BY c.turn, q.pos
    LIMIT %(limit)s
), claimed AS (
    UPDATE konduit_tasks t
    SET status = 'running',
        attempt = t.attempt + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = konduit_clock_timestamp() + make_interval(secs => %(lease_seconds)s),
        worker_id = %(worker_id)s,
        started_at = COALESCE(t.started_at, konduit_clock_timestamp()),
        -- The budget runs from the first claim and covers every retry of the task.
        deadline_at = COALESCE(t.deadline_at,
                               konduit_clock_timestamp() + make_interval(secs => t.deadline_seconds))
    WHERE t.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING t.id, t.execution_id, t.step, t.map_index, t.item, t.attempt, t.max_attempts,
              t.lease_token, t.queue, t.deadline_at, t.generation, t.fair_turn, t.policy_revision
), attempts AS (
    INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token)
    SELECT id, attempt, %(worker_id)s, lease_token FROM claimed
),
{{queue_clocks_moved}}
SELECT {{claimed_row}},
       extract(epoch FROM t.deadline_at - konduit_clock_timestamp())::float8 AS deadline_remaining,
       false AS hedged, NULL::float8 AS fallback_age
FROM claimed t
-- A lookup by primary key per claimed task under any plan (LIMIT keeps the subquery from being
-- flattened): a generic plan, not knowing `limit`, would otherwise hash every execution.
CROSS JOIN LATERAL (SELECT {{claimed_execution}}
                    FROM konduit_executions e WHERE e.id = t.execution_id LIMIT 1) AS e;

-- name: task_claim_batch_flow_limited
-- The claim of task_claim_batch, plus the ready tasks of the limited steps whose rows the caller
-- locked (flow_limit_lock_if_ready) and of the keys of per-key limited steps whose rows it
-- locked (flow_limit_lock_keys_if_ready), each step or key at most its allowance: its concurrency
-- minus its running tasks, and its rate's count minus its starts in the window; records the
-- starts and the throttled time in those rows. One clock reading serves the window, the
-- attempts' start times and the window's new entries, so the starts stored are the starts decided.
-- plan: custom, the ready backlog of the limited steps grows from nothing to a map's width.
WITH clock AS MATERIALIZED (
    SELECT konduit_clock_timestamp() AS at
), room AS MATERIALIZED (
    -- What the limits allow now (NULL: no limit left on the step).
    SELECT f.workflow, f.step, NULL::text AS key,
           CASE WHEN f.concurrency IS NOT NULL OR f.rate_count IS NOT NULL THEN
               greatest(0, least(  -- least() skips a NULL (absent) limit
                   f.concurrency - (SELECT count(*) FROM konduit_tasks r
                                    WHERE r.limited AND r.workflow = f.workflow
                                      AND r.step = f.step AND r.status = 'running'),
                   f.rate_count - (SELECT count(*) FROM unnest(f.starts) AS s(at)
                                   WHERE s.at > k.at - make_interval(secs => f.rate_seconds))
               ))
           END::int AS room
    FROM unnest(%(flow_workflows)s::text[], %(flow_steps)s::text[]) AS l(workflow, step)
    JOIN konduit_flow_limits f ON f.workflow = l.workflow AND f.step = l.step
    CROSS JOIN clock k
    UNION ALL
    -- The same per key, for the keys locked: the step's limits, the key's tasks and window.
    SELECT f.workflow, f.step, fk.key,
           CASE WHEN f.concurrency IS NOT NULL OR f.rate_count IS NOT NULL THEN
               greatest(0, least(
                   f.concurrency - (SELECT count(*) FROM konduit_tasks r
                                    WHERE r.limit_key = fk.key AND r.workflow = f.workflow
                                      AND r.step = f.step AND r.status = 'running'),
                   f.rate_count - (SELECT count(*) FROM unnest(fk.starts) AS s(at)
                                   WHERE s.at > k.at - make_interval(secs => f.rate_seconds))
               ))
           END::int AS room
    FROM unnest(%(key_workflows)s::text[], %(key_steps)s::text[], %(key_keys)s::text[])
         AS l(workflow, step, key)
    JOIN konduit_flow_limits f ON f.workflow = l.workflow AND f.step = l.step
    JOIN konduit_flow_keys fk ON fk.workflow = l.workflow AND fk.step = l.step AND fk.key = l.key
    CROSS JOIN clock k
), allowance AS MATERIALIZED (
    -- ... and what this claim may take of it.
    SELECT r.workflow, r.step, r.key, r.room, least(r.room, %(limit)s)::int AS n FROM room r
), picked AS (
    SELECT c.id, c.workflow, c.step, c.key, c.limited, c.turn, q.pos
    FROM (SELECT name, min(pos) AS pos
          FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS u(name, pos)
          GROUP BY name) AS q
    CROSS JOIN LATERAL (
        -- Turns as in task_claim_batch; a limited step's tasks take their place in the order.
        SELECT l.id, l.workflow, l.step, l.key, l.limited,
               row_number() OVER (ORDER BY l.priority, l.fair_turn, l.execution_id, l.id) AS turn
        FROM (
            -- As in task_claim_batch.
            SELECT u.*, NULL::text AS key
            FROM (SELECT DISTINCT name FROM unnest(%(workflows)s::text[]) AS w(name)) AS w
            CROSS JOIN LATERAL (
                {{ready_tasks_of_queue_and_workflow}}
            ) AS u
            UNION ALL
            -- Per locked step with room: its first ready tasks, no more than it may start.
            SELECT s.*, NULL::text AS key
            FROM allowance a
            CROSS JOIN LATERAL (
                SELECT t.id, t.priority, t.fair_turn, t.execution_id, t.workflow, t.step,
                       true AS limited
                FROM konduit_tasks t
                WHERE t.limited AND t.workflow = a.workflow AND t.step = a.step
                  AND t.status = 'ready' AND t.queue = q.name
                  AND t.run_at <= konduit_clock_timestamp()
                  AND {{execution_running}}
                ORDER BY t.priority, t.fair_turn, t.execution_id, t.id
                LIMIT a.n
                FOR UPDATE OF t SKIP LOCKED
            ) AS s
            WHERE a.n > 0 AND a.key IS NULL
            UNION ALL
            -- Per locked key with room: its first ready tasks (konduit_tasks_key_ready).
            SELECT s.*, a.key
            FROM allowance a
            CROSS JOIN LATERAL (
                SELECT t.id, t.priority, t.fair_turn, t.execution_id, t.workflow, t.step,
                       true AS limited
                FROM konduit_tasks t
                WHERE t.limit_key = a.key AND t.workflow = a.workflow AND t.step = a.step
                  AND t.status = 'ready' AND t.queue = q.name
                  AND t.run_at <= konduit_clock_timestamp()
                  AND {{execution_running}}
                ORDER BY t.priority, t.fair_turn, t.execution_id, t.id
                LIMIT a.n
                FOR UPDATE OF t SKIP LOCKED
            ) AS s
            WHERE a.n > 0 AND a.key IS NOT NULL
        ) AS l
    ) AS c
    ORDER BY c.turn, q.pos
    LIMIT %(limit)s
), chosen AS (
    -- A step (or key) whose tasks sit in several queues got its allowance from each: keep it once.
    SELECT p.id
    FROM (SELECT p.*, row_number() OVER (PARTITION BY p.workflow, p.step, p.key
                                         ORDER BY p.turn, p.pos) AS nth
          FROM picked p) AS p
    LEFT JOIN allowance a ON a.workflow = p.workflow AND a.step = p.step
                         AND a.key IS NOT DISTINCT FROM p.key
    WHERE NOT p.limited OR p.nth <= a.n
), claimed AS (
    UPDATE konduit_tasks t
    SET status = 'running',
        attempt = t.attempt + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = k.at + make_interval(secs => %(lease_seconds)s),
        worker_id = %(worker_id)s,
        started_at = COALESCE(t.started_at, k.at),
        deadline_at = COALESCE(t.deadline_at, k.at + make_interval(secs => t.deadline_seconds))
    FROM chosen, clock k
    WHERE t.id = chosen.id
    RETURNING t.id, t.execution_id, t.step, t.map_index, t.item, t.attempt, t.max_attempts,
              t.lease_token, t.queue, t.deadline_at, t.generation, t.workflow, t.limited,
              t.limit_key, t.fair_turn, t.policy_revision
), attempts AS (
    INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token, started_at)
    SELECT c.id, c.attempt, %(worker_id)s, c.lease_token, k.at FROM claimed c, clock k
),
{{queue_clocks_moved}}, started AS (
    SELECT a.workflow, a.step, a.key, a.room,
           (SELECT count(*) FROM claimed c
            WHERE c.limited AND c.workflow = a.workflow AND c.step = a.step
              AND (a.key IS NULL OR c.limit_key = a.key))::int AS took,
           -- Ready tasks of the step (or key) beyond those this claim takes (its snapshot
           -- predates them).
           CASE WHEN a.key IS NULL THEN
               (SELECT count(*) FROM (
                    SELECT 1 FROM konduit_tasks t
                    WHERE t.limited AND t.workflow = a.workflow AND t.step = a.step
                      AND t.status = 'ready' AND t.queue = ANY(%(queues)s::text[])
                      AND t.run_at <= k.at
                    LIMIT a.n + 1) AS r)
           ELSE
               (SELECT count(*) FROM (
                    SELECT 1 FROM konduit_tasks t
                    WHERE t.limit_key = a.key AND t.workflow = a.workflow AND t.step = a.step
                      AND t.status = 'ready' AND t.queue = ANY(%(queues)s::text[])
                      AND t.run_at <= k.at
                    LIMIT a.n + 1) AS r)
           END::int AS ready
    FROM allowance a, clock k
), throttle AS (
    -- Throttled: the step (key) had more ready tasks than its limits allow and this claim took
    -- all they allow (a claim that took less was short of free slots or found the rest locked:
    -- the limit held nothing back). A stretch of throttled claims is throttled time.
    SELECT s.*, COALESCE(s.ready > s.room AND s.took >= s.room, false) AS throttled FROM started s
), window_after AS (
    -- What the claim leaves in the row of each step (or key): the starts it made, in the rate's
    -- window, and its throttled time. Computed once here over the row it updates (the step's,
    -- or the key's: the step's rate applies to each key).
    SELECT s.workflow, s.step, s.key,
           CASE WHEN f.rate_count IS NULL OR s.took = 0 THEN w.starts
                ELSE (w.starts || array_fill(k.at, ARRAY[s.took]))[
                    greatest(1, cardinality(w.starts) + s.took - f.rate_count + 1):]
           END AS starts,
           CASE WHEN s.throttled THEN COALESCE(w.throttled_since, k.at) END AS throttled_since,
           w.throttled_seconds
               + CASE WHEN w.throttled_since IS NOT NULL AND NOT s.throttled
                      THEN greatest(0, extract(epoch FROM k.at - w.throttled_since)) ELSE 0 END
               AS throttled_seconds,
           w.throttled_claims + s.throttled::int AS throttled_claims
    FROM throttle s
    JOIN konduit_flow_limits f ON f.workflow = s.workflow AND f.step = s.step
    LEFT JOIN konduit_flow_keys fk ON fk.workflow = s.workflow AND fk.step = s.step
                                  AND fk.key = s.key
    CROSS JOIN LATERAL (
        SELECT f.starts, f.throttled_since, f.throttled_seconds, f.throttled_claims
        WHERE s.key IS NULL
        UNION ALL
        SELECT fk.starts, fk.throttled_since, fk.throttled_seconds, fk.throttled_claims
        WHERE s.key IS NOT NULL
    ) AS w
    CROSS JOIN clock k
), recorded AS (
    UPDATE konduit_flow_limits f
    SET starts = w.starts, throttled_since = w.throttled_since,
        throttled_seconds = w.throttled_seconds, throttled_claims = w.throttled_claims
    FROM window_after w
    WHERE f.workflow = w.workflow AND f.step = w.step AND w.key IS NULL
), recorded_keys AS (
    UPDATE konduit_flow_keys fk
    SET starts = w.starts, throttled_since = w.throttled_since,
        throttled_seconds = w.throttled_seconds, throttled_claims = w.throttled_claims,
        updated_at = k.at
    FROM window_after w, clock k
    WHERE fk.workflow = w.workflow AND fk.step = w.step AND fk.key = w.key
)
SELECT {{claimed_row}},
       extract(epoch FROM t.deadline_at - k.at)::float8 AS deadline_remaining,
       false AS hedged, NULL::float8 AS fallback_age
FROM claimed t
CROSS JOIN clock k
-- By primary key per claimed task under any plan, as in task_claim_batch.
CROSS JOIN LATERAL (SELECT {{claimed_execution}}
                    FROM konduit_executions e WHERE e.id = t.execution_id LIMIT 1) AS e;

-- name: task_complete_many_if_leased
-- Record several tasks' outcomes at once, each only while the caller still holds its lease: the
-- task's lease or its hedge's (whichever attempt finishes first ends the task, and the other's
-- lease goes with it). Only a success ends a task while its other attempt runs (a failure
-- drops its own attempt first: task_drop_attempt_if_leased).
-- sealed: errors
UPDATE konduit_tasks t
SET status = u.outcome,
    output_hash = u.output_hash,
    error = u.error,
    routes = CASE WHEN u.routes IS NULL THEN NULL
                  ELSE ARRAY(SELECT jsonb_array_elements_text(u.routes)) END,
    {{lease_cleared}},
    {{hedge_cleared}},
    finished_at = konduit_clock_timestamp() - make_interval(secs => u.age)
FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[], %(outcomes)s::text[],
            %(output_hashes)s::text[], %(errors)s::text[], %(routes)s::jsonb[],
            %(ages)s::float8[])
     AS u(id, lease_token, outcome, output_hash, error, routes, age)
WHERE t.id = u.id
  AND konduit_lease_or_hedge_held(t.status, t.lease_token, t.hedge_token, u.lease_token)
  AND CASE WHEN t.hedge_token IS NULL THEN true ELSE u.outcome = 'succeeded' END
RETURNING t.id, t.finished_at;

-- name: task_complete_many_if_leased_storing_outputs_and_attempts
-- task_complete_many_if_leased, attempt_finish_many_if_open and
-- output_insert_many_across_executions_if_absent in one statement (a completion round's
-- writes: one statement for the server to run and the worker to send instead of three). The
-- output and the attempt are written only for the tasks whose fenced end this same statement
-- made (they join its RETURNING), so each still rests on the lease check of its own statement.
-- Outputs go in (execution, step, map_index) order, the order of every multi-row output write.
-- plan: pinned, it runs at every round (or start) and, taking arrays, was re-planned at every run.
-- sealed: errors
WITH ended AS (
    UPDATE konduit_tasks t
    SET status = u.outcome,
        output_hash = u.output_hash,
        error = u.error,
        routes = CASE WHEN u.routes IS NULL THEN NULL
                      ELSE ARRAY(SELECT jsonb_array_elements_text(u.routes)) END,
        {{lease_cleared}},
        {{hedge_cleared}},
        finished_at = konduit_clock_timestamp() - make_interval(secs => u.age)
    FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[], %(outcomes)s::text[],
                %(output_hashes)s::text[], %(errors)s::text[], %(routes)s::jsonb[],
                %(ages)s::float8[], %(attempt_outcomes)s::text[], %(payloads)s::text[],
                %(sources)s::text[], %(execution_ids)s::uuid[])
         AS u(id, lease_token, outcome, output_hash, error, routes, age, attempt_outcome,
              payload, source, execution_id)
    -- The execution is the one the payload was sealed for (a payload store names its objects
    -- by execution): a task of another is never ended with it.
    WHERE t.id = u.id AND t.execution_id = u.execution_id
      AND konduit_lease_or_hedge_held(t.status, t.lease_token, t.hedge_token, u.lease_token)
      AND CASE WHEN t.hedge_token IS NULL THEN true ELSE u.outcome = 'succeeded' END
    RETURNING t.id, t.execution_id, t.step, t.map_index, t.finished_at, u.lease_token,
              u.output_hash, u.error, u.age, u.attempt_outcome, u.payload, u.source
), stored AS (
    INSERT INTO konduit_outputs (execution_id, step, map_index, content_hash, payload, source)
    SELECT e.execution_id, e.step, e.map_index, e.output_hash, e.payload::jsonb, e.source
    FROM ended e
    WHERE e.output_hash IS NOT NULL
    ORDER BY e.execution_id, e.step, e.map_index
    ON CONFLICT DO NOTHING
), closed AS (
    -- As attempt_finish_many_if_open (the comments there say why the lookup is LATERAL).
    UPDATE konduit_attempts a
    SET finished_at = konduit_clock_timestamp()
                      - make_interval(secs => CASE WHEN a.lease_token = e.lease_token
                                                   THEN e.age ELSE 0 END),
        outcome = CASE WHEN a.lease_token = e.lease_token THEN e.attempt_outcome
                       ELSE 'outrun' END,
        error = CASE WHEN a.lease_token = e.lease_token THEN e.error
                     ELSE 'another attempt of the task finished first' END
    FROM ended e
    CROSS JOIN LATERAL (SELECT o.lease_token AS token FROM konduit_attempts o
                        WHERE o.task_id = e.id AND o.outcome IS NULL
                        LIMIT 2) AS open_attempt
    WHERE e.lease_token IS NOT NULL
      AND a.lease_token = open_attempt.token AND a.task_id = e.id AND a.outcome IS NULL
    RETURNING a.lease_token, a.outcome
), outrun AS (
    -- The other attempt of a hedged task is told at commit that it was outrun.
    SELECT count(*) AS told
    FROM (SELECT pg_notify('konduit_outrun', lease_token::text) FROM closed
          WHERE outcome = 'outrun') AS n
)
SELECT e.id, e.finished_at FROM ended e CROSS JOIN outrun;

-- name: task_hold_if_leased
-- Before a handler starts: is the task still ours (its lease or its hedge's)? FOR SHARE holds off
-- a cancel until it started.
SELECT id
FROM konduit_tasks
WHERE id = %(id)s
  AND konduit_lease_or_hedge_held(status, lease_token, hedge_token, %(lease_token)s)
FOR SHARE;

-- name: task_retry_if_leased_before_deadline
-- Return a failed attempt's task to ready after a backoff, while the caller holds its lease and
-- the backoff ends before the task's deadline (else the caller ends the task instead).
-- sealed: error
UPDATE konduit_tasks
SET status = 'ready',
    run_at = konduit_clock_timestamp() + make_interval(secs => %(delay_seconds)s),
    error = %(error)s,
    {{lease_cleared}}
WHERE id = %(id)s AND konduit_lease_held(status, lease_token, %(lease_token)s)
  AND konduit_deadline_after(deadline_at, %(delay_seconds)s)
RETURNING id, queue;

-- name: task_lose_if_rescuable
-- Reclaim: return a task whose worker is gone to ready after a backoff. Every condition is
-- re-checked at the time of this write (River #1302): the lease is still the one read, it has
-- expired, the server has been up for a lease, the owner is not a live worker whose lease on
-- the task ran out less than a lease ago (a heartbeat may be about to land), and no fallback
-- of the task has started (such a task is being ended, never retried).
-- sealed: error
UPDATE konduit_tasks t
SET status = 'ready',
    run_at = konduit_clock_timestamp() + make_interval(secs => %(delay_seconds)s),
    error = %(error)s,
    {{lease_cleared}}
WHERE t.id = %(id)s AND konduit_lease_held(t.status, t.lease_token, %(lease_token)s)
  AND konduit_lease_rescuable(t.worker_id, t.lease_expires_at, %(lease_seconds)s)
  -- A live hedge takes over instead (task_promote_hedge_if_rescuable).
  AND t.hedge_token IS NULL
  AND t.fallback_started_at IS NULL
  AND konduit_deadline_after(t.deadline_at, %(delay_seconds)s)
  AND {{task_row_unheld}}
RETURNING t.id, t.queue;

-- name: task_end_if_rescuable
-- Reclaim that ends the task (attempts exhausted, or the deadline is near): the same guards as
-- task_lose_if_rescuable (but a task whose fallback started may end), inside the fan-in
-- transaction.
-- sealed: error
UPDATE konduit_tasks t
SET status = %(outcome)s,
    output_hash = %(output_hash)s,
    error = %(error)s,
    {{lease_cleared}},
    finished_at = konduit_clock_timestamp()
WHERE t.id = %(id)s AND konduit_lease_held(t.status, t.lease_token, %(lease_token)s)
  AND konduit_lease_rescuable(t.worker_id, t.lease_expires_at, %(lease_seconds)s)
  -- A live hedge takes over instead (task_promote_hedge_if_rescuable).
  AND t.hedge_token IS NULL
  AND konduit_fallback_settled(t.fallback_started_at, %(fallback_settle)s)
  AND {{task_row_unheld}}
RETURNING t.id, t.finished_at;

-- name: task_expire_if_past_deadline
-- Deadline sweep: end a task past its deadline whose own worker did not (by more than a grace
-- while that worker lives: konduit_task_expirable): a running task still under the lease read,
-- a ready one (a retry waiting out its backoff), or a waiting one (an event, timer or child
-- that did not come in time).
-- sealed: error
UPDATE konduit_tasks t
SET status = %(outcome)s,
    output_hash = %(output_hash)s,
    error = %(error)s,
    {{lease_cleared}},
    {{hedge_cleared}},
    finished_at = konduit_clock_timestamp()
WHERE t.id = %(id)s
  AND konduit_task_expirable(t.status, t.deadline_at, t.worker_id, t.hedge_worker_id,
                             %(grace_seconds)s)
  AND (konduit_lease_held(t.status, t.lease_token, %(lease_token)s)
       OR (t.status = 'ready' AND %(lease_token)s::uuid IS NULL)
       -- A waiting task that did not become due in time (task_wake_if_waiting, the complement).
       OR (t.status = 'waiting' AND %(lease_token)s::uuid IS NULL
           AND (t.wait_until IS NULL OR t.wait_until > t.deadline_at)))
  AND konduit_fallback_settled(t.fallback_started_at, %(fallback_settle)s)
RETURNING t.id, t.finished_at;

-- name: task_start_fallback_if_unstarted
-- Record that a task's fallback is about to be called, committed before the call: at most once
-- per task, whoever calls it (a fallback that kills its worker leaves the mark, and the task is
-- ended without it). The caller must still hold what it read: its lease (or hedge lease) on the
-- running task, or no lease on a ready or waiting one; a ready one is not claimed meanwhile.
UPDATE konduit_tasks t
SET fallback_started_at = konduit_clock_timestamp(),
    run_at = CASE WHEN t.status = 'ready'
                  THEN GREATEST(t.run_at,
                                konduit_clock_timestamp() + make_interval(secs => %(settle_seconds)s))
                  ELSE t.run_at END
WHERE t.id = %(id)s AND t.fallback_started_at IS NULL
  AND CASE WHEN %(lease_token)s::uuid IS NULL
           THEN t.status IN ('ready', 'waiting') AND t.lease_token IS NULL
           ELSE konduit_lease_or_hedge_held(t.status, t.lease_token, t.hedge_token,
                                            %(lease_token)s) END
RETURNING t.id;

-- name: task_release_if_leased
-- Hand a task back unrun (graceful shutdown): ready at once, and the attempt does not count.
UPDATE konduit_tasks
SET status = 'ready',
    run_at = konduit_clock_timestamp(),
    attempt = attempt - 1,
    {{lease_cleared}}
WHERE id = %(id)s AND konduit_lease_held(status, lease_token, %(lease_token)s)
RETURNING id, queue;

-- name: task_wait_if_leased
-- Arm: running -> waiting, while the caller still holds the lease (the arming attempt of an
-- event, timer or child step); the task holds no lease and no worker slot from now on.
UPDATE konduit_tasks
SET status = 'waiting',
    {{lease_cleared}},
    wait_kind = %(kind)s,
    wait_event = %(event)s,
    wait_key = %(key)s,
    wait_until = COALESCE(%(until)s::timestamptz,
                          konduit_clock_timestamp() + make_interval(secs => %(delay_seconds)s::float8)),
    wait_child = %(child)s
WHERE id = %(id)s AND konduit_lease_held(status, lease_token, %(lease_token)s)
  AND hedge_token IS NULL
RETURNING id, execution_id, step, wait_until,
          extract(epoch FROM wait_until - konduit_clock_timestamp())::float8 AS wait_seconds;

-- name: task_wake_if_waiting
-- Wake: waiting -> terminal (the event's payload, the timer's None, the child's output). Only a
-- task still waiting, and one that became due before its deadline (an event accepted, a timer
-- due, a child ended in time): a late one is the deadline sweep's (task_expire_if_past_deadline).
-- sealed: error
UPDATE konduit_tasks t
SET status = %(outcome)s,
    output_hash = %(output_hash)s,
    error = %(error)s,
    finished_at = konduit_clock_timestamp()
WHERE t.id = %(id)s AND t.status = 'waiting'
  AND (t.deadline_at IS NULL OR COALESCE(t.wait_until, konduit_clock_timestamp()) <= t.deadline_at)
RETURNING t.id, t.finished_at;

-- name: task_list_rescuable
-- Running tasks whose worker is gone (lease expired, owner not live), oldest first; the write
-- that reclaims one re-checks all of it (task_lose_if_rescuable).
SELECT {{claimed_row}}, t.worker_id,
       extract(epoch FROM t.deadline_at - konduit_clock_timestamp())::float8 AS deadline_remaining,
       false AS hedged,
       extract(epoch FROM konduit_clock_timestamp() - t.fallback_started_at)::float8 AS fallback_age
FROM konduit_tasks t
JOIN konduit_executions e ON e.id = t.execution_id
WHERE t.status = 'running' AND konduit_lease_lapsed(t.worker_id, t.lease_expires_at)
ORDER BY t.lease_expires_at
LIMIT %(limit)s;

-- name: task_cancel_unfinished
-- End the ready, running and waiting tasks of a stopped execution; running workers lose their
-- lease.
-- Rows are locked in id order, the order every multi-row task write takes.
-- sealed: reason
WITH doomed AS (
    SELECT id FROM konduit_tasks
    WHERE execution_id = %(execution_id)s AND status IN ('ready', 'running', 'waiting')
    ORDER BY id
    FOR NO KEY UPDATE
)
UPDATE konduit_tasks t
SET status = 'cancelled',
    error = %(reason)s,
    {{lease_cleared}},
    {{hedge_cleared}},
    finished_at = konduit_clock_timestamp()
FROM doomed
WHERE t.id = doomed.id AND t.status IN ('ready', 'running', 'waiting')
RETURNING t.id;

-- name: task_list_by_execution
-- Every task of one execution, in DAG-independent order, for status pages.
-- plan: custom, as many rows as the execution has tasks (a map: every item).
SELECT id, step, map_index, generation, status, attempt, max_attempts, worker_id, error,
       routes, deadline_seconds, deadline_at, created_at, started_at, finished_at, run_at,
       wait_kind, wait_event, wait_key, wait_until, wait_child
FROM konduit_tasks_of(%(execution_id)s::uuid)
WHERE execution_id = %(execution_id)s
ORDER BY id;

-- name: task_list_dead
-- Dead-lettered tasks (retries exhausted or non-retryable) that no repair re-ran, newest first.
SELECT t.id, t.execution_id, e.workflow_name, t.step, t.map_index, t.attempt, t.error,
       t.finished_at
FROM konduit_tasks t
JOIN konduit_executions e ON e.id = t.execution_id
WHERE {{task_dead_letter}}
ORDER BY t.finished_at DESC
LIMIT %(limit)s;

-- name: task_list_past_deadline
-- Ready, running and waiting tasks past their deadline (a running one by more than a grace, unless
-- its worker is known dead: konduit_task_expirable): their worker died or hung, a retry's backoff
-- or a queue outlasted the budget, or a wait was not over in time.
SELECT {{claimed_row}}, t.status, t.worker_id,
       0.0::float8 AS deadline_remaining, false AS hedged,
       extract(epoch FROM konduit_clock_timestamp() - t.fallback_started_at)::float8 AS fallback_age
FROM konduit_tasks t
JOIN konduit_executions e ON e.id = t.execution_id
WHERE t.status IN ('ready', 'running', 'waiting') AND e.status = 'running'
  AND t.deadline_at < konduit_clock_timestamp()  -- the deadline index's range; the rest per row:
  AND konduit_task_expirable(t.status, t.deadline_at, t.worker_id, t.hedge_worker_id,
                             %(grace_seconds)s)
  AND (t.status <> 'waiting' OR t.wait_until IS NULL OR t.wait_until > t.deadline_at)
ORDER BY t.deadline_at
LIMIT %(limit)s;

-- name: task_list_routes_latest
-- The routing choice of each step's latest task (a repair rebuilds join state from it).
SELECT DISTINCT ON (step) step, routes
FROM konduit_tasks
WHERE execution_id = %(execution_id)s
ORDER BY step, generation DESC, map_index;

-- name: task_list_routes_latest_with_history
-- The routing choice of each step's latest task of an execution in the hot table or moved into
-- the history (migration 0041): a fork reads its origin's, wherever the origin is.
SELECT DISTINCT ON (step) step, routes
FROM konduit_tasks_of(%(execution_id)s::uuid)
WHERE execution_id = %(execution_id)s
ORDER BY step, generation DESC, map_index;

-- name: task_is_leased
-- Whether a lease (or hedge lease) still holds its task (after a guarded write changed nothing:
-- which guard?).
SELECT id FROM konduit_tasks
WHERE id = %(id)s
  AND konduit_lease_or_hedge_held(status, lease_token, hedge_token, %(lease_token)s);

-- name: task_retry_now_if_in_backoff
-- An operator's "retry now": a task waiting out the backoff after a failed attempt becomes
-- claimable at once. Re-checked in this statement: it is still ready, of this execution, after
-- a failed attempt, and its next try is still ahead (a worker may have claimed it since).
UPDATE konduit_tasks
SET run_at = konduit_clock_timestamp()
WHERE id = %(id)s AND execution_id = %(execution_id)s
  AND status = 'ready' AND attempt > 0 AND run_at > konduit_clock_timestamp()
RETURNING id, queue;
