-- name: flow_limit_upsert_for_workflow
-- Set the limits of one workflow version's limited steps (the latest registration wins), and
-- lift them from its steps no longer limited; rows whose limits are unchanged are not written.
WITH wanted AS (
    SELECT *
    FROM unnest(%(steps)s::text[], %(concurrencies)s::int[], %(rate_counts)s::int[],
                %(rate_seconds)s::float8[], %(keyeds)s::bool[])
         AS w(step, concurrency, rate_count, rate_seconds, keyed)
), lifted AS (
    UPDATE konduit_flow_limits f
    SET concurrency = NULL, rate_count = NULL, rate_seconds = NULL, starts = '{}',
        updated_at = konduit_clock_timestamp()
    WHERE f.workflow = %(workflow)s
      AND (f.concurrency IS NOT NULL OR f.rate_count IS NOT NULL)
      AND f.step <> ALL(%(steps)s::text[])
)
INSERT INTO konduit_flow_limits (workflow, step, concurrency, rate_count, rate_seconds, keyed)
SELECT %(workflow)s, w.step, w.concurrency, w.rate_count, w.rate_seconds, w.keyed
FROM wanted w
ON CONFLICT (workflow, step) DO UPDATE
SET concurrency = EXCLUDED.concurrency,
    keyed = EXCLUDED.keyed,
    rate_count = EXCLUDED.rate_count,
    rate_seconds = EXCLUDED.rate_seconds,
    -- The window keeps the latest starts, never more than the new count allows.
    starts = CASE WHEN EXCLUDED.rate_count IS NULL THEN '{}'::timestamptz[]
                  ELSE konduit_flow_limits.starts[
                      greatest(1, cardinality(konduit_flow_limits.starts) - EXCLUDED.rate_count + 1):]
             END,
    updated_at = konduit_clock_timestamp()
WHERE (konduit_flow_limits.concurrency, konduit_flow_limits.rate_count,
       konduit_flow_limits.rate_seconds, konduit_flow_limits.keyed)
      IS DISTINCT FROM (EXCLUDED.concurrency, EXCLUDED.rate_count, EXCLUDED.rate_seconds,
                        EXCLUDED.keyed);

-- name: flow_limit_lock_if_ready
-- First statement of a flow claim: lock the rows of the limited steps that have ready tasks in
-- these queues (or an open throttled stretch for the claim to end), in one order; a row another
-- claimer holds is skipped (that claimer serves the step). The claim that follows in the same
-- transaction takes a fresh snapshot, so the running tasks and starts it counts include every
-- claim committed before these locks were granted.
-- A step limited per key is not locked here (flow_limit_lock_keys_if_ready locks its keys).
SELECT f.workflow, f.step
FROM konduit_flow_limits f
WHERE f.workflow = ANY(%(workflows)s::text[]) AND NOT f.keyed
  AND (f.throttled_since IS NOT NULL OR EXISTS (
      SELECT 1 FROM konduit_tasks t
      WHERE t.limited AND t.workflow = f.workflow AND t.step = f.step AND t.status = 'ready'
        AND t.queue = ANY(%(queues)s::text[]) AND t.run_at <= konduit_clock_timestamp()))
ORDER BY f.workflow, f.step
FOR UPDATE OF f SKIP LOCKED;

-- name: flow_limit_list
-- Every limited step with its limits, running tasks, ready tasks and throttled time (a stretch
-- still open counts up to now), for stats and metrics. A step limited per key (`keyed`) adds
-- its keys' rows: their throttled time and claims (retired keys' are in the step's row), how
-- many keys have a row (`keys`) and how many are throttled now (`keys_throttled`); that sum
-- reads the step's key rows, which the retention pass keeps to keys with recent work.
SELECT f.workflow, f.step, f.concurrency, f.rate_count, f.rate_seconds, f.keyed,
       (SELECT count(*) FROM konduit_tasks t
        WHERE t.limited AND t.workflow = f.workflow AND t.step = f.step
          AND t.status = 'running')::int AS running,
       (SELECT count(*) FROM konduit_tasks t
        WHERE t.limited AND t.workflow = f.workflow AND t.step = f.step
          AND t.status = 'ready')::int AS ready,
       f.throttled_seconds
           + COALESCE(extract(epoch FROM konduit_clock_timestamp() - f.throttled_since), 0)::float8
           + COALESCE(k.throttled_seconds, 0) AS throttled_seconds,
       f.throttled_since IS NOT NULL OR COALESCE(k.throttled_now, 0) > 0 AS throttled_now,
       f.throttled_claims + COALESCE(k.throttled_claims, 0) AS throttled_claims,
       COALESCE(k.keys, 0) AS keys, COALESCE(k.throttled_now, 0) AS keys_throttled
FROM konduit_flow_limits f
LEFT JOIN LATERAL (
    SELECT count(*)::int AS keys,
           (count(*) FILTER (WHERE fk.throttled_since IS NOT NULL))::int AS throttled_now,
           sum(fk.throttled_seconds + COALESCE(extract(epoch FROM konduit_clock_timestamp()
                                                       - fk.throttled_since), 0))::float8
               AS throttled_seconds,
           sum(fk.throttled_claims)::bigint AS throttled_claims
    FROM konduit_flow_keys fk
    WHERE f.keyed AND fk.workflow = f.workflow AND fk.step = f.step
) AS k ON true
WHERE f.concurrency IS NOT NULL OR f.rate_count IS NOT NULL
ORDER BY f.workflow, f.step;

-- name: flow_limit_list_top_keys
-- The busiest keys of each step limited per key, at most `per_step` of each: the keys with
-- running tasks (most first) and those throttled now. Reads the running tasks and the keys
-- throttled now (konduit_flow_keys_throttled), never every key.
SELECT f.workflow, f.step, k.key, k.running, k.throttled_seconds, k.throttled_now
FROM konduit_flow_limits f
CROSS JOIN LATERAL (
    SELECT c.key, max(c.running)::int AS running,
           COALESCE(max(fk.throttled_seconds
                        + COALESCE(extract(epoch FROM konduit_clock_timestamp() - fk.throttled_since),
                                   0)), 0)::float8 AS throttled_seconds,
           bool_or(fk.throttled_since IS NOT NULL) IS TRUE AS throttled_now
    FROM (SELECT t.limit_key AS key, count(*) AS running
          FROM konduit_tasks t
          WHERE t.workflow = f.workflow AND t.step = f.step AND t.limit_key IS NOT NULL
            AND t.status = 'running'
          GROUP BY t.limit_key
          UNION ALL
          SELECT fk.key, 0
          FROM konduit_flow_keys fk
          WHERE fk.workflow = f.workflow AND fk.step = f.step
            AND fk.throttled_since IS NOT NULL) AS c
    LEFT JOIN konduit_flow_keys fk
           ON fk.workflow = f.workflow AND fk.step = f.step AND fk.key = c.key
    GROUP BY c.key
    ORDER BY running DESC, throttled_now DESC, throttled_seconds DESC, c.key
    LIMIT %(per_step)s
) AS k
WHERE f.keyed AND (f.concurrency IS NOT NULL OR f.rate_count IS NOT NULL)
ORDER BY f.workflow, f.step, k.running DESC, k.throttled_now DESC, k.throttled_seconds DESC,
         k.key;

-- name: flow_limit_lock_keys_if_ready
-- First statement of a flow claim, for the steps limited per key: up to `keys_per_step` keys of
-- each with ready tasks in these queues, in key order after the caller's cursor (the last key
-- it served: keys take turns), found by a skip scan that reads no key without ready tasks
-- (konduit_ready_limit_keys, migration 0026). Each key's row is created on demand and locked;
-- a row another claimer holds is skipped (that claimer serves the key). A row created here is
-- this transaction's alone until it commits; one another claimer created and has not committed
-- is waited for by the insert, then skipped (this statement's snapshot predates it). `ord`:
-- the order the keys were found in, for the caller's next cursor.
WITH wanted AS MATERIALIZED (
    SELECT f.workflow, f.step, k.key, k.ord
    FROM konduit_flow_limits f
    LEFT JOIN unnest(%(cursor_workflows)s::text[], %(cursor_steps)s::text[],
                     %(cursor_keys)s::text[]) AS c(workflow, step, key)
           ON c.workflow = f.workflow AND c.step = f.step
    CROSS JOIN LATERAL konduit_ready_limit_keys(f.workflow, f.step, %(queues)s::text[], c.key,
                                                %(keys_per_step)s) WITH ORDINALITY AS k(key, ord)
    WHERE f.workflow = ANY(%(workflows)s::text[]) AND f.keyed
), created AS (
    INSERT INTO konduit_flow_keys (workflow, step, key)
    SELECT w.workflow, w.step, w.key FROM wanted w ORDER BY w.workflow, w.step, w.key
    ON CONFLICT (workflow, step, key) DO NOTHING
    RETURNING workflow, step, key
)
SELECT l.workflow, l.step, l.key, w.ord
FROM (SELECT fk.workflow, fk.step, fk.key
      FROM konduit_flow_keys fk
      JOIN wanted w ON w.workflow = fk.workflow AND w.step = fk.step AND w.key = fk.key
      ORDER BY fk.workflow, fk.step, fk.key
      FOR UPDATE OF fk SKIP LOCKED) AS l
JOIN wanted w ON w.workflow = l.workflow AND w.step = l.step AND w.key = l.key
UNION ALL
SELECT c.workflow, c.step, c.key, w.ord
FROM created c
JOIN wanted w ON w.workflow = c.workflow AND w.step = c.step AND w.key = c.key;
