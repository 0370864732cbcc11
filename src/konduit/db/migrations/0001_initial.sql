-- Konduit schema, version 1.
-- The schema enforces what the engine promises: a task exists once per (execution, step, item),
-- statuses are closed sets, a running task always carries a lease.

CREATE TABLE konduit_workflows (
    name        text        NOT NULL,
    version     integer     NOT NULL CHECK (version >= 1),
    spec_hash   text        NOT NULL,
    spec        jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

CREATE TABLE konduit_executions (
    id                uuid        PRIMARY KEY,
    workflow_name     text        NOT NULL,
    workflow_version  integer     NOT NULL,
    status            text        NOT NULL DEFAULT 'running'
        CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'timed_out', 'cancelled')),
    input             jsonb       NOT NULL DEFAULT 'null',
    input_hash        text        NOT NULL,
    output            jsonb,
    error             text,
    idempotency_key   text,
    steps_pending     integer     NOT NULL CHECK (steps_pending >= 0),
    output_version    integer     NOT NULL DEFAULT 0 CHECK (output_version >= 0),
    generation        integer     NOT NULL DEFAULT 1 CHECK (generation >= 1),  -- +1 per repair
    deadline_at       timestamptz,  -- the publication window: a target that plans are checked against
    timeout_at        timestamptz,  -- a hard limit: past it the execution ends timed_out
    created_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    FOREIGN KEY (workflow_name, workflow_version) REFERENCES konduit_workflows (name, version),
    CHECK ((status IN ('pending', 'running')) = (finished_at IS NULL))
);

CREATE UNIQUE INDEX konduit_executions_idempotency_key
    ON konduit_executions (workflow_name, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX konduit_executions_created_at ON konduit_executions (created_at DESC);
CREATE INDEX konduit_executions_workflow ON konduit_executions (workflow_name, created_at DESC);
CREATE INDEX konduit_executions_running ON konduit_executions (created_at) WHERE status = 'running';
CREATE INDEX konduit_executions_timeout ON konduit_executions (timeout_at)
    WHERE status = 'running' AND timeout_at IS NOT NULL;

-- Join state: one row per step of an execution, counters updated under the execution lock so a
-- completion never re-reads its siblings (see konduit.advance).
CREATE TABLE konduit_steps (
    execution_id        uuid        NOT NULL REFERENCES konduit_executions (id) ON DELETE CASCADE,
    step                text        NOT NULL,
    status              text        NOT NULL
        CHECK (status IN ('waiting', 'active', 'succeeded', 'degraded', 'timed_out', 'failed',
                          'cancelled', 'skipped')),
    up_total            integer     NOT NULL CHECK (up_total >= 0),
    up_pending          integer     NOT NULL CHECK (up_pending >= 0 AND up_pending <= up_total),
    up_ok               integer     NOT NULL DEFAULT 0 CHECK (up_ok >= 0),
    up_failed           integer     NOT NULL DEFAULT 0 CHECK (up_failed >= 0),
    up_required_failed  integer     NOT NULL DEFAULT 0 CHECK (up_required_failed >= 0),
    up_skipped          integer     NOT NULL DEFAULT 0 CHECK (up_skipped >= 0),
    tasks_total         integer     CHECK (tasks_total >= 0),
    tasks_pending       integer     NOT NULL DEFAULT 0 CHECK (tasks_pending >= 0),
    tasks_ok            integer     NOT NULL DEFAULT 0 CHECK (tasks_ok >= 0),
    tasks_degraded      integer     NOT NULL DEFAULT 0 CHECK (tasks_degraded >= 0),
    tasks_failed        integer     NOT NULL DEFAULT 0 CHECK (tasks_failed >= 0),
    first_upstream_at   timestamptz,  -- first branch ended: the fan-in wait starts
    last_upstream_at    timestamptz,  -- the branch that ended last before the join fired
    straggler           text,         -- ... and which branch that was
    fired_at            timestamptz,  -- join ready: tasks created
    ended_at            timestamptz,
    PRIMARY KEY (execution_id, step),
    CHECK (status <> 'active' OR fired_at IS NOT NULL)
) WITH (fillfactor = 80);

CREATE TABLE konduit_tasks (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    execution_id      uuid        NOT NULL REFERENCES konduit_executions (id) ON DELETE CASCADE,
    workflow          text        NOT NULL,  -- 'name@version': workers claim only what they know
    step              text        NOT NULL,
    map_index         integer     NOT NULL DEFAULT 0 CHECK (map_index >= 0),
    generation        integer     NOT NULL DEFAULT 1 CHECK (generation >= 1),
    item              jsonb,
    status            text        NOT NULL DEFAULT 'ready'
        CHECK (status IN ('ready', 'running', 'succeeded', 'degraded', 'timed_out', 'failed',
                          'cancelled', 'skipped')),
    queue             text        NOT NULL DEFAULT 'default',
    priority          integer     NOT NULL DEFAULT 0,
    run_at            timestamptz NOT NULL DEFAULT now(),
    attempt           integer     NOT NULL DEFAULT 0,
    max_attempts      integer     NOT NULL CHECK (max_attempts >= 1),
    lease_token       uuid,
    lease_expires_at  timestamptz,
    worker_id         text,
    deadline_seconds  double precision CHECK (deadline_seconds > 0),  -- the branch's time budget
    deadline_at       timestamptz,  -- set at first claim: past it the task degrades or times out
    routes            text[],       -- downstream steps the handler chose (NULL: all of them)
    output_hash       text,
    error             text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    -- A task is never created twice, even if code is wrong; a repair adds a new generation.
    UNIQUE (execution_id, step, map_index, generation),
    CHECK (attempt >= 0 AND attempt <= max_attempts),
    CHECK ((status = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CHECK ((status IN ('ready', 'running')) = (finished_at IS NULL))
) WITH (fillfactor = 80);

-- Hot paths: claiming ready work in priority order, reclaiming expired leases, dead letters.
CREATE INDEX konduit_tasks_ready ON konduit_tasks (queue, priority, run_at, id)
    WHERE status = 'ready';
CREATE INDEX konduit_tasks_leased ON konduit_tasks (lease_expires_at) WHERE status = 'running';
CREATE INDEX konduit_tasks_deadline ON konduit_tasks (deadline_at)
    WHERE status = 'running' AND deadline_at IS NOT NULL;
CREATE INDEX konduit_tasks_dead ON konduit_tasks (finished_at DESC) WHERE status = 'failed';
CREATE INDEX konduit_tasks_execution ON konduit_tasks (execution_id, step);

-- One row per try of a task. An attempt is identified by its lease token; a "released" attempt
-- (graceful shutdown handed the task back unrun) does not count against max_attempts.
CREATE TABLE konduit_attempts (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id      bigint      NOT NULL REFERENCES konduit_tasks (id) ON DELETE CASCADE,
    attempt      integer     NOT NULL CHECK (attempt >= 1),
    worker_id    text        NOT NULL,
    lease_token  uuid        NOT NULL UNIQUE,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    outcome      text CHECK (outcome IN ('succeeded', 'degraded', 'timed_out', 'failed',
                                         'cancelled', 'retry', 'lost', 'released')),
    error        text,
    CHECK ((outcome IS NULL) = (finished_at IS NULL))
);

CREATE INDEX konduit_attempts_task ON konduit_attempts (task_id);
-- Latency history: successful attempts by end time (adaptive deadlines, plans, metrics).
CREATE INDEX konduit_attempts_succeeded ON konduit_attempts (finished_at) WHERE outcome = 'succeeded';
-- At most one open attempt per task: a second claim of a running task is impossible.
CREATE UNIQUE INDEX konduit_attempts_open ON konduit_attempts (task_id) WHERE finished_at IS NULL;

-- Outputs are content-addressed: recording the same payload twice is a no-op, and a late result
-- is kept beside the one the join consumed instead of replacing it.
CREATE TABLE konduit_outputs (
    execution_id  uuid        NOT NULL REFERENCES konduit_executions (id) ON DELETE CASCADE,
    step          text        NOT NULL,
    map_index     integer     NOT NULL,
    content_hash  text        NOT NULL,
    payload       jsonb       NOT NULL,
    source        text        NOT NULL DEFAULT 'handler'
        CHECK (source IN ('handler', 'fallback', 'late')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, step, map_index, content_hash)
);

-- Every output an execution produced: repairs add versions, the first stays visible.
CREATE TABLE konduit_execution_outputs (
    execution_id  uuid        NOT NULL REFERENCES konduit_executions (id) ON DELETE CASCADE,
    version       integer     NOT NULL CHECK (version >= 1),
    status        text        NOT NULL,
    output        jsonb,
    degraded      text[]      NOT NULL DEFAULT '{}',  -- steps that ended degraded in this version
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, version)
);

CREATE TABLE konduit_workers (
    id                 text        PRIMARY KEY,
    hostname           text        NOT NULL,
    pid                integer     NOT NULL,
    concurrency        integer     NOT NULL CHECK (concurrency >= 1),
    queues             text[]      NOT NULL,
    started_at         timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    stopped_at         timestamptz
);
