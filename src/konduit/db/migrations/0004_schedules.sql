-- Konduit schema, version 4: schedules.
-- A schedule's definition comes from code (Workflow.schedule), upserted by each worker as it
-- starts; its state is what the code cannot know: the last tick handled and whether it is
-- paused. Each tick's execution carries the key `schedule:<name>:<tick>`, so the unique index on
-- (workflow_name, idempotency_key) lets one execution per tick exist however many workers try.
CREATE TABLE konduit_schedules (
    name               text        PRIMARY KEY,
    workflow_name      text        NOT NULL,
    workflow_version   integer     NOT NULL,
    cron               text,
    every_seconds      integer     CHECK (every_seconds >= 1),
    timezone           text        NOT NULL DEFAULT 'UTC',
    input              jsonb       NOT NULL DEFAULT 'null',
    window_seconds     float8      CHECK (window_seconds > 0),
    missed             text        NOT NULL CHECK (missed IN ('skip', 'latest', 'all')),
    definition_hash    text        NOT NULL,
    -- Every tick up to here is handled: started, or passed over by the missed policy. A new
    -- schedule starts at its creation time, so none of its past ticks counts as missed.
    last_tick          timestamptz NOT NULL,
    -- The execution of the latest tick started; a pruned one leaves NULL, not a dangling id
    -- (No index for the delete's check: the table has one row per schedule.)
    last_execution_id  uuid        REFERENCES konduit_executions (id) ON DELETE SET NULL,
    paused             boolean     NOT NULL DEFAULT false,
    paused_at          timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (workflow_name, workflow_version) REFERENCES konduit_workflows (name, version),
    CHECK ((cron IS NULL) <> (every_seconds IS NULL)),
    CHECK (paused = (paused_at IS NOT NULL))
);

-- The tick a scheduled execution was started for (ctx.scheduled_at); NULL for other starts.
ALTER TABLE konduit_executions ADD COLUMN scheduled_at timestamptz;
