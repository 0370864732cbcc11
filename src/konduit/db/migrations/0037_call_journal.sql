-- Konduit schema, version 37: the journal of durable calls inside a step (ctx.call).
--
-- A handler's `await ctx.call("name", fn, ...)` (or ctx.call_sync) records what the call returned
-- before handing it back; a later attempt of the same task (a retry, a rescue after a worker
-- died, a redrive or a repair: any generation) replays the recorded results in order instead of
-- calling again, and runs live from the first call that has no record.
--
-- konduit_journal_results holds each distinct result once per execution, keyed by the hash of
-- its canonical JSON (content-addressed, as konduit_outputs). konduit_journal has one row per
-- recorded call, keyed by its task's place (execution, step, map_index) and its sequence number
-- within the handler, with the name it was called by (a replay whose call at that position has
-- another name is refused: a determinism error), the attempt that made it live, how long it took
-- and how often later attempts replayed it. Both go with their execution when retention deletes
-- it (ON DELETE CASCADE). New tables only: workers of the previous release never touch them.
CREATE TABLE konduit_journal_results (
    execution_id  uuid         NOT NULL REFERENCES konduit_executions (id) ON DELETE CASCADE,
    content_hash  text         NOT NULL,
    result        jsonb        NOT NULL,
    created_at    timestamptz  NOT NULL DEFAULT konduit_now(),
    PRIMARY KEY (execution_id, content_hash)
);

CREATE TABLE konduit_journal (
    execution_id           uuid              NOT NULL REFERENCES konduit_executions (id) ON DELETE CASCADE,
    step                   text              NOT NULL,
    map_index              integer           NOT NULL CHECK (map_index >= 0),
    seq                    integer           NOT NULL CHECK (seq >= 1),
    name                   text              NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    content_hash           text              NOT NULL,
    generation             integer           NOT NULL CHECK (generation >= 1),
    attempt                integer           NOT NULL CHECK (attempt >= 1),
    lease_token            uuid              NOT NULL,
    duration_seconds       double precision  NOT NULL CHECK (duration_seconds >= 0),
    recorded_at            timestamptz       NOT NULL DEFAULT konduit_clock_timestamp(),
    replays                integer           NOT NULL DEFAULT 0 CHECK (replays >= 0),
    last_replayed_attempt  integer,
    last_replayed_at       timestamptz,
    PRIMARY KEY (execution_id, step, map_index, seq)
);
