-- name: worker_register
-- Record a worker coming up, with what it serves; its queues get their fair-turn clocks
-- (migration 0019) here, so that claims only ever update one.
WITH clocks AS (
    INSERT INTO konduit_queue_clocks (queue, fair_turn)
    SELECT DISTINCT unnest(%(queues)s::text[]), 0
    ON CONFLICT (queue) DO NOTHING
)
INSERT INTO konduit_workers (id, hostname, pid, concurrency, queues, workflows, isolation,
                             lease_seconds)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(concurrency)s, %(queues)s, %(workflows)s,
        %(isolation)s, %(lease_seconds)s)
ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = konduit_clock_timestamp(), stopped_at = NULL,
    workflows = EXCLUDED.workflows, queues = EXCLUDED.queues, concurrency = EXCLUDED.concurrency,
    isolation = EXCLUDED.isolation, lease_seconds = EXCLUDED.lease_seconds;

-- name: worker_heartbeat
-- Record that a worker is alive, with how many tasks it runs and how many threads it abandoned.
-- A worker that does not lead its deployment's maintenance names its lease (`leader`): the beat
-- says whether that lease is free to take (absent, expired, or its holder stopped or its session
-- gone), so that watching the leader costs a follower no transaction of its own.
UPDATE konduit_workers
SET last_heartbeat_at = konduit_clock_timestamp(), running = %(running)s, abandoned = %(abandoned)s,
    stopped_at = NULL
WHERE id = %(id)s
RETURNING %(leader)s::text IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM konduit_leaders l
    WHERE l.name = %(leader)s::text
      AND (l.worker_id = %(id)s
           OR (l.expires_at >= konduit_clock_timestamp()
               AND NOT EXISTS (SELECT 1 FROM konduit_workers w
                               WHERE w.id = l.worker_id AND w.stopped_at IS NOT NULL)
               AND NOT konduit_worker_session_gone(l.worker_id)))) AS leader_free;

-- name: worker_set_session
-- Record the backend pid of the worker's own (heartbeat) session, once per connection it opens:
-- the deadline sweep reads a worker whose session is gone as dead (konduit_worker_session_gone).
UPDATE konduit_workers SET session_pid = pg_backend_pid() WHERE id = %(id)s;

-- name: worker_stop
-- Record a worker shutting down cleanly.
UPDATE konduit_workers SET stopped_at = konduit_clock_timestamp(), running = 0 WHERE id = %(id)s;

-- name: worker_list_live
-- Workers that are up: not stopped, and heard from within `stale_seconds` (or their own lease);
-- `leader`: it holds the maintenance lease of its deployment (konduit_leaders).
SELECT id, hostname, pid, concurrency, queues, workflows, isolation, running, abandoned,
       started_at, last_heartbeat_at, lease_seconds,
       extract(epoch FROM konduit_clock_timestamp() - last_heartbeat_at)::float8 AS heartbeat_age,
       EXISTS (SELECT 1 FROM konduit_leaders l WHERE l.worker_id = konduit_workers.id
                 AND l.expires_at > konduit_clock_timestamp()) AS leader
FROM konduit_workers
WHERE stopped_at IS NULL
  AND last_heartbeat_at > konduit_clock_timestamp()
      - make_interval(secs => COALESCE(%(stale_seconds)s, lease_seconds))
ORDER BY hostname, started_at;

-- name: worker_serving_exists
-- Whether any live worker claims tasks of this workflow version (`konduit status` says when none).
SELECT EXISTS (
    SELECT 1 FROM konduit_workers
    WHERE stopped_at IS NULL
      AND last_heartbeat_at > konduit_clock_timestamp() - make_interval(secs => lease_seconds)
      AND %(workflow)s = ANY(workflows)
) AS serving;
