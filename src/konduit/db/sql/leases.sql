-- name: task_extend_leases_if_held
-- Heartbeat: extend the leases a worker holds without ever waiting on a row lock, so it can
-- never deadlock with a completion or cancel (which lock the execution first, then its tasks).
-- Returns the requested ids still held by their token: those extended now, and those skipped
-- because another transaction has them locked while (in this statement's snapshot) they are
-- still running under that token; such a task is being ended anyway, and if it is still ours
-- the next heartbeat extends it (a lease lasts several heartbeats). A requested id missing from
-- the result was lost.
WITH requested AS (
    SELECT u.id, u.lease_token
    FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[]) AS u(id, lease_token)
),
locked AS (
    SELECT t.id
    FROM konduit_tasks t
    JOIN requested r ON r.id = t.id AND r.lease_token = t.lease_token
    WHERE t.status = 'running'
    ORDER BY t.id
    FOR NO KEY UPDATE OF t SKIP LOCKED
),
extended AS (
    UPDATE konduit_tasks t
    SET lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s)
    FROM requested r
    WHERE t.id = r.id AND t.lease_token = r.lease_token AND t.status = 'running'
      AND t.id IN (SELECT id FROM locked)
    RETURNING t.id
)
SELECT id FROM extended
UNION ALL
SELECT t.id
FROM konduit_tasks t
JOIN requested r ON r.id = t.id AND r.lease_token = t.lease_token
WHERE t.status = 'running' AND t.id NOT IN (SELECT id FROM locked);
