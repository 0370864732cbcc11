-- Konduit schema, version 13: durable waits (docs/durable-waits.md).
-- A wait step (event, timer, child workflow) is armed by an ordinary attempt that evaluates its
-- user lambdas on a worker; the task then rests in the status `waiting`, holding no lease and
-- no worker slot, until the engine wakes it (event, timer, child's end) or its deadline ends it.

ALTER TABLE konduit_tasks DROP CONSTRAINT konduit_tasks_status_check;
ALTER TABLE konduit_tasks ADD CONSTRAINT konduit_tasks_status_check
    CHECK (status IN ('ready', 'running', 'waiting', 'succeeded', 'degraded', 'timed_out',
                      'failed', 'cancelled', 'skipped'));
ALTER TABLE konduit_tasks DROP CONSTRAINT konduit_tasks_check2;
ALTER TABLE konduit_tasks ADD CONSTRAINT konduit_tasks_unfinished
    CHECK ((status IN ('ready', 'running', 'waiting')) = (finished_at IS NULL));

-- What a waiting task waits for; kept after it ends, for status pages.
ALTER TABLE konduit_tasks
    ADD COLUMN wait_kind  text CHECK (wait_kind IN ('event', 'timer', 'child')),
    ADD COLUMN wait_event text,         -- event steps: the event's name
    ADD COLUMN wait_key   text,         -- event steps: the key the arming attempt computed
    ADD COLUMN wait_until timestamptz,  -- timers: when it fires
    ADD COLUMN wait_child uuid,         -- child workflows: the child execution
    ADD CONSTRAINT konduit_tasks_waiting_for
        CHECK (status <> 'waiting' OR wait_kind IS NOT NULL);

-- The arming attempt ends as 'waiting'.
ALTER TABLE konduit_attempts DROP CONSTRAINT konduit_attempts_outcome_check;
ALTER TABLE konduit_attempts ADD CONSTRAINT konduit_attempts_outcome_check
    CHECK (outcome IN ('succeeded', 'degraded', 'timed_out', 'failed', 'cancelled', 'retry',
                       'lost', 'released', 'outrun', 'dropped', 'waiting'));

-- The deadline sweep ends waiting tasks too.
DROP INDEX konduit_tasks_deadline;
CREATE INDEX konduit_tasks_deadline ON konduit_tasks (deadline_at)
    WHERE status IN ('ready', 'running', 'waiting') AND deadline_at IS NOT NULL;
-- send_event finds the waiting task of a key; the sweep finds due timers and ended children.
CREATE INDEX konduit_tasks_waiting_event ON konduit_tasks (wait_event, wait_key)
    WHERE status = 'waiting' AND wait_kind = 'event';
CREATE INDEX konduit_tasks_waiting_timer ON konduit_tasks (wait_until)
    WHERE status = 'waiting' AND wait_kind = 'timer';
CREATE INDEX konduit_tasks_waiting_child ON konduit_tasks (wait_child)
    WHERE wait_kind = 'child';

-- Events sent before a task waited for them, kept until one consumes it (at most once), and
-- the events that woke a task, for the record.
CREATE TABLE konduit_events (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text        NOT NULL,
    key           text,
    execution_id  uuid,
    payload       jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    consumed_by   bigint,       -- the task it woke (no foreign key: retention prunes tasks)
    consumed_at   timestamptz,
    CHECK (key IS NOT NULL OR execution_id IS NOT NULL),
    CHECK ((consumed_by IS NULL) = (consumed_at IS NULL))
);
CREATE INDEX konduit_events_pending ON konduit_events (name, id) WHERE consumed_at IS NULL;
CREATE UNIQUE INDEX konduit_events_consumed_once ON konduit_events (consumed_by)
    WHERE consumed_by IS NOT NULL;
