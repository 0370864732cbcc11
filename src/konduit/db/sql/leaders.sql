-- name: leader_take
-- Take or renew the lease `name` for `worker_id`: renewed when it holds it; taken when the
-- holder's lease expired, it stopped, or its (heartbeat) session is gone; created when absent.
-- A row comes back only if `worker_id` holds it afterwards. A worker that does not get it
-- changes nothing (no row is locked, no transaction id taken): a follower's try costs a read.
-- Two followers racing for an expired lease: the second's UPDATE re-checks its WHERE on the
-- first's row version and finds it held.
WITH taken AS (
    UPDATE konduit_leaders l
    SET worker_id = %(worker_id)s,
        elected_at = CASE WHEN l.worker_id = %(worker_id)s THEN l.elected_at
                          ELSE konduit_clock_timestamp() END,
        renewed_at = konduit_clock_timestamp(),
        expires_at = konduit_clock_timestamp() + make_interval(secs => %(lease_seconds)s)
    WHERE l.name = %(name)s
      AND (l.worker_id = %(worker_id)s
           OR l.expires_at < konduit_clock_timestamp()
           OR EXISTS (SELECT 1 FROM konduit_workers w
                      WHERE w.id = l.worker_id AND w.stopped_at IS NOT NULL)
           OR konduit_worker_session_gone(l.worker_id))
    RETURNING l.worker_id, l.elected_at
), created AS (
    INSERT INTO konduit_leaders (name, worker_id, elected_at, renewed_at, expires_at)
    SELECT %(name)s, %(worker_id)s, konduit_clock_timestamp(), konduit_clock_timestamp(),
           konduit_clock_timestamp() + make_interval(secs => %(lease_seconds)s)
    WHERE NOT EXISTS (SELECT 1 FROM konduit_leaders WHERE name = %(name)s)
    ON CONFLICT (name) DO NOTHING
    RETURNING worker_id, elected_at
)
SELECT worker_id, elected_at FROM taken
UNION ALL
SELECT worker_id, elected_at FROM created;

-- name: leader_resign
-- A leader stopping: give the lease up and tell the deployment's other workers (LISTEN
-- konduit_leader), so that one of them takes it now rather than when it expires.
WITH gone AS (
    DELETE FROM konduit_leaders WHERE name = %(name)s AND worker_id = %(worker_id)s
    RETURNING name
)
SELECT pg_notify('konduit_leader', name) FROM gone;
