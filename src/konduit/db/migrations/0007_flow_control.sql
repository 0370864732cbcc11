-- Konduit schema, version 7: flow control (step(concurrency=N, rate="N/s")), fleet-wide.
--
-- A task of a limited step carries `limited`, set when it is created: the ordinary claim skips
-- it (a cheap filter on a row it reads anyway), and only the flow claim takes it, while holding
-- its step's row below FOR UPDATE. Unlimited tasks are never in the partial index below, so they
-- pay for flow control with one boolean.
ALTER TABLE konduit_tasks ADD COLUMN limited boolean NOT NULL DEFAULT false;

-- The ready tasks of a limited step in claim order, and its running ones (counted by the claim).
CREATE INDEX konduit_tasks_limited ON konduit_tasks (workflow, step, status, priority, execution_id, id)
    WHERE limited AND status IN ('ready', 'running');

-- One row per limited step of a registered workflow version. A claim of the step's tasks locks
-- it first (claimers of the same step queue behind each other, or skip it), so the count of
-- running tasks and the window of recent starts it reads cannot be stale.
CREATE TABLE konduit_flow_limits (
    workflow          text        NOT NULL,  -- 'name@version', as konduit_tasks.workflow
    step              text        NOT NULL,
    concurrency       integer     CHECK (concurrency >= 1),   -- NULL: no limit on running tasks
    rate_count        integer     CHECK (rate_count >= 1),    -- at most rate_count starts ...
    rate_seconds      double precision CHECK (rate_seconds > 0),  -- ... in any rate_seconds
    -- Sliding window: the times of the latest starts (at most rate_count of them, oldest first).
    starts            timestamptz[] NOT NULL DEFAULT '{}',
    -- Throttled time: since when claims have left ready tasks of this step for its limit, and
    -- the seconds of such stretches that ended; claims that left at least one task for it.
    throttled_since   timestamptz,
    throttled_seconds double precision NOT NULL DEFAULT 0 CHECK (throttled_seconds >= 0),
    throttled_claims  bigint      NOT NULL DEFAULT 0 CHECK (throttled_claims >= 0),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow, step),
    CHECK ((rate_count IS NULL) = (rate_seconds IS NULL)),
    CHECK (cardinality(starts) <= COALESCE(rate_count, 0))
);
