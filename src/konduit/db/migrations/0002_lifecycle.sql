-- Konduit schema, version 2: the task lifecycle.
-- Workers say what they serve and how they are doing, so rescue can key on liveness (a worker
-- whose own heartbeat is fresh is alive, whatever a single lease says) and `konduit workers` and
-- `konduit status` can tell an execution that no live worker serves.

ALTER TABLE konduit_workers
    ADD COLUMN workflows  text[]  NOT NULL DEFAULT '{}',  -- 'name@version' this worker claims
    ADD COLUMN running    integer NOT NULL DEFAULT 0 CHECK (running >= 0),
    ADD COLUMN abandoned  integer NOT NULL DEFAULT 0 CHECK (abandoned >= 0),  -- hung sync threads
    ADD COLUMN isolation  text    NOT NULL DEFAULT 'thread' CHECK (isolation IN ('thread', 'process')),
    ADD COLUMN lease_seconds double precision NOT NULL DEFAULT 15 CHECK (lease_seconds > 0);

CREATE INDEX konduit_workers_live ON konduit_workers (last_heartbeat_at) WHERE stopped_at IS NULL;

-- The deadline sweep ends ready tasks too (a retry waiting out its backoff, or one no worker
-- claimed in time), so the deadline index covers both hot statuses.
DROP INDEX konduit_tasks_deadline;
CREATE INDEX konduit_tasks_deadline ON konduit_tasks (deadline_at)
    WHERE status IN ('ready', 'running') AND deadline_at IS NOT NULL;

-- Every completion of an execution's tasks rewrote its row; updates are now skipped when nothing
-- changed, and the rest stay HOT with room on the page.
ALTER TABLE konduit_executions SET (fillfactor = 80);
