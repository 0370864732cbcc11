-- Keys of per-key limits (migration 0026): storing them when executions start, admitting
-- executions under Workflow(max_running=, key=), and retiring the rows of idle keys.

-- name: execution_set_limit_keys_many
-- New executions' keys (same transaction as their insert, before any claim can see them):
-- each keyed step's key, copied onto the root tasks already made (the trigger copies it onto
-- every later task), and the execution's key under max_running.
WITH keyed AS (
    UPDATE konduit_executions e
    SET limit_keys = u.limit_keys::jsonb, run_key = u.run_key
    FROM unnest(%(ids)s::uuid[], %(limit_keys)s::text[], %(run_keys)s::text[])
         AS u(id, limit_keys, run_key)
    WHERE e.id = u.id
    RETURNING e.id, e.limit_keys
)
UPDATE konduit_tasks t
SET limit_key = konduit_limit_key(k.limit_keys, t.workflow, t.step)
FROM keyed k
WHERE t.execution_id = k.id AND t.limited AND k.limit_keys IS NOT NULL;

-- name: execution_lock_run_slots_many
-- Create (on demand) and lock the rows of these max_running keys, in one order (two starts
-- sharing keys queue, never deadlock); the caller counts their running executions in its next
-- statement, whose snapshot is taken after the locks were granted.
INSERT INTO konduit_run_slots (workflow_name, key, max_running)
SELECT DISTINCT ON (u.workflow_name, u.key) u.workflow_name, u.key, u.max_running
FROM unnest(%(workflow_names)s::text[], %(keys)s::text[], %(max_runnings)s::int[])
     AS u(workflow_name, key, max_running)
ORDER BY u.workflow_name, u.key
ON CONFLICT (workflow_name, key) DO UPDATE
SET max_running = EXCLUDED.max_running, updated_at = konduit_clock_timestamp();

-- name: execution_lock_run_slot
-- Lock one max_running key's row (a finish of one of its executions); no row: nothing to fill.
SELECT workflow_name, key
FROM konduit_run_slots
WHERE workflow_name = %(workflow_name)s AND key = %(key)s
FOR UPDATE;

-- name: execution_lock_many_with_run_keys
-- A bulk batch's executions, locked in id order before anything else of the batch, with their
-- max_running keys: the batch locks those keys' rows next (in key order, as a start does), so
-- it never holds one key's row while it waits for an execution or for another key's row out
-- of order (konduit.engine.bulk).
SELECT id, workflow_name, workflow_version, run_key
FROM konduit_executions
WHERE id = ANY(%(ids)s::uuid[])
ORDER BY id
FOR NO KEY UPDATE;

-- name: execution_lock_run_slots_existing
-- Lock the rows of these max_running keys that exist, in the order execution_lock_run_slots_many
-- takes them (a bulk cancel: its finishes fill these keys; a key with no row has nothing to fill).
SELECT s.workflow_name, s.key
FROM konduit_run_slots s
JOIN (SELECT DISTINCT u.workflow_name, u.key
      FROM unnest(%(workflow_names)s::text[], %(keys)s::text[]) AS u(workflow_name, key)) AS u
  ON s.workflow_name = u.workflow_name AND s.key = u.key
ORDER BY s.workflow_name, s.key
FOR UPDATE OF s;

-- name: execution_hold_many_over_max_running
-- Under the keys' row locks: the new executions past their key's max_running wait `pending`
-- (the last to begin waiting first), as does every new one of a key with executions already
-- pending (they start first). A held execution's ready tasks are set aside from every claim (limited,
-- with no key: no claim reads them) until execution_start_pending_in_run_slots starts it.
WITH mine AS (
    SELECT u.id, u.workflow_name, u.run_key
    FROM unnest(%(ids)s::uuid[], %(workflow_names)s::text[], %(run_keys)s::text[])
         AS u(id, workflow_name, run_key)
), slots AS (
    SELECT s.workflow_name, s.key,
           (SELECT count(*) FROM konduit_executions e
            WHERE e.workflow_name = s.workflow_name AND e.run_key = s.key
              AND e.status = 'running')::int - s.max_running AS excess,
           EXISTS (SELECT 1 FROM konduit_executions e
                   WHERE e.workflow_name = s.workflow_name AND e.run_key = s.key
                     AND e.status = 'pending') AS queued
    FROM konduit_run_slots s
    WHERE (s.workflow_name, s.key) IN (SELECT workflow_name, run_key FROM mine)
), over AS (
    SELECT m.id
    FROM (SELECT m.id, s.excess, s.queued,
                 row_number() OVER (PARTITION BY m.workflow_name, m.run_key
                                    ORDER BY coalesce(e.queued_at, e.created_at) DESC,
                                             e.id DESC) AS nth
          FROM mine m
          JOIN slots s ON s.workflow_name = m.workflow_name AND s.key = m.run_key
          JOIN konduit_executions e ON e.id = m.id AND e.status = 'running') AS m
    WHERE m.queued OR m.nth <= m.excess
), held AS (
    UPDATE konduit_executions e
    SET status = 'pending'
    FROM over
    WHERE e.id = over.id AND e.status = 'running'
    RETURNING e.id
), set_aside AS (
    -- A budget cut by the execution's window (a moment from now) waits too: it runs from the
    -- first claim, as an uncut one does, so no deadline passes while the execution is pending.
    UPDATE konduit_tasks t
    SET limited = true, limit_key = NULL, deadline_at = NULL
    FROM held h
    WHERE t.execution_id = h.id AND t.status = 'ready' AND t.attempt = 0
)
SELECT coalesce(array_agg(id), '{}') AS held FROM held;

-- name: execution_start_pending_in_run_slots
-- Under the caller's lock of these keys' rows: start the pending executions of each that began
-- waiting first (queued_at, migration 0048: a re-run or a started-later one waits from then,
-- any other from its start) while it has fewer running than its max_running, skipping one
-- another transaction holds (a cancel: never waited for, so a cancel and a fill cannot
-- deadlock). Their tasks get their
-- keys and limits back; the workers of their queues are woken.
WITH slots AS (
    SELECT s.workflow_name, s.key,
           s.max_running - (SELECT count(*) FROM konduit_executions e
                            WHERE e.workflow_name = s.workflow_name AND e.run_key = s.key
                              AND e.status = 'running')::int AS free
    FROM unnest(%(workflow_names)s::text[], %(keys)s::text[]) AS u(workflow_name, key)
    JOIN konduit_run_slots s ON s.workflow_name = u.workflow_name AND s.key = u.key
), due AS (
    SELECT p.id
    FROM slots s
    CROSS JOIN LATERAL (
        SELECT e.id
        FROM konduit_executions e
        WHERE e.workflow_name = s.workflow_name AND e.run_key = s.key AND e.status = 'pending'
        ORDER BY coalesce(e.queued_at, e.created_at), e.id
        LIMIT greatest(s.free, 0)
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS p
), started AS (
    UPDATE konduit_executions e
    SET status = 'running'
    FROM due
    WHERE e.id = due.id AND e.status = 'pending'
    RETURNING e.id, e.limit_keys
), released AS (
    UPDATE konduit_tasks t
    SET limit_key = konduit_limit_key(s.limit_keys, t.workflow, t.step),
        limited = konduit_limit_key(s.limit_keys, t.workflow, t.step) IS NOT NULL OR EXISTS (
            SELECT 1 FROM konduit_flow_limits f
            WHERE f.workflow = t.workflow AND f.step = t.step
              AND (f.concurrency IS NOT NULL OR f.rate_count IS NOT NULL))
    FROM started s
    WHERE t.execution_id = s.id AND t.status = 'ready'
    RETURNING t.queue
), woken AS (
    SELECT count(pg_notify('konduit_ready', q.queue)) AS queues
    FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT coalesce(array_agg(id), '{}') AS started, (SELECT queues FROM woken) AS woken
FROM started;

-- name: execution_lock_run_slots_pending
-- The maintenance pass's share: lock the rows of up to `limit` keys with pending executions
-- (skipping those another transaction holds), for execution_start_pending_in_run_slots.
SELECT s.workflow_name, s.key
FROM (SELECT DISTINCT e.workflow_name, e.run_key
      FROM konduit_executions e
      WHERE e.status = 'pending' AND e.run_key IS NOT NULL
      LIMIT %(limit)s) AS p
JOIN konduit_run_slots s ON s.workflow_name = p.workflow_name AND s.key = p.run_key
FOR UPDATE OF s SKIP LOCKED;

-- name: execution_delete_idle_run_slots
-- Retire the rows of max_running keys with no scheduled, pending or running execution, idle
-- for `idle_seconds` (a start creates its key's row again; a scheduled one, when due, needs it).
-- Up to `limit`, skipping held rows.
DELETE FROM konduit_run_slots s
USING (SELECT workflow_name, key
       FROM konduit_run_slots r
       WHERE r.updated_at < konduit_clock_timestamp() - make_interval(secs => %(idle_seconds)s)
         AND NOT EXISTS (SELECT 1 FROM konduit_executions e
                         WHERE e.workflow_name = r.workflow_name AND e.run_key = r.key
                           AND e.status IN ('scheduled', 'pending', 'running'))
       LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED) AS idle
WHERE s.workflow_name = idle.workflow_name AND s.key = idle.key
RETURNING s.key;

-- name: flow_limit_delete_idle_keys
-- Retire the rows of keys no ready or running task refers to, untouched for `idle_seconds`
-- and with no start left in their rate window (a claim creates the row again when the key has
-- work); their throttled time moves to their step's row, so the step's total stays whole. Up
-- to `limit`, skipping rows a claim holds.
WITH idle AS (
    SELECT fk.workflow, fk.step, fk.key,
           fk.throttled_seconds + COALESCE(extract(epoch FROM fk.updated_at - fk.throttled_since),
                                           0)::float8 AS throttled_seconds,
           fk.throttled_claims
    FROM konduit_flow_keys fk
    JOIN konduit_flow_limits f ON f.workflow = fk.workflow AND f.step = fk.step
    WHERE fk.updated_at < konduit_clock_timestamp() - make_interval(secs => %(idle_seconds)s)
      AND NOT EXISTS (SELECT 1 FROM unnest(fk.starts) AS s(at)
                      WHERE s.at > konduit_clock_timestamp() - make_interval(
                          secs => COALESCE(f.rate_seconds, 0)))
      AND NOT EXISTS (SELECT 1 FROM konduit_tasks t
                      WHERE t.limit_key = fk.key AND t.workflow = fk.workflow
                        AND t.step = fk.step AND t.status = 'ready')
      AND NOT EXISTS (SELECT 1 FROM konduit_tasks t
                      WHERE t.limit_key = fk.key AND t.workflow = fk.workflow
                        AND t.step = fk.step AND t.status = 'running')
    ORDER BY fk.updated_at
    LIMIT %(limit)s
    FOR UPDATE OF fk SKIP LOCKED
), deleted AS (
    DELETE FROM konduit_flow_keys fk
    USING idle
    WHERE fk.workflow = idle.workflow AND fk.step = idle.step AND fk.key = idle.key
    RETURNING idle.*
), folded AS (
    UPDATE konduit_flow_limits f
    SET throttled_seconds = f.throttled_seconds + d.seconds,
        throttled_claims = f.throttled_claims + d.claims
    FROM (SELECT workflow, step, sum(throttled_seconds) AS seconds,
                 sum(throttled_claims) AS claims
          FROM deleted GROUP BY workflow, step) AS d
    WHERE f.workflow = d.workflow AND f.step = d.step
)
SELECT count(*)::int AS deleted FROM deleted;
