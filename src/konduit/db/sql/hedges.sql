-- Hedged attempts (docs/hedging.md): a second lease on a running task's row, beside its primary
-- lease. Every statement re-checks both leases at the time of its own write.

-- name: task_hedge_claim_if_straggling
-- Lease a hedge of up to `limit` running tasks of hedged steps whose current attempt has run
-- longer than its step's threshold, that have no hedge and whose attempt was never hedged,
-- skipping rows other transactions hold; the oldest attempts first. A hedge does not count as an
-- attempt of its own: it runs the same attempt number, recorded as a hedge attempt.
WITH hedged_steps AS (
    SELECT u.workflow, u.step, u.threshold
    FROM unnest(%(workflows)s::text[], %(steps)s::text[], %(thresholds)s::float8[])
         AS u(workflow, step, threshold)
), picked AS (
    SELECT t.id
    FROM konduit_tasks t
    JOIN hedged_steps h ON h.workflow = t.workflow AND h.step = t.step
    JOIN konduit_attempts a ON a.lease_token = t.lease_token
    WHERE t.status = 'running' AND t.hedge_token IS NULL
      AND t.hedged_attempt IS DISTINCT FROM t.attempt
      AND a.started_at < konduit_clock_timestamp() - make_interval(secs => h.threshold)
      AND konduit_deadline_ahead(t.deadline_at)
      AND {{execution_running}}
    ORDER BY a.started_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF t SKIP LOCKED
), hedged AS (
    UPDATE konduit_tasks t
    SET hedge_token = gen_random_uuid(),
        hedge_expires_at = konduit_clock_timestamp() + make_interval(secs => %(lease_seconds)s),
        hedge_worker_id = %(worker_id)s,
        hedged_attempt = t.attempt
    FROM picked
    WHERE t.id = picked.id AND t.status = 'running' AND t.hedge_token IS NULL
      AND t.hedged_attempt IS DISTINCT FROM t.attempt
    -- The hedge's lease is the lease this attempt holds.
    RETURNING t.id, t.execution_id, t.step, t.map_index, t.item, t.attempt, t.max_attempts,
              t.hedge_token AS lease_token, t.queue, t.deadline_at, t.generation,
              t.policy_revision
), attempts AS (
    INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token, hedge)
    SELECT id, attempt, %(worker_id)s, lease_token, true FROM hedged
)
SELECT {{claimed_row}},
       extract(epoch FROM t.deadline_at - konduit_clock_timestamp())::float8 AS deadline_remaining,
       true AS hedged, NULL::float8 AS fallback_age
FROM hedged t
JOIN konduit_executions e ON e.id = t.execution_id;

-- name: task_drop_attempt_if_leased
-- An attempt of a hedged task ended without success (raised, retrying, handed back) while the
-- other attempt runs on: end only this attempt's lease and let the survivor decide the task (a
-- dropped primary hands the primary lease to the hedge). The row is locked whether or not it
-- changes, so no hedge can start before the caller's transaction ends: a caller that finds no
-- other attempt goes on to retry or end the task under the same lock.
WITH mine AS (
    SELECT id, hedge_token
    FROM konduit_tasks
    WHERE id = %(id)s
      AND konduit_lease_or_hedge_held(status, lease_token, hedge_token, %(lease_token)s)
    FOR NO KEY UPDATE
)
UPDATE konduit_tasks t
SET lease_token = CASE WHEN t.lease_token = %(lease_token)s THEN t.hedge_token ELSE t.lease_token END,
    lease_expires_at = CASE WHEN t.lease_token = %(lease_token)s THEN t.hedge_expires_at
                            ELSE t.lease_expires_at END,
    worker_id = CASE WHEN t.lease_token = %(lease_token)s THEN t.hedge_worker_id ELSE t.worker_id END,
    {{hedge_cleared}}
FROM mine
WHERE t.id = %(id)s AND t.id = mine.id AND t.hedge_token IS NOT NULL
  AND konduit_lease_or_hedge_held(t.status, t.lease_token, t.hedge_token, %(lease_token)s)
RETURNING t.id, (mine.hedge_token = %(lease_token)s) AS was_hedge;

-- name: task_list_hedges_rescuable
-- Hedged tasks where one of the two leases ran out (its worker died or hung): the writes that
-- drop or promote the hedge re-check everything (task_drop_hedge_if_rescuable,
-- task_promote_hedge_if_rescuable).
SELECT t.id, t.lease_token, t.hedge_token, t.worker_id, t.hedge_worker_id,
       t.lease_expires_at < konduit_clock_timestamp() AS primary_expired,
       t.hedge_expires_at < konduit_clock_timestamp() AS hedge_expired
FROM konduit_tasks t
WHERE t.hedge_token IS NOT NULL
  AND (t.hedge_expires_at < konduit_clock_timestamp() OR t.lease_expires_at < konduit_clock_timestamp())
ORDER BY t.id
LIMIT %(limit)s;

-- name: task_drop_hedge_if_rescuable
-- A hedge whose worker is gone ends; the primary attempt runs on. The guards of
-- task_lose_if_rescuable, on the hedge's lease and worker, at the time of this write.
UPDATE konduit_tasks t
SET {{hedge_cleared}}
WHERE t.id = %(id)s AND konduit_lease_held(t.status, t.hedge_token, %(hedge_token)s)
  AND konduit_lease_rescuable(t.hedge_worker_id, t.hedge_expires_at, %(lease_seconds)s)
  AND {{task_row_unheld}}
RETURNING t.id;

-- name: task_promote_hedge_if_rescuable
-- The primary's worker is gone while the hedge runs: the hedge's lease becomes the task's lease
-- (its attempt goes on; nothing is retried). The guards of task_lose_if_rescuable, at the time of
-- this write, and the hedge itself must still be live.
UPDATE konduit_tasks t
SET lease_token = t.hedge_token,
    lease_expires_at = t.hedge_expires_at,
    worker_id = t.hedge_worker_id,
    {{hedge_cleared}}
WHERE t.id = %(id)s AND konduit_lease_held(t.status, t.lease_token, %(lease_token)s)
  AND t.hedge_token IS NOT NULL AND t.hedge_expires_at > konduit_clock_timestamp()
  AND konduit_lease_rescuable(t.worker_id, t.lease_expires_at, %(lease_seconds)s)
  AND {{task_row_unheld}}
RETURNING t.id;

-- name: step_attempt_quantile_unhedged
-- A quantile of one step's primary attempt durations over a recent window, for hedge="p95": its
-- successful primaries and those a hedge outran (counted with the time they had run when they
-- were fenced off, a lower bound: leaving them out would lower the quantile with every hedge
-- that wins, and hedge ever earlier).
SELECT percentile_cont(%(quantile)s) WITHIN GROUP (
           ORDER BY extract(epoch FROM a.finished_at - a.started_at)) AS seconds,
       count(*) AS samples
FROM konduit_attempts a
JOIN konduit_tasks t ON t.id = a.task_id
WHERE a.outcome IN ('succeeded', 'outrun') AND NOT a.hedge
  AND a.finished_at > konduit_clock_timestamp() - make_interval(secs => %(window_seconds)s)
  AND t.workflow = %(workflow)s
  AND t.step = %(step)s;
