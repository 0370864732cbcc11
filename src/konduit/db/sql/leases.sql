-- name: task_extend_leases_if_held
-- Heartbeat: extend the leases a worker holds without ever waiting on a row lock, so it can
-- never deadlock with a completion or cancel (which lock the execution first, then its tasks).
-- A token is a task's lease or its hedge's (a worker may hold both of one task: each lease is
-- extended on its own). Returns the requested (id, lease_token) pairs still held: those
-- extended now, and those skipped because another transaction has them locked while (in this
-- statement's snapshot) they are still running under that token; such a task is being ended
-- anyway, and if it is still ours the next heartbeat extends it (a lease lasts several
-- heartbeats). A requested pair missing from the result was lost.
WITH requested AS (
    SELECT u.id, array_agg(u.lease_token) AS tokens
    FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[]) AS u(id, lease_token)
    GROUP BY u.id
),
locked AS (
    SELECT t.id
    FROM konduit_tasks t
    JOIN requested r ON r.id = t.id
    WHERE konduit_lease_or_hedge_held_any(t.status, t.lease_token, t.hedge_token, r.tokens)
    ORDER BY t.id
    FOR NO KEY UPDATE OF t SKIP LOCKED
),
extended AS (
    UPDATE konduit_tasks t
    SET lease_expires_at = CASE WHEN t.lease_token = ANY(r.tokens)
                                THEN konduit_clock_timestamp() + make_interval(secs => %(lease_seconds)s)
                                ELSE t.lease_expires_at END,
        hedge_expires_at = CASE WHEN t.hedge_token = ANY(r.tokens)
                                THEN konduit_clock_timestamp() + make_interval(secs => %(lease_seconds)s)
                                ELSE t.hedge_expires_at END
    FROM requested r
    WHERE t.id = r.id
      AND konduit_lease_or_hedge_held_any(t.status, t.lease_token, t.hedge_token, r.tokens)
      AND t.id IN (SELECT id FROM locked)
    RETURNING t.id, t.lease_token, t.hedge_token, r.tokens
),
held AS (
    SELECT id, lease_token, hedge_token, tokens FROM extended
    UNION ALL
    SELECT t.id, t.lease_token, t.hedge_token, r.tokens
    FROM konduit_tasks t
    JOIN requested r ON r.id = t.id
    WHERE konduit_lease_or_hedge_held_any(t.status, t.lease_token, t.hedge_token, r.tokens)
      AND t.id NOT IN (SELECT id FROM locked)
)
SELECT h.id, k.token AS lease_token
FROM held h
CROSS JOIN LATERAL unnest(ARRAY[h.lease_token, h.hedge_token]) AS k(token)
WHERE k.token = ANY(h.tokens);
