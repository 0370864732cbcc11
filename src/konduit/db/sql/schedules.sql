-- name: schedule_upsert_many_from_code
-- Store the schedules a worker's code defines. A new one counts from now (its past ticks are
-- not missed); an unchanged one is not written; a changed one takes the new definition, and when
-- its timing changed it counts from now too (the old timing's ticks are not the new one's).
INSERT INTO konduit_schedules AS s
    (name, workflow_name, workflow_version, cron, every_seconds, timezone, input, window_seconds,
     missed, definition_hash, last_tick)
SELECT d.name, d.workflow_name, d.workflow_version, d.cron, d.every_seconds, d.timezone,
       d.input::jsonb, d.window_seconds, d.missed, d.definition_hash,
       coalesce(%(now)s::timestamptz, konduit_clock_timestamp())
FROM unnest(%(names)s::text[], %(workflow_names)s::text[], %(workflow_versions)s::int[],
            %(crons)s::text[], %(every_seconds)s::int[], %(timezones)s::text[],
            %(inputs)s::text[], %(window_seconds)s::float8[], %(misseds)s::text[],
            %(definition_hashes)s::text[])
     AS d(name, workflow_name, workflow_version, cron, every_seconds, timezone, input,
          window_seconds, missed, definition_hash)
ORDER BY d.name
ON CONFLICT (name) DO UPDATE
SET workflow_name = EXCLUDED.workflow_name,
    workflow_version = EXCLUDED.workflow_version,
    cron = EXCLUDED.cron,
    every_seconds = EXCLUDED.every_seconds,
    timezone = EXCLUDED.timezone,
    input = EXCLUDED.input,
    window_seconds = EXCLUDED.window_seconds,
    missed = EXCLUDED.missed,
    definition_hash = EXCLUDED.definition_hash,
    last_tick = CASE
        WHEN (s.cron, s.every_seconds, s.timezone)
             IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every_seconds, EXCLUDED.timezone)
        THEN s.last_tick
        ELSE greatest(s.last_tick, EXCLUDED.last_tick) END,
    updated_at = konduit_clock_timestamp()
WHERE s.definition_hash <> EXCLUDED.definition_hash;

-- name: schedule_list_by_names
-- The state of some schedules, unlocked, with the database's clock: which of them are due.
SELECT name, cron, every_seconds, timezone, last_tick, paused,
       coalesce(%(now)s::timestamptz, konduit_clock_timestamp()) AS now
FROM konduit_schedules
WHERE name = ANY(%(names)s::text[])
ORDER BY name;

-- name: schedule_lock_if_active
-- Lock one schedule to start its due ticks, unless it is paused or another worker holds it
-- (that worker is starting the same ticks: this one moves on instead of waiting).
SELECT name, workflow_name, workflow_version, cron, every_seconds, timezone, input,
       window_seconds, missed, last_tick, coalesce(%(now)s::timestamptz, konduit_clock_timestamp()) AS now
FROM konduit_schedules
WHERE name = %(name)s AND NOT paused
FOR UPDATE SKIP LOCKED;

-- name: schedule_advance_if_behind
-- Record the ticks up to `tick` as handled (and the execution of the latest one started), only
-- while the schedule is still behind that tick and not paused.
UPDATE konduit_schedules
SET last_tick = %(tick)s,
    last_execution_id = coalesce(%(execution_id)s, last_execution_id),
    updated_at = konduit_clock_timestamp()
WHERE name = %(name)s AND last_tick < %(tick)s AND NOT paused
RETURNING name;

-- name: execution_set_scheduled_at_if_keyed
-- Mark executions with the tick they were started for, each only while it carries that tick's
-- idempotency key (so a tick never marks an execution some other start created).
UPDATE konduit_executions e
SET scheduled_at = u.tick
FROM unnest(%(ids)s::uuid[], %(keys)s::text[], %(ticks)s::timestamptz[]) AS u(id, key, tick)
WHERE e.id = u.id AND e.idempotency_key = u.key AND e.scheduled_at IS NULL;

-- name: schedule_set_paused
-- Pause or resume a schedule; returns whether it was paused before. A resumed schedule's
-- missed policy decides what becomes of the ticks that passed while it was paused.
UPDATE konduit_schedules s
SET paused = %(paused)s,
    paused_at = CASE WHEN %(paused)s THEN coalesce(s.paused_at, konduit_clock_timestamp()) END,
    updated_at = konduit_clock_timestamp()
FROM (SELECT name, paused FROM konduit_schedules WHERE name = %(name)s FOR UPDATE) AS before
WHERE s.name = before.name
RETURNING before.paused AS was_paused;

-- name: schedule_list
-- Every schedule with its state and the execution its latest started tick made (if kept).
SELECT s.name, s.workflow_name, s.workflow_version, s.cron, s.every_seconds, s.timezone,
       s.missed, s.window_seconds, s.input, s.paused, s.paused_at, s.last_tick,
       s.last_execution_id, e.status AS last_status, e.scheduled_at AS last_scheduled_at,
       e.created_at AS last_started_at, s.created_at, s.updated_at,
       konduit_clock_timestamp() AS now
FROM konduit_schedules s
LEFT JOIN konduit_executions e ON e.id = s.last_execution_id
ORDER BY s.name;
