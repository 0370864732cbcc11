-- Konduit schema, version 33: maintenance on an elected worker.
--
-- Every worker used to run every maintenance pass (rescue, deadline sweep, due waits, scheduled
-- starts, triggers, timeouts, the stall watchdog, repairs, retention, alerts, schedules) on its
-- own cadence: ten idle workers cost the database ten times one. Now one worker of each
-- deployment (the workers serving the same workflow versions: the passes need their code) holds
-- a lease row here and runs them; the others take it over once it expires, or at once when its
-- holder stopped or its session is gone. A lease row, not an advisory lock: it holds behind a
-- transaction pooler (PgBouncer), where a session lock would not. The passes stay idempotent
-- (each write re-checks its guard), so two leaders for a moment do no harm.
CREATE TABLE konduit_leaders (
    name text PRIMARY KEY,            -- 'maintenance:<deployment>' (konduit.worker.leadership)
    worker_id text NOT NULL,          -- the holder (konduit_workers.id)
    elected_at timestamptz NOT NULL,  -- when the holder took it
    renewed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL   -- past it, any worker of the deployment may take it
);
