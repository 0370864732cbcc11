-- name: worker_register
-- Record a worker coming up.
INSERT INTO konduit_workers (id, hostname, pid, concurrency, queues)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(concurrency)s, %(queues)s)
ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = clock_timestamp(), stopped_at = NULL;

-- name: worker_heartbeat
-- Record that a worker is alive.
UPDATE konduit_workers SET last_heartbeat_at = clock_timestamp() WHERE id = %(id)s;

-- name: worker_stop
-- Record a worker shutting down cleanly.
UPDATE konduit_workers SET stopped_at = clock_timestamp() WHERE id = %(id)s;
