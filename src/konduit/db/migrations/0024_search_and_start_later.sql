-- Konduit schema, version 24: find any execution (tags, index-backed search) and start later,
-- start first.
--
-- Migrations run in one transaction (konduit.db.migrate), so CREATE INDEX CONCURRENTLY is not
-- possible here: each index below is built while the table's writes wait (a SHARE lock, reads go
-- on). On a table with a long history, build the ones on existing columns (input, key, id_tail)
-- beforehand, outside this migration, with the same names and definitions (CREATE INDEX
-- CONCURRENTLY konduit_executions_input ON ...): every CREATE INDEX here says IF NOT EXISTS, so
-- the migration keeps them (tests/test_search_migration.py). The indexes on the new columns
-- cover no old row (tags and run_at are NULL, none is scheduled): they build at once. The columns
-- are added without a table rewrite (no volatile default), and the new CHECK constraints only
-- widen the old ones, so the rows already there pass them (checked once, under the lock).

-- Tags: a small object of text keys and text values, set at start, searched by containment.
ALTER TABLE konduit_executions ADD COLUMN tags jsonb;
ALTER TABLE konduit_executions ADD CONSTRAINT konduit_executions_tags_object
    CHECK (tags IS NULL OR jsonb_typeof(tags) = 'object');

-- Start later: a `scheduled` execution waits for run_at; the maintenance pass starts it (its
-- root tasks, made at start, become claimable once it is `running`). Start first: the
-- execution's priority, added to each step's priority in every task it makes (the claim takes
-- the lower sum first).
ALTER TABLE konduit_executions ADD COLUMN run_at timestamptz;
ALTER TABLE konduit_executions ADD COLUMN priority integer NOT NULL DEFAULT 0;

ALTER TABLE konduit_executions DROP CONSTRAINT konduit_executions_status_check;
ALTER TABLE konduit_executions ADD CONSTRAINT konduit_executions_status_check
    CHECK (status IN ('pending', 'scheduled', 'running', 'succeeded', 'failed', 'timed_out',
                      'cancelled'));
ALTER TABLE konduit_executions DROP CONSTRAINT konduit_executions_check;
ALTER TABLE konduit_executions ADD CONSTRAINT konduit_executions_check
    CHECK ((status IN ('pending', 'scheduled', 'running')) = (finished_at IS NULL));
ALTER TABLE konduit_executions ADD CONSTRAINT konduit_executions_scheduled_run_at
    CHECK (status <> 'scheduled' OR run_at IS NOT NULL);

-- The scheduled executions due, for the maintenance pass (execution_start_many_if_due).
CREATE INDEX IF NOT EXISTS konduit_executions_scheduled ON konduit_executions (run_at)
    WHERE status = 'scheduled';

-- Search (execution_search): jsonb_path_ops is smaller and faster than the default GIN opclass
-- and answers exactly the containment (@>) the search asks.
CREATE INDEX IF NOT EXISTS konduit_executions_tags ON konduit_executions
    USING gin (tags jsonb_path_ops) WHERE tags IS NOT NULL;
CREATE INDEX IF NOT EXISTS konduit_executions_input ON konduit_executions
    USING gin (input jsonb_path_ops);
-- A key across workflows (the unique index leads with workflow_name).
CREATE INDEX IF NOT EXISTS konduit_executions_key ON konduit_executions (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The end of an id: UUIDv7 ids made close together share their first (time) digits, so people
-- paste the random tail. Its text reversed turns "ends with" into an indexable "starts with".
-- (The start of an id is a range of the primary key.)
CREATE INDEX IF NOT EXISTS konduit_executions_id_tail ON konduit_executions
    (reverse(id::text) text_pattern_ops);
