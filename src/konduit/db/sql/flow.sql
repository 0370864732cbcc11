-- name: flow_limit_upsert_for_workflow
-- Set the limits of one workflow version's limited steps (the latest registration wins), and
-- lift them from its steps no longer limited; rows whose limits are unchanged are not written.
WITH wanted AS (
    SELECT *
    FROM unnest(%(steps)s::text[], %(concurrencies)s::int[], %(rate_counts)s::int[],
                %(rate_seconds)s::float8[])
         AS w(step, concurrency, rate_count, rate_seconds)
), lifted AS (
    UPDATE konduit_flow_limits f
    SET concurrency = NULL, rate_count = NULL, rate_seconds = NULL, starts = '{}',
        updated_at = clock_timestamp()
    WHERE f.workflow = %(workflow)s
      AND (f.concurrency IS NOT NULL OR f.rate_count IS NOT NULL)
      AND f.step <> ALL(%(steps)s::text[])
)
INSERT INTO konduit_flow_limits (workflow, step, concurrency, rate_count, rate_seconds)
SELECT %(workflow)s, w.step, w.concurrency, w.rate_count, w.rate_seconds
FROM wanted w
ON CONFLICT (workflow, step) DO UPDATE
SET concurrency = EXCLUDED.concurrency,
    rate_count = EXCLUDED.rate_count,
    rate_seconds = EXCLUDED.rate_seconds,
    -- The window keeps the latest starts, never more than the new count allows.
    starts = CASE WHEN EXCLUDED.rate_count IS NULL THEN '{}'::timestamptz[]
                  ELSE konduit_flow_limits.starts[
                      greatest(1, cardinality(konduit_flow_limits.starts) - EXCLUDED.rate_count + 1):]
             END,
    updated_at = clock_timestamp()
WHERE (konduit_flow_limits.concurrency, konduit_flow_limits.rate_count,
       konduit_flow_limits.rate_seconds)
      IS DISTINCT FROM (EXCLUDED.concurrency, EXCLUDED.rate_count, EXCLUDED.rate_seconds);

-- name: flow_limit_lock_if_ready
-- First statement of a flow claim: lock the rows of the limited steps that have ready tasks in
-- these queues (or an open throttled stretch for the claim to end), in one order; a row another
-- claimer holds is skipped (that claimer serves the step). The claim that follows in the same
-- transaction takes a fresh snapshot, so the running tasks and starts it counts include every
-- claim committed before these locks were granted.
SELECT f.workflow, f.step
FROM konduit_flow_limits f
WHERE f.workflow = ANY(%(workflows)s::text[])
  AND (f.throttled_since IS NOT NULL OR EXISTS (
      SELECT 1 FROM konduit_tasks t
      WHERE t.limited AND t.workflow = f.workflow AND t.step = f.step AND t.status = 'ready'
        AND t.queue = ANY(%(queues)s::text[]) AND t.run_at <= clock_timestamp()))
ORDER BY f.workflow, f.step
FOR UPDATE OF f SKIP LOCKED;

-- name: task_claim_batch_flow_limited
-- The claim of task_claim_batch, plus the ready tasks of the limited steps whose rows the caller
-- locked (flow_limit_lock_if_ready), each step at most its allowance: its concurrency minus its
-- running tasks, and its rate's count minus its starts in the window; records the starts and
-- the throttled time in those rows. One clock reading serves the window, the attempts' start
-- times and the window's new entries, so the starts stored are the starts decided.
-- plan: custom, the ready backlog of the limited steps grows from nothing to a map's width.
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS at
), room AS MATERIALIZED (
    -- What the limits allow now (NULL: no limit left on the step).
    SELECT f.workflow, f.step,
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
), allowance AS MATERIALIZED (
    -- ... and what this claim may take of it.
    SELECT r.workflow, r.step, r.room, least(r.room, %(limit)s)::int AS n FROM room r
), picked AS (
    SELECT c.id, c.workflow, c.step, c.limited, c.turn, q.pos
    FROM (SELECT name, min(pos) AS pos
          FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS u(name, pos)
          GROUP BY name) AS q
    CROSS JOIN LATERAL (
        -- Turns as in task_claim_batch; a limited step's tasks take their place in the order.
        SELECT l.id, l.workflow, l.step, l.limited,
               row_number() OVER (ORDER BY l.priority, l.fair_turn, l.execution_id, l.id) AS turn
        FROM (
            -- As in task_claim_batch: one bounded index scan per (queue, workflow version).
            SELECT u.*
            FROM (SELECT DISTINCT name FROM unnest(%(workflows)s::text[]) AS w(name)) AS w
            CROSS JOIN LATERAL (
                SELECT t.id, t.priority, t.fair_turn, t.execution_id, t.workflow, t.step,
                       false AS limited
                FROM konduit_tasks t
                WHERE t.status = 'ready' AND t.queue = q.name AND t.workflow = w.name
                  AND NOT t.limited
                  AND t.run_at <= clock_timestamp()
                  AND (SELECT e.status = 'running' FROM konduit_executions e
                       WHERE e.id = t.execution_id)
                ORDER BY t.priority, t.fair_turn, t.execution_id, t.id
                LIMIT %(limit)s
                FOR UPDATE OF t SKIP LOCKED
            ) AS u
            UNION ALL
            -- Per locked step with room: its first ready tasks, no more than it may start.
            SELECT s.*
            FROM allowance a
            CROSS JOIN LATERAL (
                SELECT t.id, t.priority, t.fair_turn, t.execution_id, t.workflow, t.step,
                       true AS limited
                FROM konduit_tasks t
                WHERE t.limited AND t.workflow = a.workflow AND t.step = a.step
                  AND t.status = 'ready' AND t.queue = q.name
                  AND t.run_at <= clock_timestamp()
                  AND (SELECT e.status = 'running' FROM konduit_executions e
                       WHERE e.id = t.execution_id)
                ORDER BY t.priority, t.fair_turn, t.execution_id, t.id
                LIMIT a.n
                FOR UPDATE OF t SKIP LOCKED
            ) AS s
            WHERE a.n > 0
        ) AS l
    ) AS c
    ORDER BY c.turn, q.pos
    LIMIT %(limit)s
), chosen AS (
    -- A step whose tasks sit in several queues got its allowance from each: keep it once.
    SELECT p.id
    FROM (SELECT p.*, row_number() OVER (PARTITION BY p.workflow, p.step
                                         ORDER BY p.turn, p.pos) AS nth
          FROM picked p) AS p
    LEFT JOIN allowance a ON a.workflow = p.workflow AND a.step = p.step
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
              t.fair_turn
), attempts AS (
    INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token, started_at)
    SELECT c.id, c.attempt, %(worker_id)s, c.lease_token, k.at FROM claimed c, clock k
), reached AS (
    -- The queues' clocks, as in task_claim_batch.
    SELECT queue, max(fair_turn) AS fair_turn FROM claimed GROUP BY queue
), clock_held AS (
    SELECT q.queue, r.fair_turn
    FROM konduit_queue_clocks q JOIN reached r ON r.queue = q.queue
    WHERE q.fair_turn < r.fair_turn
    FOR UPDATE OF q SKIP LOCKED
), clock_moved AS (
    UPDATE konduit_queue_clocks q SET fair_turn = greatest(q.fair_turn, h.fair_turn)
    FROM clock_held h WHERE q.queue = h.queue
), started AS (
    SELECT a.workflow, a.step, a.room,
           (SELECT count(*) FROM claimed c
            WHERE c.limited AND c.workflow = a.workflow AND c.step = a.step)::int AS took,
           -- Ready tasks of the step beyond those this claim takes (its snapshot predates them).
           (SELECT count(*) FROM (
                SELECT 1 FROM konduit_tasks t
                WHERE t.limited AND t.workflow = a.workflow AND t.step = a.step
                  AND t.status = 'ready' AND t.queue = ANY(%(queues)s::text[])
                  AND t.run_at <= k.at
                LIMIT a.n + 1) AS r)::int AS ready
    FROM allowance a, clock k
), recorded AS (
    -- Throttled: the step had more ready tasks than its limits allow and this claim took all
    -- they allow (a claim that took less was short of free slots or found the rest locked: the
    -- limit held nothing back). A stretch of throttled claims is throttled time.
    UPDATE konduit_flow_limits f
    SET starts = CASE WHEN f.rate_count IS NULL OR s.took = 0 THEN f.starts
                      ELSE (f.starts || array_fill(k.at, ARRAY[s.took]))[
                          greatest(1, cardinality(f.starts) + s.took - f.rate_count + 1):]
                 END,
        throttled_since = CASE WHEN s.throttled THEN COALESCE(f.throttled_since, k.at) END,
        throttled_seconds = f.throttled_seconds
            + CASE WHEN f.throttled_since IS NOT NULL AND NOT s.throttled
                   THEN greatest(0, extract(epoch FROM k.at - f.throttled_since)) ELSE 0 END,
        throttled_claims = f.throttled_claims + s.throttled::int
    FROM (SELECT s.*, COALESCE(s.ready > s.room AND s.took >= s.room, false) AS throttled
          FROM started s) AS s, clock k
    WHERE f.workflow = s.workflow AND f.step = s.step
)
SELECT {{claimed_row}},
       extract(epoch FROM t.deadline_at - k.at)::float8 AS deadline_remaining,
       false AS hedged, NULL::float8 AS fallback_age
FROM claimed t
CROSS JOIN clock k
-- By primary key per claimed task under any plan, as in task_claim_batch.
CROSS JOIN LATERAL (SELECT e.workflow_name, e.workflow_version, e.input, e.scheduled_at
                    FROM konduit_executions e WHERE e.id = t.execution_id LIMIT 1) AS e;

-- name: flow_limit_list
-- Every limited step with its limits, running tasks, ready tasks and throttled time (a stretch
-- still open counts up to now), for stats and metrics.
SELECT f.workflow, f.step, f.concurrency, f.rate_count, f.rate_seconds,
       (SELECT count(*) FROM konduit_tasks t
        WHERE t.limited AND t.workflow = f.workflow AND t.step = f.step
          AND t.status = 'running')::int AS running,
       (SELECT count(*) FROM konduit_tasks t
        WHERE t.limited AND t.workflow = f.workflow AND t.step = f.step
          AND t.status = 'ready')::int AS ready,
       f.throttled_seconds
           + COALESCE(extract(epoch FROM clock_timestamp() - f.throttled_since), 0)::float8
           AS throttled_seconds,
       f.throttled_since IS NOT NULL AS throttled_now,
       f.throttled_claims
FROM konduit_flow_limits f
WHERE f.concurrency IS NOT NULL OR f.rate_count IS NOT NULL
ORDER BY f.workflow, f.step;
